"""The collapse lab through the real engine: the collapse signature of RL (Single) over 3 seeds, the Ensemble fix,
the experiment runner (resume, report), and the cpu-llm P4G run with two llama.cpp-served simulator families."""
import json, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from scope_nb.experiments.registry import experiment_configs
from scope_nb.experiments.runner import run_experiment
from scope_nb.train.config import Config, from_dict, to_dict, validate
from scope_nb.experiments.report import load_run

SEEDS = (0, 1, 2)


def _series(run: Path, key: str) -> np.ndarray:
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return np.array([r[key] for r in rows if r.get(key) is not None], float)


@pytest.fixture(scope="module")
def lab_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    res = run_experiment("collapse-lab", "lab", SEEDS, str(out), jobs=2, arms=["rl-single", "ensemble", "vs"], progress=False)
    assert res["errors"] == {}
    return out / "collapse-lab" / "lab", res


@pytest.mark.parametrize("seed", SEEDS)
def test_rl_single_collapse_signature(lab_runs, seed):
    "Against the most modal simulator: reward rises, held-out ends below its peak, entropy < 1/4 of start, zero-variance rises."
    run = lab_runs[0] / f"rl-single-s{seed}"
    train, ent, zv, unseen = (_series(run, k) for k in ("train/reward", "train/entropy", "train/frac_reward_zero_std", "eval/unseen"))
    assert len(train) == 120
    assert train[-10:].mean() > train[:10].mean() + 0.3, (train[:10].mean(), train[-10:].mean())
    assert unseen[-1] < unseen.max() - 0.15, (unseen.max(), unseen[-1])
    assert ent[-5:].mean() < 0.25 * ent[0], (ent[0], ent[-5:].mean())
    assert zv[-10:].mean() > zv[:10].mean() + 0.3, (zv[:10].mean(), zv[-10:].mean())


def test_ensemble_fix_keeps_heldout_reward(lab_runs):
    "The K=3 ensemble of seen families ends far above RL (Single) on the unseen families, seed by seed."
    for s in SEEDS:
        single, ens = (_series(lab_runs[0] / f"{a}-s{s}", "eval/unseen")[-1] for a in ("rl-single", "ensemble"))
        assert ens > single + 0.25, (s, single, ens)


def _exploit_stats(run: Path, last: int = 10) -> tuple[float, float]:
    "(exploit share over the last `last` steps, the exploit's realised payoff over all steps where it was played)."
    from scope_nb.envs.lab import strategy_stats
    steps, shares, pay = strategy_stats(run)
    played = [(s, p) for s, p in zip(shares["exploit"], pay["exploit"]) if s > 0]
    payoff = sum(s * p for s, p in played) / sum(s for s, _ in played)
    return float(np.mean(shares["exploit"][-last:])), payoff


@pytest.mark.parametrize("seed", SEEDS)
def test_exploit_that_pays_less_does_not_win(lab_runs, seed):
    "Against VS (ρ = 0.75: the exploit pays 0.65 < 0.70 for asking) the agent ends asking, while RL (Single) (0.95) exploits."
    share, payoff = _exploit_stats(lab_runs[0] / f"vs-s{seed}")
    assert payoff < 0.7 and share < 0.1, (payoff, share)
    share, payoff = _exploit_stats(lab_runs[0] / f"rl-single-s{seed}")
    assert payoff > 0.7 and share > 0.9, (payoff, share)


def test_old_lab_update_let_the_exploit_win(tmp_path):
    "The regression this guards against: with z-scored advantages and every weight trained (the earlier lab), VS seed 0 exploits."
    res = run_experiment("collapse-lab", "lab", (0,), str(tmp_path), jobs=1, arms=["vs"], progress=False, echo=lambda *a: None,
                         overrides={"grpo": {"advantage": "zscore", "train_only": [], "lr": 3e-4}})
    assert res["errors"] == {}
    share, payoff = _exploit_stats(tmp_path / "collapse-lab" / "lab" / "vs-s0")
    assert payoff < 0.7 and share > 0.9, (payoff, share)


def test_lab_report(lab_runs):
    out, res = lab_runs
    rep = out / "report"
    for f in ("training_reward", "eval_reward", "entropy", "group_fractions", "lab_strategies", "lab_payoffs"):
        assert (rep / f"{f}.png").stat().st_size > 5000 and (rep / f"{f}.svg").exists()
    rows = {(r["method"], r["metric"]): r for r in res["table"]}
    assert rows[("RL (Single)", "eval/unseen")]["seeds"] == 3
    assert rows[("RL (Single)", "eval/unseen")]["final"] < rows[("RL + Ensemble (K=3)", "eval/unseen")]["final"]
    for cell in ("seen_collapsed", "seen_uncollapsed", "unseen_collapsed", "unseen_uncollapsed"):   # the 2×2 panel, with CIs
        r = rows[("RL (Single)", f"eval/{cell}")]
        assert r["seeds"] == 3 and r["final_lo"] <= r["final"] <= r["final_hi"]
    # RL (Single) exploits frugal's mode: it does best against collapsed users, whichever family, seen or not
    assert rows[("RL (Single)", "eval/seen_collapsed")]["final"] > rows[("RL (Single)", "eval/seen_uncollapsed")]["final"]
    comp = {(c["method"], c["control"], c["metric"], c["stat"]): c for c in res["comparisons"]}
    c = comp[("RL + Ensemble (K=3)", "RL (Single)", "eval/unseen", "final")]
    assert c["lo"] > 0 and c["verdict"] == "higher" and c["n"] == (3, 3)
    assert "CI excludes 0" in (rep / "comparisons.md").read_text()


