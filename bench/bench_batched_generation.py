"""Batched generation across episodes vs episode-by-episode generation, same episodes, side by side.

    .venv/bin/python bench/bench_batched_generation.py [--model smollm2] [--tasks 4] [--samples 2] [--repeats 2]

Runs the rollout engine twice on the same AskEnv tasks with the same speakers at temperature 0 (greedy, so both
modes produce the same conversations up to float round-off from padding): once batching every round's requests per
speaker (`batched=True`, the default), once answering them one at a time. Prints both times and their ratio.
"""
import argparse, statistics, time
import torch
from scope_nb.envs import AskEnv
from scope_nb.models import load_causal_lm
from scope_nb.rollout import rollout
from scope_nb.training import LocalPolicy

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2"); ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=2); ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    a = ap.parse_args()
    lm = load_causal_lm(a.model)
    pol = LocalPolicy(lm.model, lm.tokenizer, name=a.model, max_new_tokens=a.max_new_tokens)
    env = AskEnv(max_turns=2)
    tasks = env.tasks("train")[: a.tasks]
    speakers, temps = {"agent": pol, "user": pol}, {"agent": 0.0, "user": 0.0}
    times = {True: [], False: []}
    for _ in range(a.repeats):
        for batched in (True, False):
            t0 = time.perf_counter()
            res = rollout(env, tasks, a.samples, speakers, ("agent",), temps, batched=batched)
            times[batched].append(time.perf_counter() - t0)
            texts = [[t.message.content for t in e.conversation.turns] for e in res.episodes]
            if batched: ref = texts
            same = sum(x == y for x, y in zip(ref, texts))
    b, s = statistics.median(times[True]), statistics.median(times[False])
    n = a.tasks * a.samples
    print(f"{n} episodes ({a.model}, {torch.get_num_threads()} threads): batched {b:.1f}s, one by one {s:.1f}s "
          f"-> batched is {s / b:.2f}x faster; {same}/{n} conversations identical across modes")
