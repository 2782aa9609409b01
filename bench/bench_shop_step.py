"""Per-step cost split of the real-LLM shop experiment (`llm-collapse`, cpu-llm scale): rollout (agent generation and
customer calls), of which the customer's llama.cpp calls, and the GRPO update, measured side by side in one run.

    .venv/bin/python bench/bench_shop_step.py [--steps 4] [--arms rl-single,vs,co-training]

Each arm trains for `--steps` steps at the experiment's settings (8 tasks x G=4, SmolLM2-135M agent, evaluation off)
in this process; step 1 warms up and is dropped. Last line: the headline shares and the arms' step-time ratios.
"""
import argparse, statistics, tempfile, time


def run_arm(arm: str, steps: int, out: str) -> dict:
    from scope_nb.config import Config, from_dict, validate
    from scope_nb.experiments import experiment_dicts
    from scope_nb.report import load_run
    from scope_nb.run import train
    d = experiment_dicts("llm-collapse", "cpu-llm", (0,), out, [arm], steps=steps)[0]
    d["eval"]["every"] = 10_000; d["checkpoint"]["every"] = 10_000
    cfg = validate(from_dict(Config, d))
    train(cfg, progress=False)
    rows = [r for r in load_run(cfg.run_dir).rows if r["step"] > 1]
    med = lambda f: statistics.median(f(r) for r in rows)
    return dict(arm=arm, step=med(lambda r: r["time/step"] - (r.get("time/eval") or 0.0)),   # the last step also evaluates
                rollout=med(lambda r: r["time/rollout"]), sim=med(lambda r: r["time/sim_api"]), train=med(lambda r: r["time/train"]), n=len(rows))


def main():
    import torch
    torch.set_num_threads(2)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--arms", default="rl-single,vs,co-training")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        res = [run_arm(arm, a.steps, out) for arm in a.arms.split(",")]
    print(f"{'arm':<12} {'step s':>7} {'rollout s':>9} {'customer s':>10} {'train s':>8}  (medians of {res[0]['n']} steps)")
    for r in res: print(f"{r['arm']:<12} {r['step']:7.1f} {r['rollout']:9.1f} {r['sim']:10.1f} {r['train']:8.1f}")
    b = res[0]
    ratios = ", ".join(f"{r['arm']}/{b['arm']} {r['step'] / b['step']:.2f}x" for r in res[1:])
    print(f"{b['arm']} step: rollout {b['rollout'] / b['step']:.0%} (customer calls {b['sim'] / b['step']:.0%}), "
          f"update {b['train'] / b['step']:.0%}; step time {ratios}")


if __name__ == "__main__":
    main()
