"""Launchers: generated from the registry, valid bash, and every one's --dry-run works; Co-Training splits the node 4 + 4."""
import os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest
from scope_nb.launch import launcher_scripts

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
ENV.pop("OPENROUTER_API_KEY", None)


def test_committed_launchers_match_the_registry():
    want = launcher_scripts()
    have = {p.name: p.read_text() for p in LAUNCH.glob("*--*.sh")}   # device_check.sh is not an experiment launcher
    assert set(have) == set(want), "regenerate with: python -c 'from scope_nb.launch import write_launchers; write_launchers()'"
    assert all(have[k] == want[k] for k in want)
    assert all(os.access(LAUNCH / k, os.X_OK) for k in want)


def _run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)


def test_every_launcher_passes_bash_n_and_dry_run():
    names = sorted(launcher_scripts())
    assert len(names) >= 20
    for n in names:
        r = _run(["bash", "-n", str(LAUNCH / n)])
        assert r.returncode == 0, (n, r.stderr)
    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda n: (n, _run(["bash", str(LAUNCH / n), "--dry-run"])), names))
    for n, r in results:
        assert r.returncode == 0, (n, r.stderr[-2000:])
        assert "# Ray placement" in r.stdout and "# processes that would start" in r.stdout and "# pre-flight checks" in r.stdout, n


def test_cotraining_dry_run_shows_two_groups_with_own_engines():
    r = _run(["bash", str(LAUNCH / "table1-tau2-retail--co-training.sh"), "--dry-run"])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("trainer group")]
    assert len(lines) == 2
    assert lines[0].startswith("trainer group agent") and "GPUs 0-3" in lines[0] and "ports [30000, 30001, 30002, 30003]" in lines[0]
    assert lines[1].startswith("trainer group user") and "GPUs 4-7" in lines[1] and "ports [30100, 30101, 30102, 30103]" in lines[1]
    assert "would fail: environment variable OPENROUTER_API_KEY is not set" in r.stdout
    single = _run(["bash", str(LAUNCH / "table1-p4g--rl-single.sh"), "--dry-run", "--settings", "release"])
    assert "GPUs 0-7" in single.stdout and "lr = 5e-07" in single.stdout and "steps = 1000" in single.stdout


def test_launch_without_gpus_fails_with_clear_messages():
    r = _run(["bash", str(LAUNCH / "table1-p4g--vs.sh")])
    assert r.returncode == 2
    assert "GPUs: need 8" in r.stdout and "OPENROUTER_API_KEY" in r.stdout
    r = _run([str(Path(sys.executable).parent / "scope"), "launch", "table1-p4g", "persona", "--dry-run"])
    assert r.returncode == 2 and "unknown arm(s) ['persona']" in r.stderr, r.stderr


def test_sglang_layout_files_match_the_plans():
    from scope_nb.launch import layout_files
    have = {p.name: p.read_text() for p in (ROOT / "configs" / "sglang").glob("*.json")}
    assert have == layout_files(), "regenerate configs/sglang from scope_nb.launch.layout_files()"
