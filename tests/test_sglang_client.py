"""SGLang client request/response handling against a loopback stand-in served by a real tiny model (SGLang needs CUDA)."""
import copy
import numpy as np
import pytest
import torch
from fake_sglang import FakeSGLang
from scope_nb.grpo import GRPOConfig, GRPOTrainer, role_items
from scope_nb.lab import LAB_VOCAB, LabEnv, LabSimulator
from scope_nb.rollout import rollout
from scope_nb.sglang_client import SGLangEngine, SGLangError
from scope_nb.training import token_logprobs, tiny_policy


@pytest.fixture()
def setup():
    pol = tiny_policy(LAB_VOCAB, hidden=32, layers=1, seed=2, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)
    fake = FakeSGLang(copy.deepcopy(pol.model), pol.pad_id)
    pol.engine = SGLangEngine(fake.url, retries=2, backoff=0.01)
    yield pol, fake
    fake.close()


def _rollout(pol, seed=0):
    env = LabEnv()
    return rollout(env, env.sample_tasks("train", 4, np.random.default_rng(seed)), 4, {"agent": pol, "user": LabSimulator("wary", 2.0, seed=seed)}, ("agent",))


def _max_logprob_gap(pol, episodes) -> float:
    "max |trainer logprob − engine sampling logprob| over every generated token of the agent streams."
    gap = 0.0
    for e in episodes:
        t = e.trajectories["agent"]
        with torch.no_grad(): lp, _, _ = token_logprobs(pol.model, [t.token_ids], pol.temperature, pol.pad_id, with_entropy=False)
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        gap = max(gap, float((lp[0][m] - torch.tensor(t.logprobs)[m]).abs().max()))
    return gap


def test_generation_requests_and_exact_streams(setup):
    pol, fake = setup
    res = _rollout(pol)
    assert all(e.status != "failed" for e in res.episodes)
    gens = [b for p, b in fake.requests if p == "/generate"]
    assert len(gens) == 2                               # one batched request per agent round
    b = gens[0]
    assert b["return_logprob"] is True and b["sampling_params"]["temperature"] == 1.0
    assert b["sampling_params"]["stop_token_ids"] == pol.eos_ids and b["sampling_params"]["max_new_tokens"] == 2
    assert len(b["input_ids"]) == 16 and all(isinstance(x, int) for x in b["input_ids"][0])
    # the prompt the engine saw is exactly the stream prefix the trainer will score
    first = res.episodes[0].trajectories["agent"]
    assert first.token_ids[:len(b["input_ids"][0])] == b["input_ids"][0]
    assert _max_logprob_gap(pol, res.episodes) < 1e-5


def test_weight_update_from_disk_moves_the_engine(setup, tmp_path):
    pol, fake = setup
    items, _ = role_items(_rollout(pol).episodes, "agent")
    GRPOTrainer(pol, GRPOConfig(lr=5e-2, kl_coef=0.0)).step(items)   # trainer weights move, engine still old
    stale = _rollout(pol, 1).episodes
    assert _max_logprob_gap(pol, stale) > 1e-3                        # the check can fail: stale engine weights
    pol.model.save_pretrained(tmp_path / "step1")
    assert pol.engine.update_weights_from_disk(tmp_path / "step1")["success"] is True
    assert _max_logprob_gap(pol, _rollout(pol, 2).episodes) < 1e-5
    with pytest.raises(SGLangError, match="refused: failed to load"):
        pol.engine.update_weights_from_disk(tmp_path / "missing")


def test_faults_retries_and_errors(setup):
    pol, fake = setup
    eng = pol.engine
    fake.faults = [503, "drop"]                                       # two transient failures, then an answer
    out = eng.generate([[3, 4, 5]], 2, 1.0, pol.eos_ids)
    assert len(out) == 1 and len(out[0].ids) >= 1 and eng.calls["/generate"] == 3
    fake.faults = [400]
    with pytest.raises(SGLangError, match="HTTP 400"): eng.generate([[3, 4]], 2, 1.0, pol.eos_ids)
    fake.faults = [503, 503, 503]
    with pytest.raises(SGLangError, match="after 3 attempts"): eng.generate([[3, 4]], 2, 1.0, pol.eos_ids)
    eng.release_memory()
    with pytest.raises(SGLangError, match="memory is released"): eng.generate([[3, 4]], 2, 1.0, pol.eos_ids)
    eng.resume_memory(); eng.flush_cache()
    assert eng.generate([[3, 4]], 2, 1.0, pol.eos_ids) and eng.healthy()
    paths = [p for p, _ in fake.requests]
    k = paths.index("/release_memory_occupation")
    assert paths[k:].count("/resume_memory_occupation") == 1 and "/flush_cache" in paths[k:] and paths[-1] == "/generate"


def test_pool_opponent_plays_on_the_engine_loaded_from_the_entry_folder(setup, tmp_path):
    "Population Co-Training on engines: the simulator's engine loads the drawn pool entry from disk whenever the draw changes."
    from scope_nb.sim_modes import CheckpointPool, PoolSpeaker
    pol, fake = setup
    user = tiny_policy(LAB_VOCAB, hidden=32, layers=1, seed=7, name="user", trainable=True, temperature=1.0, max_new_tokens=2)
    pool = CheckpointPool(tmp_path / "pool", 5)
    pool.add(user.model, user.tok, 0)
    with torch.no_grad():
        for p in user.model.parameters(): p.add_(0.5 * torch.randn_like(p))   # a second, clearly different entry
    pool.add(user.model, user.tok, 4)
    sp = PoolSpeaker(user, pool, "uniform", seed=0)
    sp.engine = SGLangEngine(fake.url, retries=2, backoff=0.01)
    pol.engine = None                                                        # the agent generates locally here
    env, seen = LabEnv(), []
    for seed in range(8):
        sp.reseed(seed)
        res = rollout(env, env.sample_tasks("train", 2, np.random.default_rng(seed)), 2, {"agent": pol, "user": sp}, ("user",))
        entry = sp.entry
        seen.append(entry["id"])
        loads = [b["model_path"] for p, b in fake.requests if p == "/update_weights_from_disk"]
        assert loads and loads[-1] == str(pool.path(entry))                  # the engine holds the drawn entry
        opp = type(user.model).from_pretrained(pool.path(entry)).eval()
        for e in res.episodes:                                               # and the replies were sampled by it
            t = e.trajectories["user"]
            with torch.no_grad(): lp, _, _ = token_logprobs(opp, [t.token_ids], 1.0, user.pad_id, with_entropy=False)
            m = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert float((lp[0][m] - torch.tensor(t.logprobs)[m]).abs().max()) < 1e-5
    changes = sum(a != b for a, b in zip(seen, seen[1:]))
    assert set(seen) == {0, 1} and len([b for p, b in fake.requests if p == "/update_weights_from_disk"]) == changes + 1
