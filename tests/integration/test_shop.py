"""The shop game with real LLMs on both sides: the packaged customer families answer through llama.cpp and are labelled,
a 2-step smoke of the whole `llm-collapse` pipeline (measurement, training, evaluation, report), and (slow) the full
run and RL (Single) with the agent generating on vLLM."""
import json, os, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from scope_nb.envs.shop import SHOP_FAMILIES, label_concern, shop_speaker, CONCERNS
from scope_nb.experiments.shop_measure import measure_family, run_measurement
from scope_nb.users.modes import Servers

SCOPE = str(Path(sys.executable).parent / "scope")


def _rows(run: Path) -> list[dict]:
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]


def test_families_answer_and_are_labelled():
    "A SmolLM2 chat family and a Gemma base-model family (completion prompt) both name concerns the labeler reads."
    with Servers() as servers:
        for fam in ("student", "gemma-parent"):
            sim = shop_speaker(f"shop:{fam}", fam, 0, servers)
            m = measure_family(sim, "plain", n=12)
            assert m["X"].shape == (12, 6) and m["failed"] == 0
            decided = m["X"][:, :5].sum()
            assert decided >= 4, (fam, m["examples"])          # most answers name a concern
            assert all(isinstance(t, str) and t for t in m["examples"])
            if SHOP_FAMILIES[fam].style == "completion": assert all(t.startswith("The") for t in m["examples"])


