"""Real model: SmolLM2-135M-Instruct token streams, GRPO on vLLM resumed after kill -9, LoRA Co-Training on vLLM."""
import json, math, os, signal, subprocess, sys, time
import pytest
from pathlib import Path
import torch
from conftest import ROOT
from scope_nb.core.dialogue import Conversation, Request
from scope_nb.core.models import load_causal_lm
from scope_nb.train.crash_safety import read_metrics, latest_checkpoint
from scope_nb.core.policy import LocalPolicy, TokenStream, token_logprobs

SCOPE = str(Path(sys.executable).parent / "scope")


def test_sampling_logprobs_match_trainer_recomputation():
    "Left-padded batched sampling with a KV cache vs the trainer's right-padded full forward: same logprobs (1e-4)."
    lm = load_causal_lm("smollm2")
    pol = LocalPolicy(lm.model, lm.tokenizer, name="agent", trainable=True, temperature=0.7, max_new_tokens=12, seed=3)
    convs, streams = [], []
    for i, opener in enumerate(["Hi!", "Would you like a cup of tea? I just made a fresh pot and it is still hot.", "Hello there, stranger."]):
        c = Conversation(system={"agent": "You are friendly.", "user": "You are busy."})
        c.say("user", opener)
        convs.append(c); streams.append(TokenStream())
    for turn in range(2):  # two agent turns each, batched across the three conversations
        reps = pol.respond([Request(c.view("agent"), s, turn=turn) for c, s in zip(convs, streams)])
        for c, r in zip(convs, reps):
            c.say("agent", r.content); c.say("user", "Tell me more.")
    lp, _, _ = token_logprobs(pol.model, [s.ids for s in streams], temperature=0.7, pad_id=pol.pad_id)
    worst = 0.0
    for i, s in enumerate(streams):
        m = torch.tensor(s.mask, dtype=torch.bool)
        assert m.sum() >= 2
        worst = max(worst, float((lp[i, :len(s.ids)][m].detach() - torch.tensor(s.logprobs)[m]).abs().max()))
        text = lm.tokenizer.decode(s.ids)
        assert text.count("<|im_start|>user") == 2 and "You are friendly." in text and "You are busy." not in text
    print(f"max |sampling − recomputed| logprob: {worst:.2e}")
    assert worst < 1e-4


def _marked(mark: str) -> list[int]:
    "Pids of the processes whose environment holds `mark`."
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and mark.encode() in (d / "environ").read_bytes(): out.append(int(d.name))
        except OSError:
            pass
    return out


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in rows]


def test_smollm2_grpo_on_vllm_resumes_after_kill_9_with_identical_metrics(tmp_path, monkeypatch):
    """SmolLM2 trained for 2 steps with its rollouts and evaluation on a vLLM server the run starts (weights pushed when
    an update moved them; float32 gap < 1e-3; per-episode seeds, `agent.seeding = 'episode'`; an entropy bonus so that
    every update moves the weights, whatever the rewards); then the same run by the CLI, killed with SIGKILL after its
    step-1 row and resumed on a fresh server: the same tokens and the same metrics, step for step."""
    from scope_nb.train.config import load_config
    from scope_nb.train.run import train
    from scope_nb.users.modes import Servers
    from scope_nb.users.vllm_engine import vllm_python
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    cfg = str(ROOT / "configs" / "smoke_smollm2.toml")
    sets = ["run.steps=2", "eval.every=2", "agent.engine='vllm'", "agent.seeding='episode'", "grpo.lr=1e-5",
            "grpo.entropy_coef=0.05"]
    engines, real = [], Servers.vllm   # a spy on the real engine: which requests the run sent it
    monkeypatch.setattr(Servers, "vllm", lambda self, *a, **k: engines.append(real(self, *a, **k)) or engines[-1])
    run = train(load_config(cfg, [f"run.out_dir='{tmp_path / 'ref'}'", *sets]), progress=False)
    ref = read_metrics(run / "metrics.jsonl")
    assert [x["step"] for x in ref] == [0, 1, 2] and len(engines) == 1
    assert all(ref[s]["train/tokens"] > 0 and ref[s]["train/grad_norm"] > 0 for s in (1, 2)), ref
    assert all(0 < ref[s]["train/logprob_gap_max"] < 1e-3 for s in (1, 2)), ref   # float32 engine and trainer
    assert "eval/mean" in ref[0] and "eval/mean" in ref[2]
    calls = engines[0].calls
    assert calls["/v1/completions"] >= 4   # the step-0 and step-2 evaluations and two steps of rollouts
    # pushed before the first generation and whenever an update had moved the weights: at most once per version
    assert 2 <= calls["/collective_rpc"] <= 3 and calls["/reset_prefix_cache"] >= calls["/collective_rpc"], calls
    step, folder = latest_checkpoint(run)
    assert step == 2 and (folder / "agent" / "model.safetensors").exists() and (folder / "agent" / "optimizer.pt").exists()

    out = tmp_path / "crash"
    args = [SCOPE, "train", cfg, "--no-progress", "--set", f"run.out_dir='{out}'", *[a for x in sets for a in ("--set", x)]]
    mark = f"scope-kill-test-{os.getpid()}"   # in the run's environment, inherited by its server's processes
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "KILL_MARK": mark})
    m = out / "smoke-smollm2" / "metrics.jsonl"
    try:
        while p.poll() is None and len(read_metrics(m)) < 2: time.sleep(0.2)
        server = [q for q in _marked(mark) if q != p.pid]
    finally:
        if p.poll() is None: os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr.read()[-3000:]
    assert server   # the vLLM server (API server, engine core) the killed run had started...
    t0 = time.time()
    while _marked(mark) and time.time() - t0 < 120: time.sleep(0.5)   # a hang guard: it goes within seconds
    assert not _marked(mark), _marked(mark)   # ...did not outlive it (its watchdog stopped the group)
    r = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = read_metrics(m)
    assert [x["step"] for x in got] == [0, 1, 2]
    # the resumed run pushed the checkpoint's weights first and replayed the seeds: the same tokens were sampled
    for s in (1, 2):
        name = f"step_{s:06d}.jsonl"
        same = [json.loads(x)["conversation"] for x in (out / "smoke-smollm2" / "trajectories" / name).open()]
        assert same == [json.loads(x)["conversation"] for x in (run / "trajectories" / name).open()], s
    # and the same metrics, exactly (loss, gradient norm, entropy: the update reads the trainer's own logprobs), but
    # for train/logprob_gap(_max): the logprobs vLLM reports carry float round-off that depends on how it batched the
    # step's concurrent requests (measured 2026-12-05: the mean differed by 0.5e-7 to 3.2e-7 between the two runs)
    for a, b in zip(_stable(got), _stable(ref)):
        assert set(a) == set(b), set(a) ^ set(b)
        for k in a:
            # float32 round-off of a fresh server, not a quantity to reproduce (CI saw differences of 2.9e-6 and
            # 2.2e-5): both runs must stay within the engine contract instead
            if k.startswith("train/logprob_gap"): assert max(a[k], b[k]) < 1e-3, (a["step"], k, a[k], b[k])
            else: assert a[k] == b[k], (a["step"], k, a[k], b[k])
