"""The study analysis: its statistics agree with scipy on fixed data, a simulated effect is found and a null is not (at
alpha = 0.05) across repeated simulated studies, and `scope study analyze` writes the table and figures from an export."""
import json, math, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from scipy import stats
from scope_nb.study.analysis import ARM_ORDER, analyze_records, bootstrap_ci, fisher_exact, hedges_g, holm, welch_t
from scope_nb.study.store import P4G_ITEMS, REVERSED, TAU2_ITEMS


def test_statistics_match_scipy_on_fixed_data():
    rng = np.random.default_rng(1)
    for n1, n2, shift, sd2 in [(12, 30, 0.5, 2.0), (40, 41, 0.0, 1.0), (5, 7, 2.0, 0.5)]:
        x, y = rng.normal(shift, 1.0, n1), rng.normal(0, sd2, n2)
        t, df, p = welch_t(x, y)
        ref = stats.ttest_ind(x, y, equal_var=False)
        assert math.isclose(t, ref.statistic, rel_tol=1e-10) and math.isclose(p, ref.pvalue, rel_tol=1e-8)
        assert math.isclose(df, ref.df, rel_tol=1e-10)
    for table in [(3, 1, 1, 3), (10, 2, 3, 15), (0, 5, 7, 1), (20, 20, 20, 20), (1, 30, 9, 21)]:
        a, b, c, d = table
        assert math.isclose(fisher_exact(*table), stats.fisher_exact([[a, b], [c, d]]).pvalue, rel_tol=1e-9), table
    x = rng.normal(0, 1, 50)
    lo, hi = bootstrap_ci(x, 10_000, seed=3)
    ref = stats.bootstrap((x,), np.mean, n_resamples=10_000, method="percentile", random_state=3).confidence_interval
    assert abs(lo - ref.low) < 0.03 and abs(hi - ref.high) < 0.03          # two independent bootstraps of the same CI
    # Holm by its definition: sorted p_(i) * (m - i + 1), made monotone, capped at 1
    assert holm([0.04, 0.001, 0.03, 0.2]) == pytest.approx([0.09, 0.004, 0.09, 0.2])
    g = hedges_g(np.array([1., 2, 3, 4]), np.array([2., 3, 4, 5]))
    assert g == pytest.approx(-1 / np.std([1, 2, 3, 4], ddof=1) * (1 - 3 / (4 * 8 - 9)))


def _study(rng, lift: float, n: int = 40) -> list[dict]:
    "A simulated study: Co-Training shifts every τ² item by `lift` (in the better direction) and donations by lift/4."
    recs = []
    for a in ARM_ORDER:
        d = lift if a == "co-training" else 0.0
        for i in range(n):
            s = {k: int(np.clip(round(rng.normal(4 + (-d if k in REVERSED else d), 1.4)), 1, 7)) for k in TAU2_ITEMS}
            recs.append({"task_type": "tau2-retail", "task_id": "5", "arm": a, "survey": s, "transcript": [],
                         "tau2_reward": float(rng.random() < 0.4 + (0.3 if d else 0)), "end_reason": "participant"})
            s = {k: int(np.clip(round(rng.normal(4 + (-d if k in REVERSED else d), 1.4)), 1, 7)) for k in P4G_ITEMS}
            s["donation"] = float(np.clip(rng.normal(0.6 + d / 4, 0.5), 0, 2))
            recs.append({"task_type": "p4g", "task_id": "0", "arm": a, "survey": s, "transcript": [{"role": "user", "content": "hi"}]})
    return recs


def _hit(res, fam, outcome, t="co-training", c="rl-single") -> bool:
    return [x for x in res[fam]["tests"] if x["outcome"] == outcome and x["treatment"] == t and x["control"] == c][0]["p_holm"] < 0.05


def test_a_known_effect_is_detected_and_a_null_is_not():
    rng = np.random.default_rng(7)
    sims = 60
    found = [_hit(analyze_records(_study(rng, 1.0, n=60), seed=s, n_boot=200), "tau2", "overall") for s in range(sims)]
    completed = [_hit(analyze_records(_study(rng, 1.0, n=60), seed=s, n_boot=200), "tau2", "completed") for s in range(sims // 3)]
    null = [analyze_records(_study(rng, 0.0), seed=s, n_boot=200) for s in range(sims)]
    power = np.mean(found)
    # false positives of the VS-vs-RL (Single) comparison (no effect exists) on three outcomes, after Holm
    fp = np.mean([_hit(r, fam, o, "vs") for r in null for fam, o in (("tau2", "overall"), ("tau2", "helpfulness"), ("p4g", "donation"))])
    # the numbers quoted in 53_study_analysis (`pytest -s tests/fast/test_study_analysis.py -k known_effect`)
    print(f"power {power:.2f} of {sims}; completion power {np.mean(completed):.2f} of {sims // 3}; false positives {fp:.3f} of {3 * sims}")
    assert power >= 0.8, power
    assert np.mean(completed) >= 0.5, np.mean(completed)   # a 30-point completion lift with 60 per arm (Fisher)
    assert fp <= 0.05 + 0.03, fp                           # at alpha = 0.05, Holm only makes it more conservative


def test_analyze_command_writes_table_and_figures(tmp_path):
    rng = np.random.default_rng(0)
    recs = _study(rng, 1.0, n=12) + [{"task_type": "tau2-airline", "task_id": "6", "arm": a, "survey": {k: 4 for k in TAU2_ITEMS},
                                       "transcript": [], "tau2_reward": 0.0, "end_reason": "participant"} for a in ARM_ORDER for _ in range(3)]
    (tmp_path / "export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    scope = Path(sys.executable).parent / "scope"
    r = subprocess.run([str(scope), "study", "analyze", str(tmp_path / "export.jsonl"), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tau2-adversarial-airline" in r.stdout and "Small n" in r.stdout
    for f in ("table3.md", "tests.csv", "summary.json", "fig15_tau2.png", "fig15_tau2.svg", "fig16_p4g.png", "fig16_p4g.svg"):
        assert (tmp_path / "out" / f).stat().st_size > 0, f
    assert "Co-Training" in (tmp_path / "out" / "table3.md").read_text()
    bad = subprocess.run([str(scope), "study", "analyze", str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no such export" in (bad.stderr + bad.stdout)
