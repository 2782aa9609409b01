"""Per-step cost split of the real-LLM shop experiment (`llm-collapse`, cpu-llm scale): rollout (agent generation and
customer calls), of which the customer's llama.cpp calls, and the GRPO update, measured side by side in one run.

    .venv/bin/python bench/bench_shop_step.py [--steps 4] [--arms rl-single,vs,co-training]
    .venv/bin/python bench/bench_shop_step.py --steps 3 --arms rl-single,vs,vs-unshared
    .venv/bin/python bench/bench_shop_step.py --steps 4 --arms rl-single,rl-single@vllm
    .venv/bin/python bench/bench_shop_step.py --from runs/experiments/llm-collapse/cpu-llm

Each arm trains for `--steps` steps at the experiment's settings (8 tasks x G=4, SmolLM2-135M agent, evaluation off)
in this process; step 1 warms up and is dropped. `vs-unshared` is the `vs` arm with one VS call per episode (the
paper's way) instead of one per distinct conversation (`user.vs.share`, the experiment's setting). `<arm>@vllm` is
the arm with the agent generating on a vLLM server the run starts (`agent.engine = 'vllm'`, CPU build, float32;
weights pushed after each update) instead of transformers `generate` in this process. With `--from`, nothing is trained: the split is read from the
metrics of a finished `scope experiment run llm-collapse` (every run of every arm, all seeds, steps after the first;
those runs ran two side by side, so their absolute times are per process on a shared 2-core machine).
Last line: the headline shares and the arms' step-time ratios.
"""
import argparse, statistics, tempfile
from pathlib import Path


def split(rows: list[dict], arm: str) -> dict:
    "Median per-step seconds (step, rollout, customer calls, update) over `rows` after the first step."
    rows = [r for r in rows if r.get("step", 0) > 1 and "time/train" in r]
    if not rows: raise SystemExit(f"{arm}: no training steps after the first to measure")
    med = lambda f: statistics.median(f(r) for r in rows)
    return dict(arm=arm, step=med(lambda r: r["time/step"] - (r.get("time/eval") or 0.0)),   # steps that evaluate count without it
                rollout=med(lambda r: r["time/rollout"]), sim=med(lambda r: r.get("time/sim_api") or 0.0),
                train=med(lambda r: r["time/train"]), n=len(rows))


def run_arm(arm: str, steps: int, out: str) -> dict:
    from scope_nb.train.config import Config, from_dict, validate
    from scope_nb.experiments.registry import experiment_dicts
    from scope_nb.experiments.report import load_run
    from scope_nb.train.run import train
    base, _, engine = arm.partition("@")
    unshared = base == "vs-unshared"
    d = experiment_dicts("llm-collapse", "cpu-llm", (0,), out, ["vs" if unshared else base], steps=steps)[0]
    if unshared:
        d["user"]["vs"]["share"] = False
        d["run"]["name"] += "-unshared"
    if engine:
        d["agent"]["engine"] = engine
        d["run"]["name"] += f"-{engine}"
    d["eval"]["every"] = 10_000; d["checkpoint"]["every"] = 10_000
    cfg = validate(from_dict(Config, d))
    train(cfg, progress=False)
    return split(load_run(cfg.run_dir).rows, arm)


def from_runs(folder: str, arms: list[str]) -> list[dict]:
    "The split of each arm from the finished runs `<arm>-s<seed>` in `folder`."
    from scope_nb.experiments.report import load_run
    out = []
    for arm in arms:
        runs = sorted(Path(folder).glob(f"{arm}-s*"))
        if not runs: raise SystemExit(f"{folder}: no runs of arm {arm!r} (expected folders {arm}-s0, ...)")
        out.append(split([r for p in runs for r in load_run(p).rows], arm))
    return out


def main():
    import torch
    torch.set_num_threads(2)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--arms", default="rl-single,vs,co-training")
    ap.add_argument("--from", dest="src", default=None, help="read the split from a finished experiment folder instead of training")
    a = ap.parse_args()
    arms = a.arms.split(",")
    if a.src: res = from_runs(a.src, arms)
    else:
        with tempfile.TemporaryDirectory() as out:
            res = [run_arm(arm, a.steps, out) for arm in arms]
    print(f"{'arm':<12} {'step s':>7} {'rollout s':>9} {'customer s':>10} {'train s':>8}  (medians over steps 2+)")
    for r in res: print(f"{r['arm']:<12} {r['step']:7.1f} {r['rollout']:9.1f} {r['sim']:10.1f} {r['train']:8.1f}  n={r['n']}")
    b = res[0]
    ratios = ", ".join(f"{r['arm']}/{b['arm']} {r['step'] / b['step']:.2f}x" for r in res[1:])
    print(f"{b['arm']} step: rollout {b['rollout'] / b['step']:.0%} (customer calls {b['sim'] / b['step']:.0%}), "
          f"update {b['train'] / b['step']:.0%}; step time {ratios}")


if __name__ == "__main__":
    main()
