"""Co-Training cost and lab scaling, measured on the collapse lab's real run loop, side by side.

    .venv/bin/python bench/bench_lab_cost.py [--repeats 3] [--steps 6]

Part 1 (Co-Training cost): RL (Single), Co-Training and Population Co-Training (K=5) of the collapse lab, each run
in a fresh process, alternating arms within each repeat: median per-step wall time (rollout + update, evaluation
off) and the process's peak RSS. The lab's models are tiny, so the memory column is mostly the Python/torch
baseline; the model-state column counts what scales with model size (trainable weights, AdamW moments, frozen
reference, and for the pool the largest number of pool weights held at once).
Part 2 (lab scaling): RL (Single) per-step time as the episodes per step grow (tasks x G), to show how cost grows
with the work. Part 3 (turns): the lab game has exactly two agent turns, so the turns axis is measured on the echo
environment (`configs/echo_tiny.toml`: tiny word-level agent, scripted user) with 2, 4 and 8 agent turns per episode
at a fixed 8 tasks x G=8. Last line: the headline ratios.
"""
import argparse, json, os, resource, statistics, subprocess, sys, tempfile, time

ARMS = ("rl-single", "co-training", "population")


def train_timed(d: dict, tasks: int, group: int):
    "Train the config dict `d` with `tasks` x G=`group` episodes per step, no evaluation or checkpoints; (config, metric rows after the warm-up step)."
    import torch
    from scope_nb.train.config import Config, from_dict, validate
    from scope_nb.experiments.report import load_run
    from scope_nb.train.run import train
    torch.set_num_threads(1)
    d["eval"]["every"] = 10_000; d["checkpoint"]["every"] = 10_000
    d["grpo"]["batch_tasks"], d["grpo"]["group_size"] = tasks, group
    cfg = validate(from_dict(Config, d))
    train(cfg, progress=False)
    return cfg, [r for r in load_run(cfg.run_dir).rows if r["step"] > 1]   # step 1 warms up


def one_run(arm: str, steps: int, tasks: int, group: int, out: str) -> dict:
    from scope_nb.experiments.registry import experiment_dicts
    cfg, rows = train_timed(experiment_dicts("collapse-lab", "lab", (0,), out, [arm], steps=steps)[0], tasks, group)
    from scope_nb.train.specs import build_speaker
    from scope_nb.envs.base import make_env
    n_params = sum(p.numel() for p in build_speaker(cfg.agent.model, cfg.agent, make_env("lab", 2), "agent", 0, True).model.parameters())
    trained = 1 + bool(cfg.user.train)
    state = n_params * 4 * (trained * (1 + 2 + 1) + (1 if cfg.user.mode == "pool" else 0))   # weights + AdamW m, v + reference; + one pool copy
    return {"step": statistics.median(r["time/step"] for r in rows), "rollout": statistics.median(r["time/rollout"] for r in rows),
            "train": statistics.median(r["time/train"] for r in rows), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "model_state_kb": state / 1024}


def one_echo(turns: int, steps: int, tasks: int, group: int, out: str) -> dict:
    "Per-step time of the echo config with `turns` agent turns per episode."
    import tomllib
    from pathlib import Path
    d = tomllib.loads((Path(__file__).resolve().parents[1] / "configs" / "echo_tiny.toml").read_text())
    d["run"].update(out_dir=out, steps=steps); d["env"]["max_turns"] = turns
    return {"step": statistics.median(r["time/step"] for r in train_timed(d, tasks, group)[1])}


def spawn(arm, steps, tasks, group) -> dict:
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, __file__, "--one", arm, "--steps", str(steps), "--tasks", str(tasks), "--group", str(group), "--out", out],
                           capture_output=True, text=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode or not line: sys.exit(f"{arm} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[0][7:])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3); ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--one"); ap.add_argument("--tasks", type=int, default=8); ap.add_argument("--group", type=int, default=8); ap.add_argument("--out")
    a = ap.parse_args()
    if a.one:
        run = one_echo(int(a.one[5:]), a.steps, a.tasks, a.group, a.out) if a.one.startswith("echo:") else one_run(a.one, a.steps, a.tasks, a.group, a.out)
        print("RESULT " + json.dumps(run)); sys.exit(0)
    res = {arm: [] for arm in ARMS}
    for r in range(a.repeats):
        for arm in ARMS: res[arm].append(spawn(arm, a.steps, a.tasks, a.group))
    med = lambda arm, k: statistics.median(x[k] for x in res[arm])
    print(f"Co-Training cost: collapse lab, {a.tasks} tasks x G={a.group} per step, medians of {a.repeats} processes (steps 2..{a.steps})")
    print(f"{'arm':14s} {'step s':>8s} {'rollout s':>10s} {'update s':>9s} {'peak RSS MB':>12s} {'model state KB':>15s} {'step ratio':>11s}")
    for arm in ARMS:
        print(f"{arm:14s} {med(arm, 'step'):8.3f} {med(arm, 'rollout'):10.3f} {med(arm, 'train'):9.3f} {med(arm, 'peak_rss_mb'):12.0f} "
              f"{med(arm, 'model_state_kb'):15.0f} {med(arm, 'step') / med('rl-single', 'step'):11.2f}")
    sizes = [(4, 4), (8, 8), (16, 8), (16, 16)]
    scale = {s: [] for s in sizes}
    for r in range(a.repeats):
        for s in sizes: scale[s].append(spawn("rl-single", a.steps, *s)["step"])
    print(f"\nLab scaling: RL (Single) per-step time vs episodes per step")
    base = statistics.median(scale[sizes[0]]) / (sizes[0][0] * sizes[0][1])
    for s in sizes:
        m = statistics.median(scale[s]); n = s[0] * s[1]
        print(f"{n:5d} episodes ({s[0]} tasks x G={s[1]}): {m:7.3f} s/step, {1000 * m / n:6.2f} ms/episode ({m / n / base:.2f}x the smallest's per-episode cost)")
    turns = (2, 4, 8)
    tt = {t: [] for t in turns}
    for r in range(a.repeats):
        for t in turns: tt[t].append(spawn(f"echo:{t}", a.steps, 8, 8)["step"])
    print(f"\nTurn scaling: echo env, RL (Single), 64 episodes per step")
    for t in turns:
        m = statistics.median(tt[t])
        print(f"{t:3d} agent turns: {m:7.3f} s/step, {1000 * m / 64 / t:6.3f} ms/agent turn ({m / statistics.median(tt[turns[0]]):.2f}x the 2-turn step)")
    print(f"headline: Co-Training / RL (Single) step time = {med('co-training', 'step') / med('rl-single', 'step'):.2f}x, "
          f"Population / RL (Single) = {med('population', 'step') / med('rl-single', 'step'):.2f}x")
