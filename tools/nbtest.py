"""Run `nbdev-test` on every notebook and say how many cells ran.

    python tools/nbtest.py [--flags "slow"]

nbdev-test itself only prints "Success."; this counts the cells it executes (the same selection rule,
via `nbdev.test.nb_test_cells`) so the test log shows what was covered.
"""
from __future__ import annotations
import argparse, subprocess, sys, time
from pathlib import Path
from nbdev.config import get_config
from nbdev.test import nb_test_cells

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", default="", help="space-separated flags to run that are normally skipped (e.g. slow)")
    ap.add_argument("path", nargs="?", default=None)
    a = ap.parse_args()
    cfg = get_config()
    skip = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags)
    nbs = [Path(a.path)] if a.path else sorted(p for p in cfg.path("nbs_path").rglob("*.ipynb")
                                             if not p.name.startswith("_") and ".ipynb_checkpoints" not in p.parts)
    n_cells = sum(len(nb_test_cells(p, skip, a.flags.split())) for p in nbs)
    t0 = time.time()
    cmd = [str(Path(sys.executable).parent / "nbdev-test"), "--timing"] + (["--flags", a.flags] if a.flags else [])
    if a.path: cmd.append(a.path)
    rc = subprocess.run(cmd).returncode
    status = "passed" if rc == 0 else "FAILED"
    print(f"nbdev-test: {len(nbs)} notebooks, {n_cells} cells executed, {status} in {time.time() - t0:.0f}s")
    sys.exit(rc)
