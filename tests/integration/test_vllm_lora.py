"""LoRA on the real vLLM server (CPU build), SmolLM2 in both seats: Population Co-Training with the agent's adapter and
the simulator's pool entries on one server, and self-play with one adapter in both seats."""
import math
import pytest
from conftest import ROOT
from scope_nb.train.crash_safety import read_metrics, latest_checkpoint


def _spy(monkeypatch):
    "The real engine, spied on: the engines the run made and the model or adapter each generation request named."
    from scope_nb.users.modes import Servers
    from scope_nb.users.vllm_engine import VLLMEngine, vllm_python
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    engines, real = [], Servers.vllm
    monkeypatch.setattr(Servers, "vllm", lambda self, *a, **k: engines.append(real(self, *a, **k)) or engines[-1])
    asked, complete = [], VLLMEngine._complete
    monkeypatch.setattr(VLLMEngine, "_complete", lambda self, *a: asked.append(a[-1]) or complete(self, *a))
    return engines, asked


def test_lora_population_co_training_on_one_vllm_engine(tmp_path, monkeypatch):
    """Population Co-Training with LoRA on both seats (SmolLM2): one vLLM server holds the base model, the agent's
    adapter (pushed after each update, float32 gap < 1e-3, truncated importance weights at 1) and the simulator's pool
    entries, each drawn by name; checkpoints hold adapters only."""
    from scope_nb.train.config import load_config
    from scope_nb.train.run import train
    engines, asked = _spy(monkeypatch)
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


def test_lora_self_play_one_adapter_in_both_seats(tmp_path, monkeypatch):
    """Self-play with LoRA on vLLM: `user.model = 'same'` puts the agent's one adapter in both seats; every generation
    names it, its tokens of both roles train it (float32 gap < 1e-3), and the checkpoint holds that one adapter."""
    from scope_nb.train.config import load_config
    from scope_nb.train.run import train
    engines, asked = _spy(monkeypatch)
    sets = [f"run.out_dir='{tmp_path}'", "run.name='lora-sp'", "grpo.lr=1e-4", "eval.every=10", "agent.engine='vllm'",
            "agent.lora.rank=8", "agent.lora.alpha=16", "user.model='same'", "user.train=true"]
    run = train(load_config(str(ROOT / "configs" / "smoke_smollm2.toml"), sets), progress=False)
    rows = read_metrics(run / "metrics.jsonl")
    assert [x["step"] for x in rows] == [0, 1, 2] and len(engines) == 1 and engines[0].adapter == "agent"
    assert set(asked) == {"agent"}, set(asked)   # both seats, training and evaluation: the one adapter
    assert all(0 < rows[s]["train/logprob_gap_max"] < 1e-3 for s in (1, 2)), rows
    assert all(rows[s]["sim/reward"] is not None and math.isfinite(rows[s]["train/loss"]) for s in (1, 2)), rows
    traj = (run / "trajectories" / "step_000001.jsonl").read_text()
    assert '"user"' in traj and '"agent"' in traj
    step, folder = latest_checkpoint(run)
    assert step == 2 and (folder / "agent" / "adapter_model.safetensors").exists()
    assert not (folder / "user").exists() and not (folder / "agent" / "model.safetensors").exists()