def test_control_arms_and_panel_cells(tmp_path):
    "The three control arms run (a short 1-seed smoke) and every run reports the four panel cells."
    arms = ["frozen-uncollapsed", "cotrain-from-collapsed", "population-from-collapsed"]
    res = run_experiment("collapse-lab", "lab", (0,), str(tmp_path), jobs=2, arms=arms, steps=6, progress=False, echo=lambda *a: None)
    assert res["errors"] == {}
    for a in arms:
        rows = [json.loads(l) for l in (tmp_path / "collapse-lab" / "lab" / f"{a}-s0" / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if "eval/unseen" in r]
        assert [r["step"] for r in evals] == [0, 6]   # at step 0 and at the end
        for r in evals:
            assert all(f"eval/{c}" in r for c in ("seen_collapsed", "seen_uncollapsed", "unseen_collapsed", "unseen_uncollapsed"))
            assert abs(r["eval/unseen"] - r["eval/unseen_uncollapsed"]) < 1e-12   # eval/unseen keeps its meaning


def test_experiment_resumes_an_interrupted_run(tmp_path):
    "A run killed halfway (metrics cut after step 6, checkpoint at 5) is resumed, not restarted, and ends identical."
    kw = dict(seeds=(0,), jobs=1, arms=["rl-single"], steps=10, progress=False, echo=lambda *a: None)
    (a, b) = (tmp_path / "a", tmp_path / "b")
    run_experiment("collapse-lab", "lab", out=str(a), **kw)
    cfg = experiment_configs("collapse-lab", "lab", (0,), str(b), ["rl-single"], 10)[0]
    d = to_dict(cfg)
    d["checkpoint"]["every"], d["checkpoint"]["keep"] = 5, 3
    from scope_nb.train.run import train
    cfg5 = validate(from_dict(Config, d))
    train(cfg5, progress=False)
    m = cfg5.run_dir / "metrics.jsonl"
    lines = m.read_text().splitlines()
    m.write_text("\n".join(lines[:7]) + "\n" + lines[7][: len(lines[7]) // 2])   # steps 0..6 and a torn line
    import shutil
    shutil.rmtree(cfg5.run_dir / "checkpoints" / "step_000010")
    (cfg5.run_dir / "checkpoints" / "latest.json").write_text(json.dumps({"step": 5, "path": "step_000005"}))
    res = run_experiment("collapse-lab", "lab", out=str(b), **kw)
    assert res["errors"] == {}
    ra, rb = load_run(a / "collapse-lab" / "lab" / "rl-single-s0"), load_run(cfg5.run_dir)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in rows]
    assert [r["step"] for r in rb.rows] == list(range(11))
    assert strip(ra.rows) == strip(rb.rows)


def test_cli_experiment_show_writes_gpu_configs(tmp_path):
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "experiment", "show", "table1-tau2-retail", "--scale", "gpu", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    files = sorted(tmp_path.glob("*.toml"))
    assert len(files) == 7
    text = (tmp_path / "table1-tau2-retail-gpu-population-s0.toml").read_text()
    assert 'mode = "pool"' in text and "lr = 1e-06" in text and "batch_tasks = 16" in text
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "experiment", "run", "table1-p4g", "--scale", "gpu"], capture_output=True, text=True)
    assert r.returncode == 2 and "launch/" in r.stderr