def test_llm_collapse_two_step_smoke(tmp_path):
    """Measurement (tiny n), then every registered arm for 2 steps and 2 seeds with evals, through the CLI; the report
    compares arms and the registered tests (44_prereg) are computed from the runs."""
    out = tmp_path / "exp"
    t0 = time.perf_counter()
    run_measurement(out / "llm-collapse" / "cpu-llm" / "measure", n=6, n_persona=4, vs_calls=1, families=("fashion-fixed", "gemma-parent"), echo=lambda *a: None, progress=False)
    panel = ", ".join(f'{{name="{f}", model="shop:{f}", seen={str(f == "fashion-fixed").lower()}}}'
                      for f in ("fashion-fixed", "traveler", "gemma-student", "gemma-parent"))   # the tests' held-out three
    small = ["--set", "grpo.batch_tasks=2", "--set", "grpo.group_size=2", "--set", "eval.tasks=1", "--set", "user.vs.attempts=1",
             "--set", f"eval.panel=[{panel}]", *[a for k in ("every=2", "tasks=1", "agent_draws=2", "sim_draws=2") for a in ("--set", f"eval.variance_split.{k}")]]
    arms = ("base", "rl-single", "vs", "co-training", "rl-uncollapsed")
    cmd = [SCOPE, "experiment", "run", "llm-collapse", "--scale", "cpu-llm", "--seeds", "2", "--steps", "2",
           "--arms", ",".join(arms), "--out", str(out), "--jobs", "3", *small]
    root = out / "llm-collapse" / "cpu-llm"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)   # the registered gate: 6 answers are too few
    assert r.returncode == 2 and "registered gate stops the run before training" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "fashion-fixed was measured on 6 plain answers" in r.stderr and not list(root.glob("*-s0")), r.stderr
    r = subprocess.run(cmd + ["--skip-gate"], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "gate NOT passed, run anyway" in r.stdout
    assert "reusing" in r.stdout and (root / "measure" / "measure.md").exists() and (root / "measure" / "shop_measure.png").exists()
    for arm in arms[1:]:
        rows = _rows(root / f"{arm}-s1")
        assert [x["step"] for x in rows] == [0, 1, 2]
        assert rows[1]["train/tokens"] > 0 and rows[2]["train/entropy"] > 0
        for k in ("eval/seen", "eval/unseen", "eval/fashion-fixed/reward", "eval/gemma-parent/reward"): assert rows[2].get(k) is not None, (arm, k)
        assert "eval/student/reward" not in rows[2]   # the smoke's four-family panel (the registered one has six)
    assert [x["step"] for x in _rows(root / "base-s0")] == [0]
    assert "train/var_sim" in _rows(root / "rl-single-s0")[2]   # Eq. 6's split is logged on the run (shares when var > 0)
    ep = [json.loads(l) for l in (root / "vs-s0" / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert all(e["conversation"]["turns"][0]["private"] for e in ep if e["status"] != "failed")
    assert any("vs" in t for e in ep for t in e["info"].get("turns", []))      # the user really went through Verbalized Sampling
    assert "sim/reward" in _rows(root / "co-training-s0")[1]                   # the co-trained customer has its own reward
    assert (root / "report" / "comparisons.md").exists()
    reg = (root / "report" / "registered.md").read_text()                      # the registered tests, over 2 seeds
    assert reg.count("\n| ") == 5 and "| **primary**: VS − RL (Single)" in reg and "Mechanism" in reg, reg
    assert "VS − RL (Single)" in r.stdout                                      # ... and printed
    ev = json.loads((root / "report" / "evidence.json").read_text())           # what the notebooks read in results/
    assert set(ev["moves"]) == set(ev["arms"]) >= {"base", "rl-single", "vs", "co-training", "rl-uncollapsed"}, list(ev["arms"])
    assert all(len(eps) for d in ev["moves"].values() for eps in d["episodes"])
    st = json.loads((root / "report" / "stats.json").read_text())
    assert {"rl-single-s0", "vs-s1", "base-s0"} <= {x["name"] for x in st["runs"]}
    print(reg)
    print(f"smoke: {time.perf_counter() - t0:.0f} s")


def test_vs_reference_smoke(tmp_path):
    """The registered VS-reference measurement at tiny sizes on the real servers: every comparison row and a verdict are
    written, and a second call reuses the measurement."""
    from scope_nb.experiments.vs_reference import run_vs_reference
    heard = []
    res = run_vs_reference(tmp_path, echo=heard.append, families=("fashion-fixed",), n_ref=8, n_plain=6, vs_calls=2, B=50)
    assert [h.split(": ")[2].split(" (")[0] for h in heard[:4]] == [
        "8 reference answers", "6 plain answers", "2 VS calls of 5 candidates", "done"], heard   # each stage announced
    assert (tmp_path / "vs_reference.png").exists()
    text = (tmp_path / "vs_reference.md").read_text()
    assert text.count("| fashion-fixed (T = 0.3) |") == 4 and "**" in text, text
    m = res["results"][0]
    assert len(m["X_ref"]) + len(m["X_plain"]) >= 12 and m["vs_calls"] == 2 and m["failed"] == 0
    said = []
    run_vs_reference(tmp_path, echo=said.append, families=("fashion-fixed",))
    assert "reusing" in said[0]


@pytest.mark.slow
def test_vs_reference_full_run(tmp_path):
    """The registered VS-reference measurement (`scope experiment run vs-reference`) at its registered sizes: 400
    reference, 200 plain answers and 40 VS calls per family, no failed call, a verdict per family printed."""
    r = subprocess.run([SCOPE, "experiment", "run", "vs-reference", "--scale", "cpu-llm", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=3 * 3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    raw = json.loads(next(tmp_path.rglob("vs_reference.json")).read_text())
    assert [m["family"] for m in raw["families"]] == ["fashion-fixed", "student"]
    for m in raw["families"]:
        assert (len(m["X_ref"]), len(m["X_plain"]), m["vs_calls"], m["failed"]) == (400, 200, 40, 0), m["family"]
        assert m["vs_parsed"] >= 30, m["vs_parsed"]   # most VS calls give a usable list
    text = next(tmp_path.rglob("vs_reference.md")).read_text()
    assert text.count("| **") == 2 and text.splitlines()[-1] in r.stdout


@pytest.mark.slow
def test_llm_collapse_full_run(tmp_path):
    """The registered design (`make llm`): every arm x 5 seeds (hours on 2 cores): the base agent's groups mostly
    have variance, RL (Single)'s training reward rises in every seed by more than its seeds differ at the start, and the
    report prints the registered tests with seed-level intervals and exact p-values. SCOPE_LLM_COLLAPSE_OUT names the
    `--out` folder of an earlier `make llm` to check instead (the command resumes it by name; finished runs are
    skipped)."""
    out = Path(os.environ.get("SCOPE_LLM_COLLAPSE_OUT") or tmp_path / "exp")
    r = subprocess.run([SCOPE, "experiment", "run", "llm-collapse", "--scale", "cpu-llm", "--seeds", "5", "--out", str(out)],
                       capture_output=True, text=True, timeout=12 * 3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "gate passed (shop:fashion-fixed" in r.stdout   # the training customer is still collapsed at full size
    root = out / "llm-collapse" / "cpu-llm"
    m = json.loads((root / "measure" / "measure.json").read_text())
    assert m["seconds"] < 15 * 60, m["seconds"]
    starts, ends, zv0 = [], [], []
    for s in range(5):
        rows = [x for x in _rows(root / f"rl-single-s{s}") if x["step"] > 0]
        tr = np.array([x["train/reward"] for x in rows])
        zv0.append(rows[0]["train/frac_reward_zero_std"])   # the base agent's groups (first training step)
        starts.append(tr[:5].mean()); ends.append(tr[-5:].mean())
    assert np.mean(zv0) < 0.5 and max(zv0) <= 0.5, zv0   # most groups informative (2026-12-07: 0.125-0.5, mean 0.3)
    rises = np.subtract(ends, starts)
    assert rises.min() > np.ptp(starts), (starts, ends)   # every seed rises by more than the seeds differ at the start
    reg = (root / "report" / "registered.md").read_text()
    assert "| **primary**: VS − RL (Single)" in reg and reg.count(" of 5 | ") == 5, reg   # 5 tests, each over 5 seeds
    assert reg in r.stdout   # the report prints it


@pytest.mark.slow
def test_llm_collapse_rl_single_trains_on_vllm(tmp_path):
    """RL (Single) against the collapsed customer (`fashion-fixed`), the SmolLM2 agent generating on the real vLLM
    server (CPU build), 2 seeds x 20 steps: the training-inference gap stays below 1e-3 at every step (float32 on both
    sides) and training reward rises beyond the seed spread, the full run's criterion for the local path."""
    from scope_nb.users.vllm_engine import vllm_python
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    out = tmp_path / "exp"
    t0 = time.perf_counter()
    run_measurement(out / "llm-collapse" / "cpu-llm" / "measure", n=6, n_persona=4, vs_calls=1, families=("fashion-fixed",),
                    echo=lambda *a: None, progress=False)   # the report's table; training does not read it
    sets = ["agent.engine='vllm'", "user.model='shop:fashion-fixed'", "eval.tasks=2"]   # a light evaluation
    r = subprocess.run([SCOPE, "experiment", "run", "llm-collapse", "--scale", "cpu-llm", "--seeds", "2", "--arms", "rl-single",
                        "--out", str(out), "--jobs", "1", "--skip-gate", *[a for x in sets for a in ("--set", x)]],
                       capture_output=True, text=True, timeout=120 * 60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    starts, ends = [], []
    for s in (0, 1):
        rows = [x for x in _rows(out / "llm-collapse" / "cpu-llm" / f"rl-single-s{s}") if x["step"] > 0]
        assert len(rows) == 20 and all(0 < x["train/logprob_gap_max"] < 1e-3 for x in rows), [x.get("train/logprob_gap_max") for x in rows]
        tr = np.array([x["train/reward"] for x in rows])
        starts.append(tr[:5].mean()); ends.append(tr[-5:].mean())
    rises, spread = np.subtract(ends, starts), max(abs(starts[0] - starts[1]), abs(ends[0] - ends[1]))
    print(f"vLLM rl-single: starts {starts}, ends {ends}, {time.perf_counter() - t0:.0f} s")
    assert rises.min() > spread, (starts, ends)   # each seed rises by more than the seeds differ at either end
