"""Engine overhead: the share of rollout wall time spent inside model forward passes, and batched multi-episode
generation vs episode-by-episode generation, same episodes, side by side.

    .venv/bin/python bench/bench_engine_overhead.py [--model smollm2] [--tasks 4] [--samples 2] [--repeats 3]

Two local SmolLM2 policies (agent and user) play AskEnv (2 agent turns) at temperature 0, so both modes produce the
same conversations (up to float round-off from padding). A forward hook on the model accumulates the time spent in
`model.forward`; the rest of the rollout (chat templates, tokenisation, sampling, bookkeeping) is the engine's
overhead. Modes alternate within each repeat; medians over repeats. Last line: the headline ratios.
"""
import argparse, statistics, time
import torch
from scope_nb.envs.base import AskEnv
from scope_nb.core.models import load_causal_lm
from scope_nb.train.rollout import rollout
from scope_nb.core.policy import LocalPolicy


class ForwardClock:
    "Accumulates wall time spent inside `model.forward` (pre/post hooks on the top module)."
    def __init__(self, model):
        self.total, self._t = 0.0, None
        model.register_forward_pre_hook(lambda *a: setattr(self, "_t", time.perf_counter()))
        model.register_forward_hook(lambda *a: setattr(self, "total", self.total + time.perf_counter() - self._t))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2"); ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=2); ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    a = ap.parse_args()
    lm = load_causal_lm(a.model)
    pol = LocalPolicy(lm.model, lm.tokenizer, name=a.model, max_new_tokens=a.max_new_tokens)
    clock = ForwardClock(pol.model)
    env = AskEnv(max_turns=2)
    tasks = env.tasks("train")[: a.tasks]
    speakers, temps = {"agent": pol, "user": pol}, {"agent": 0.0, "user": 0.0}
    wall, fwd, same = {True: [], False: []}, {True: [], False: []}, 0
    for _ in range(a.repeats):
        for batched in (True, False):
            clock.total = 0.0
            t0 = time.perf_counter()
            res = rollout(env, tasks, a.samples, speakers, ("agent",), temps, batched=batched)
            wall[batched].append(time.perf_counter() - t0); fwd[batched].append(clock.total)
            texts = [[t.message.content for t in e.conversation.turns] for e in res.episodes]
            if batched: ref = texts
            else: same = sum(x == y for x, y in zip(ref, texts))
    n = a.tasks * a.samples
    print(f"{n} episodes of AskEnv, {a.model} as both speakers, {torch.get_num_threads()} threads, medians of {a.repeats}")
    print(f"{'mode':14s} {'wall s':>8s} {'forward s':>10s} {'forward share':>14s}")
    for b in (True, False):
        w, f = statistics.median(wall[b]), statistics.median(fwd[b])
        print(f"{'batched' if b else 'one by one':14s} {w:8.2f} {f:10.2f} {f / w:14.1%}")
    share = statistics.median(f / w for f, w in zip(fwd[True], wall[True]))
    speed = statistics.median(wall[False]) / statistics.median(wall[True])
    print(f"{same}/{n} conversations identical across modes")
    print(f"headline: forward share of batched rollout time = {share:.1%} (target >= 90%); batched speed-up over one-by-one = {speed:.2f}x")
