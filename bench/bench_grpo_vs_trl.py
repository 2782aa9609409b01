"""A GRPO step of scope_nb vs TRL's GRPOTrainer on SmolLM2-135M, same batch, side by side.

    .venv/bin/python bench/bench_grpo_vs_trl.py [--repeats 3] [--steps 2] [--prompts 4] [--group 4] [--max-new-tokens 32]
                                               [--checkpointing off|on]

Both sides: the same single-turn chat prompts, G completions each at temperature 1.0, the same maximum completion
length, a reward that depends only on the completion's length, one optimizer step per batch (AdamW, lr 1e-6,
KL coefficient 0.005 to a frozen reference), float32 on the CPU, one process each, and gradient checkpointing set
the same on both sides (`--checkpointing on` is TRL's default: activations recomputed in the backward, less memory,
more compute; scope_nb's `grpo.gradient_checkpointing`). A step is generation +
scoring + the update. Each (implementation, repeat) runs in a fresh process, alternating scope_nb and TRL, so
both meet the same machine load; the first step of every process is a warm-up and not counted. Prints the median
step time, tokens per second (prompt + completion tokens of the batch / step time) and the process's peak RSS,
and last the headline ratio (TRL step time / scope_nb step time; > 1 means scope_nb is faster).
"""
import argparse, json, os, resource, statistics, subprocess, sys, time

PROMPTS = ["Give me one tip for saving money.", "Why is the sky blue? Answer briefly.", "Name a fruit and say why you like it.",
           "Write one sentence about the sea.", "What is a good name for a cat?", "Say something kind to a friend.",
           "Describe rain in five words.", "What should I cook tonight?"]


def reward_len(n_tokens: int, max_new: int) -> float:
    "Shorter is better (a reward with within-group variance, so every group trains)."
    return 1.0 - n_tokens / max_new


def run_scope(a) -> dict:
    import numpy as np, torch
    from scope_nb.core.dialogue import Conversation
    from scope_nb.envs.base import Env, EnvState, Task
    from scope_nb.train.grpo import GRPOConfig, GRPOTrainer, role_items
    from scope_nb.core.models import load_causal_lm
    from scope_nb.train.rollout import rollout
    from scope_nb.core.policy import LocalPolicy

    class SingleTurn(Env):
        name = "single-turn"
        def tasks(self, split="train"): return [Task(f"p{i}", "train", {"prompt": p}) for i, p in enumerate(PROMPTS[: a.prompts])]
        def reset(self, task):
            conv = Conversation(system={})
            conv.say("user", task.data["prompt"])
            return EnvState(task, conv)
        def _apply(self, state, speaker, content, tool_calls):
            state.conversation.say(speaker, content); state.next = None
        def reward(self, state):
            return {"agent": reward_len(state.data.get("n", 0), a.max_new_tokens)}

    torch.manual_seed(0)
    lm = load_causal_lm("smollm2")
    pol = LocalPolicy(lm.model, lm.tokenizer, name="agent", trainable=True, temperature=1.0, max_new_tokens=a.max_new_tokens, seed=0)
    tr = GRPOTrainer(pol, GRPOConfig(lr=1e-6, kl_coef=0.005, micro_batch=a.prompts * a.group,
                                     gradient_checkpointing=a.checkpointing == "on"))
    env = SingleTurn()
    times, toks = [], []
    for step in range(a.steps + 1):
        t0 = time.perf_counter()
        res = rollout(env, env.tasks(), a.group, {"agent": pol, "user": pol}, ("agent",), {"agent": 1.0}, step=step)
        for e in res.episodes:   # reward by completion length, as on the TRL side
            e.rewards["agent"] = reward_len(e.trajectories["agent"].n_generated, a.max_new_tokens)
        items, _ = role_items(res.episodes, "agent")
        t1 = time.perf_counter()
        tr.step(items)
        t2 = time.perf_counter()
        if step: times.append((t2 - t0, t1 - t0, t2 - t1)); toks.append(sum(len(t.token_ids) for t, _ in items))
    return {"step": [t[0] for t in times], "generate": [t[1] for t in times], "update": [t[2] for t in times], "tokens": toks}


def run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from scope_nb.core.models import load_causal_lm
    torch.manual_seed(0)
    lm = load_causal_lm("smollm2")
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: a.prompts]] * (a.steps + 1))
    tok = lm.tokenizer

    def reward(completions, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_len(len(tok(t, add_special_tokens=False).input_ids), a.max_new_tokens) for t in texts]

    class Clock(TrainerCallback):
        def __init__(self): self.t, self.times = None, []
        def on_step_begin(self, *x, **k): self.t = time.perf_counter()
        def on_step_end(self, *x, **k): self.times.append(time.perf_counter() - self.t)

    cfg = GRPOConfig(output_dir=os.path.join(a.tmp, "trl"), per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
                     max_completion_length=a.max_new_tokens, learning_rate=1e-6, beta=0.005, temperature=1.0, max_steps=a.steps + 1,
                     logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no", gradient_accumulation_steps=1,
                     dataloader_num_workers=0, seed=0, disable_tqdm=True,
                     gradient_checkpointing=a.checkpointing == "on")
    clock = Clock()
    trainer = GRPOTrainer(model=lm.model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[clock])
    trainer.train()
    logs = [l for l in trainer.state.log_history if "num_tokens" in l]
    ntok = [l["num_tokens"] for l in logs]
    per_step = [b - a_ for a_, b in zip([0] + ntok, ntok)]
    return {"step": clock.times[1:], "tokens": per_step[1:]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3); ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4); ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32); ap.add_argument("--impl", choices=["scope", "trl"])
    ap.add_argument("--tmp", default="/tmp/bench_trl"); ap.add_argument("--checkpointing", choices=["off", "on"], default="off")
    a = ap.parse_args()
    if a.impl:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        out = run_scope(a) if a.impl == "scope" else run_trl(a)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("RESULT " + json.dumps(out)); sys.exit(0)
    res = {"scope": [], "trl": []}
    for r in range(a.repeats):
        for impl in ("scope", "trl"):
            cmd = [sys.executable, __file__, "--impl", impl, "--steps", str(a.steps), "--prompts", str(a.prompts), "--group", str(a.group),
                   "--max-new-tokens", str(a.max_new_tokens), "--tmp", a.tmp, "--checkpointing", a.checkpointing]
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode or not line: sys.exit(f"{impl} run failed:\n{p.stderr[-3000:]}")
            res[impl].append(json.loads(line[0][7:]))
            print(f"repeat {r} {impl}: median step {statistics.median(res[impl][-1]['step']):.2f} s", flush=True)
    med = lambda impl, k: statistics.median(x for run in res[impl] for x in run[k])
    print(f"\nbatch: {a.prompts} prompts x G={a.group}, <= {a.max_new_tokens} new tokens, SmolLM2-135M fp32, CPU threads {os.cpu_count()}, gradient checkpointing {a.checkpointing} (both)")
    print(f"{'':10s} {'step s':>8s} {'tokens/step':>12s} {'tokens/s':>9s} {'peak RSS MB':>12s}")
    for impl in ("scope", "trl"):
        st, tk = med(impl, "step"), med(impl, "tokens")
        print(f"{impl:10s} {st:8.2f} {tk:12.0f} {tk / st:9.1f} {statistics.median(r['peak_rss_mb'] for r in res[impl]):12.0f}")
    print(f"scope_nb generate / update split: {med('scope', 'generate'):.2f} s / {med('scope', 'update'):.2f} s")
    print(f"headline: TRL step time / scope_nb step time = {med('trl', 'step') / med('scope', 'step'):.2f}")
