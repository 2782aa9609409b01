"""Real model: SmolLM2-135M-Instruct token streams and a 2-step GRPO smoke run with resume."""
import math, subprocess, sys
import pytest
from pathlib import Path
import torch
from conftest import ROOT
from scope_nb.core import Conversation, Request
from scope_nb.models import load_causal_lm
from scope_nb.run import read_metrics, latest_checkpoint
from scope_nb.training import LocalPolicy, TokenStream, token_logprobs

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


def test_smollm2_grpo_smoke_run_on_vllm_and_resume(tmp_path, monkeypatch):
    """SmolLM2 trained for 2 steps with its rollouts and evaluation on a vLLM server the run starts (weights pushed when
    an update moved them; float32 gap < 1e-3), then resumed from its checkpoint by the CLI for a third step."""
    from scope_nb.config import load_config
    from scope_nb.run import train
    from scope_nb.sim_modes import Servers
    from scope_nb.vllm_engine import vllm_python
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    cfg = str(ROOT / "configs" / "smoke_smollm2.toml")
    sets = [f"run.out_dir='{tmp_path}'", "agent.engine='vllm'"]
    engines, real = [], Servers.vllm   # a spy on the real engine: which requests the run sent it
    monkeypatch.setattr(Servers, "vllm", lambda self, *a, **k: engines.append(real(self, *a, **k)) or engines[-1])
    run = train(load_config(cfg, sets), progress=False)
    assert run == tmp_path / "smoke-smollm2"
    rows = read_metrics(run / "metrics.jsonl")
    assert [x["step"] for x in rows] == [0, 1, 2] and len(engines) == 1
    assert all(rows[s]["train/tokens"] > 0 and rows[s]["train/entropy"] > 0 for s in (1, 2))
    assert all(0 < rows[s]["train/logprob_gap_max"] < 1e-3 for s in (1, 2)), rows   # float32 engine and trainer
    assert "eval/mean" in rows[0] and "eval/mean" in rows[2]
    calls = engines[0].calls
    assert calls["/v1/completions"] >= 4   # the step-0 and step-2 evaluations and two steps of rollouts
    # pushed before the first generation and whenever an update had moved the weights: at most once per version
    assert 2 <= calls["/collective_rpc"] <= 3 and calls["/reset_prefix_cache"] >= calls["/collective_rpc"], calls
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    step, folder = latest_checkpoint(run)
    assert step == 2 and (folder / "agent" / "model.safetensors").exists() and (folder / "agent" / "optimizer.pt").exists()
    base = ["--set", f"run.out_dir='{tmp_path}'", "--no-progress"]
    r = subprocess.run([SCOPE, "train", cfg, *base, "--resume", "--set", "run.steps=3", "--set", "eval.every=10"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(run / "metrics.jsonl")
    assert [x["step"] for x in rows] == [0, 1, 2, 3] and latest_checkpoint(run)[0] == 3
    assert 0 < rows[3]["train/logprob_gap_max"] < 1e-3   # the resumed run pushed the checkpoint's weights first


def test_lora_population_co_training_on_one_vllm_engine(tmp_path, monkeypatch):
    """Population Co-Training with LoRA on both seats (SmolLM2): one vLLM server holds the base model, the agent's
    adapter (pushed after each update, float32 gap < 1e-3, truncated importance weights at 1) and the simulator's pool
    entries, each drawn by name; checkpoints hold adapters only."""
    from scope_nb.config import load_config
    from scope_nb.run import train
    from scope_nb.sim_modes import Servers
    from scope_nb.vllm_engine import VLLMEngine, vllm_python
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    engines, real = [], Servers.vllm
    monkeypatch.setattr(Servers, "vllm", lambda self, *a, **k: engines.append(real(self, *a, **k)) or engines[-1])
    asked, complete = [], VLLMEngine._complete   # which model or adapter each generation request named
    monkeypatch.setattr(VLLMEngine, "_complete", lambda self, *a: asked.append(a[-1]) or complete(self, *a))
    sets = [f"run.out_dir='{tmp_path}'", "run.name='lora-pool'", "grpo.lr=1e-4", "grpo.tis_cap=2.0", "eval.every=10",
            "agent.engine='vllm'", "agent.lora.rank=8", "agent.lora.alpha=16",
            "user.train=true", "user.engine='vllm'", "user.lora.rank=8", "user.lora.alpha=16",
            "user.mode='pool'", "user.pool.size=3", "user.pool.every=1", "user.pool.sampling='latest'"]
    run = train(load_config(str(ROOT / "configs" / "smoke_smollm2.toml"), sets), progress=False)
    rows = read_metrics(run / "metrics.jsonl")
    assert [x["step"] for x in rows] == [0, 1, 2]
    # agent, simulator and the panel's frozen simulator (the base, no adapter): three clients of one server
    assert len(engines) == 3 and len({e.url for e in engines}) == 1 and engines[2].frozen and not engines[2].adapter
    assert all(0 < rows[s]["train/logprob_gap_max"] < 1e-3 for s in (1, 2)), rows
    # truncated importance sampling on: at a float32 gap the weights are 1 to round-off and none reaches the cap
    assert all(abs(rows[s]["train/tis_weight"] - 1) < 1e-3 and rows[s]["train/tis_capped"] == 0 for s in (1, 2)), rows
    assert all(rows[s]["sim/tokens"] > 0 and math.isfinite(rows[s]["sim/loss"]) for s in (1, 2))   # the simulator trains
    # the agent generates with its adapter; the simulator's turns come from pool entries by name (step 1 the initial
    # entry 0, step 2 with sampling 'latest' entry 1, added after step 1), never from the adapter in training
    assert {"agent", "user_pool0", "user_pool1"} <= set(asked) and "user" not in asked, asked
    pool = sorted(p.name for p in (run / "pool").iterdir() if p.name.startswith("entry_"))
    assert len(pool) == 3 and all((run / "pool" / p / "adapter_model.safetensors").exists() for p in pool)
    step, folder = latest_checkpoint(run)
    for role in ("agent", "user"):
        assert (folder / role / "adapter_model.safetensors").exists() and not (folder / role / "model.safetensors").exists()