def _registered_design(exp: str, out: Path, seeds: int, steps: int | None = None) -> tuple[str, str]:
    "Run a registered lab design through the CLI; its stdout and its report/registered.md."
    cmd = [str(Path(sys.executable).parent / "scope"), "experiment", "run", exp, "--scale", "lab", "--seeds", str(seeds),
           "--out", str(out), "--jobs", "1"] + (["--steps", str(steps)] if steps else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    root = out / exp / "lab" / "report"
    ev = json.loads((root / "evidence.json").read_text())
    assert ev["experiment"] == exp and len(ev["exploit"]) >= 4, ev.keys()
    return r.stdout, (root / "registered.md").read_text()


@pytest.mark.parametrize("exp", ["lab-paper-update", "lab-exploitable-ref"])
def test_registered_lab_design_smoke(tmp_path, exp):
    """Each registered lab design for 2 steps and 2 seeds through the CLI: its report holds the 5 registered tests
    (Holm) and the exploit counts per arm (Fisher), prints them, and writes the evidence the notebooks read."""
    out, reg = _registered_design(exp, tmp_path, seeds=2, steps=2)
    assert reg.count(" of 2 | ") >= 5 and "Holm" in reg and "Fisher p" in reg, reg
    assert "Fisher p" in out


@pytest.mark.slow
@pytest.mark.parametrize("exp", ["lab-paper-update", "lab-exploitable-ref"])
def test_registered_lab_design_full(tmp_path, exp):
    """The registered run (`make lab`'s last line): 10 seeds of every arm; every test over 10 seeds per arm, and the
    result's headline agrees with the one recorded in results/ (42_runner computes its tables from that file)."""
    _, reg = _registered_design(exp, tmp_path, seeds=10)
    assert reg.count(" of 10 | ") >= 5, reg
    from scope_nb.experiments.prereg import load_evidence
    ours = json.loads((tmp_path / exp / "lab" / "report" / "evidence.json").read_text())
    recorded = load_evidence(Path(__file__).parents[2] / "results" / f"{exp}.json")
    assert ours["exploit"] == recorded["exploit"], (ours["exploit"], recorded["exploit"])   # the lab is deterministic per seed


@pytest.mark.slow
def test_collapse_lab_five_seeds_with_controls(tmp_path):
    "The acceptance run: every arm and control over 5 seeds through the CLI in under 15 minutes, verdicts from the CIs."
    import time
    t0 = time.perf_counter()
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "experiment", "run", "collapse-lab", "--scale", "lab", "--seeds", "5",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"collapse-lab, 5 seeds: {secs:.0f}s")
    assert secs < 15 * 60
    for cell in ("seen_collapsed", "seen_uncollapsed", "unseen_collapsed", "unseen_uncollapsed"): assert f"| {cell} | 5 |" in r.stdout
    comp = {(c["method"], c["control"], c["stat"]): c for c in
            json.loads((tmp_path / "collapse-lab" / "lab" / "report" / "comparisons.json").read_text()) if c["metric"] == "eval/unseen"}
    for fix in ("RL + Ensemble (K=3)", "RL + VS", "RL + Persona-Guided", "Control: Co-Training from a collapsed user"):
        assert comp[(fix, "RL (Single)", "final")]["verdict"] == "higher", fix
    for fix in ("RL + Ensemble (K=3)", "Co-Training", "Population Co-Training (K=5)"):   # not separable from the uncollapsed control
        c = comp[(fix, "Control: RL vs the frozen base user", "final")]
        assert c["lo"] < 0 < c["hi"] and c["hi"] - c["lo"] < 0.05, (fix, c)


@pytest.mark.slow
def test_cpu_llm_p4g_two_families(tmp_path):
    "SmolLM2 agent on P4G against a rotation of two llama.cpp-served families (SmolLM2, Gemma-3-270M), 10 steps, then the report."
    res = run_experiment("table1-p4g", "cpu-llm", (0,), str(tmp_path), jobs=1, arms=["ensemble"], progress=False)
    assert res["errors"] == {}, res["errors"]
    run = tmp_path / "table1-p4g" / "cpu-llm" / "ensemble-s0"
    rows = load_run(run).rows
    assert rows[-1]["step"] == 10 and all(r.get("train/frac_failed", 0) < 1 for r in rows[1:])
    members = {t["member"] for f in (run / "trajectories").glob("*.jsonl") for l in f.read_text().splitlines()
               for t in json.loads(l)["info"].get("turns", []) if "member" in t}
    assert len(members) == 2, members
    assert {"eval/smollm2/reward", "eval/gemma3-270m/reward"} <= set(rows[-1])
    assert (tmp_path / "table1-p4g" / "cpu-llm" / "report" / "eval_reward.png").exists()


def test_demo_ends_with_its_story_in_a_few_lines_and_no_nan(tmp_path):
    "`scope demo` (one seed, as `make demo` runs it): the last screen states the headline numbers, nothing reads nan."
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "demo", "--jobs", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().split("\n\n")[-1].splitlines()
    print("\n".join(last))
    assert len(last) <= 12, last
    assert last[0].startswith("collapse lab: 7 methods x 1 seed") and last[1].startswith("RL (Single), held-out reward")
    rl_best, rl_final = (float(x) for x in last[1].split("best evaluation ")[1].split(" -> final "))
    table = {(t["method"], t["metric"]): t for t in json.loads((tmp_path / "collapse-lab" / "lab" / "report" / "table.json").read_text())}
    assert (round(table[("RL (Single)", "eval/unseen")]["best"], 2), round(table[("RL (Single)", "eval/unseen")]["final"], 2)) == (rl_best, rl_final)
    assert any("(control): final" in l for l in last) and "scope demo --seeds 5" in last[-1]
    texts = [r.stdout, r.stderr] + [p.read_text() for p in (tmp_path / "collapse-lab" / "lab" / "report").glob("*.md")]
    assert not any("nan" in t.lower().replace("nans", "") for t in texts)
