"""The numbers of 41_experiments "Real models on both sides", read from a finished `llm-collapse` experiment folder.

    python scripts/llm_collapse_summary.py runs/experiments/llm-collapse/cpu-llm [--arms base,rl-single,ensemble,vs,co-training]

Per arm: training reward (mean of steps 1-5 -> 16-20) and the zero-variance fraction and entropy at step 1 -> last,
per seed; final seen / unseen reward pooled over seeds with a bootstrap 95% interval over evaluation episodes;
reward per family; then differences between arms over episodes (bootstrap), the Gemma-families contrast against
the base agent, the move table (`38_shop_measure.move_table`) and the measurement's seconds. Intervals over seeds are in the
experiment's `report/comparisons.md` and `report/table.md` (`scope experiment run` writes them)."""
import argparse, json
from pathlib import Path
import numpy as np
from scope_nb.experiments.report import load_run
from scope_nb.envs.shop import SHOP_SEEN
from scope_nb.experiments.shop_measure import eval_moves, move_summary, move_table

COMPARISONS = (("ensemble", "rl-single"), ("vs", "rl-single"), ("co-training", "rl-single"), ("rl-single", "base"))


def boot_mean(x, rng, B=4000):
    x = np.asarray(x, float)
    b = [x[rng.integers(len(x), size=len(x))].mean() for _ in range(B)]
    return x.mean(), *np.quantile(b, [0.025, 0.975])


def boot_diff(x, y, rng, B=4000):
    x, y = np.asarray(x, float), np.asarray(y, float)
    b = [x[rng.integers(len(x), size=len(x))].mean() - y[rng.integers(len(y), size=len(y))].mean() for _ in range(B)]
    return x.mean() - y.mean(), *np.quantile(b, [0.025, 0.975])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root"); ap.add_argument("--arms", default="base,rl-single,ensemble,vs,co-training")
    a = ap.parse_args()
    root, arms, rng = Path(a.root), a.arms.split(","), np.random.default_rng(0)
    seen = lambda m: m["family"] in SHOP_SEEN
    moves = {}
    for arm in arms:
        runs = sorted(root.glob(f"{arm}-s*"))
        if not runs: raise SystemExit(f"{root}: no runs of arm {arm!r}")
        per_seed = []
        for r in runs:
            rows = [x for x in load_run(r).rows if x.get("step", 0) > 0 and "train/reward" in x]
            if rows:
                t = np.array([x["train/reward"] for x in rows])
                per_seed.append(f"train {t[:5].mean():.2f} -> {t[-5:].mean():.2f}, zero-var {rows[0]['train/frac_reward_zero_std']:.2f}, "
                                f"entropy {rows[0]['train/entropy']:.2f} -> {rows[-1]['train/entropy']:.2f}")
        moves[arm] = [m for r in runs for m in eval_moves(r)]
        s = boot_mean([m["reward"] for m in moves[arm] if seen(m)], rng)
        u = boot_mean([m["reward"] for m in moves[arm] if not seen(m)], rng)
        print(f"{arm}: {' | '.join(per_seed) or 'no training'}")
        print(f"  seen {s[0]:.2f} [{s[1]:.2f}, {s[2]:.2f}]  unseen {u[0]:.2f} [{u[1]:.2f}, {u[2]:.2f}]  "
              f"speed (seen) {move_summary(moves[arm])['seen']['speed']:.2f}")
        fam = {}
        for m in moves[arm]: fam.setdefault(m["family"], []).append(m["reward"])
        print("  per family:", {k: round(float(np.mean(v)), 2) for k, v in fam.items()})
    for x, y in COMPARISONS:
        if x in moves and y in moves:
            for g, f in (("seen", seen), ("unseen", lambda m: not seen(m))):
                d = boot_diff([m["reward"] for m in moves[x] if f(m)], [m["reward"] for m in moves[y] if f(m)], rng)
                print(f"{x} - {y} ({g}): {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]")
    gemma = lambda xs: [m["reward"] for m in xs if m["family"].startswith("gemma")]
    for arm in arms:
        if arm != "base" and "base" in moves:
            d = boot_diff(gemma(moves[arm]), gemma(moves["base"]), rng)
            print(f"{arm} - base (gemma families): {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]")
    print(move_table(root, arms))
    m = root / "measure" / "measure.json"
    if m.exists(): print(f"measurement seconds: {json.loads(m.read_text())['seconds']:.0f}")


if __name__ == "__main__":
    main()
