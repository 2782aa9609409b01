"""`scope report` renders what it can and names broken runs and lines."""
import subprocess, sys
from pathlib import Path
from conftest import ROOT
from scope_nb.train.config import load_config
from scope_nb.train.run import train

SCOPE = str(Path(sys.executable).parent / "scope")


def test_report_cli_with_broken_runs(tmp_path):
    for seed in (0, 1):
        train(load_config(str(ROOT / "configs" / "echo_tiny.toml"), [f"run.out_dir='{tmp_path}'", f"run.name='s{seed}'", f"run.seed={seed}",
                                                                     "run.steps=3", "eval.every=1", "eval.tasks=4"]), progress=False)
    m = tmp_path / "s1" / "metrics.jsonl"
    lines = m.read_text().splitlines()
    m.write_text("\n".join(lines[:2] + [lines[2][:30]] + lines[3:]) + "\n")     # a torn line in the middle
    (tmp_path / "no-metrics").mkdir()
    out = tmp_path / "report"
    r = subprocess.run([SCOPE, "report", str(tmp_path / "s0"), str(tmp_path / "s1"), str(tmp_path / "no-metrics"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "run s1: metrics.jsonl line 3: not valid JSON" in r.stdout and "run no-metrics: no metrics.jsonl" in r.stdout
    for name in ("training_reward", "eval_reward", "entropy", "group_fractions", "turns", "sim_reward"):
        assert (out / f"{name}.png").stat().st_size > 5000 and (out / f"{name}.svg").exists()
    table = (out / "table.md").read_text()
    assert "| RL (Single) | mean | 2 |" in table
    assert "line 3" in (out / "problems.txt").read_text()
