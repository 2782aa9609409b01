"""Execute notebooks and save their outputs (figures as small PNGs, tables, printed numbers): `make notebooks`.

    python scripts/run_notebooks.py [NOTEBOOK ...]     # default: the notebooks listed in SHOWN

The cells nbdev-test runs are the cells run here (the same skip flags: slow, gpu, notest); outputs are written back
only if every cell succeeds, then `nbdev-clean` strips execution counts and metadata. Figures are rendered at 72 dpi
so that a notebook's outputs stay small.
"""
from __future__ import annotations
import os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ["00_theory", "24_collapse", "33_lab", "39_vs_reference", "40_report", "42_runner", "44_prereg"]   # the notebooks whose outputs a reader benefits from
DPI = 72


def run(path: Path) -> None:
    from fastcore.nbio import write_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell

    cfg = get_config()
    flags = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags)
    nb = NBProcessor(path, rm_directives=False, process=True).nb
    shell = CaptureShell(path)
    os.environ["IN_TEST"] = "1"
    with working_directory(path.parent):
        shell.run_cell(f"import matplotlib; matplotlib.rcParams['figure.dpi'] = {DPI}")
        shell.run_all(nb, exc_stop=True, preproc=_skip_cell(nb, flags, []), cell_timeout=1800)
    write_nb(nb, path)


if __name__ == "__main__":
    names = sys.argv[1:] or SHOWN
    paths = [p if p.suffix == ".ipynb" else next((ROOT / "nbs").rglob(f"{p}.ipynb")) for p in map(Path, names)]
    for p in paths:
        t0 = time.time()
        run(p)
        kb = p.stat().st_size / 1024
        print(f"{p.relative_to(ROOT)}: executed and saved in {time.time() - t0:.0f}s ({kb:.0f} KB)")
    subprocess.run([str(Path(sys.executable).parent / "nbdev-clean")], cwd=ROOT, check=True)
