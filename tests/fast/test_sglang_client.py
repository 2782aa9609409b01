"""SGLang client request/response handling against a loopback stand-in served by a real tiny model (SGLang needs CUDA)."""
import copy
from pathlib import Path
import numpy as np
import pytest
import torch
from fake_sglang import FakeSGLang
from scope_nb.train.grpo import GRPOConfig, GRPOTrainer, role_items
from scope_nb.envs.lab import LAB_VOCAB, LabEnv, LabSimulator
from scope_nb.train.rollout import rollout
from scope_nb.scale.sglang_client import SGLangEngine, SGLangError
from scope_nb.core.policy import token_logprobs, tiny_policy


def _policy():
    return tiny_policy(LAB_VOCAB, hidden=32, layers=1, seed=2, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)


@pytest.fixture()
def setup(tmp_path):
    pol = _policy()
    pol.model.save_pretrained(tmp_path / "initial")   # the folder the engine was started from (what /model_info names)
    fake = FakeSGLang(copy.deepcopy(pol.model), pol.pad_id, model_path=str(tmp_path / "initial"))
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
    with pytest.raises(SGLangError, match="HTTP 400 .*Failed to get weights iterator"):   # the real server's status
        pol.engine.update_weights_from_disk(tmp_path / "missing")
    assert _max_logprob_gap(pol, _rollout(pol, 3).episodes) < 1e-5                      # and the old weights stay


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
    with pytest.raises(SGLangError, match="illegal memory access"): eng.generate([[3, 4]], 2, 1.0, pol.eos_ids)
    eng.resume_memory(); eng.flush_cache()
    assert eng.generate([[3, 4]], 2, 1.0, pol.eos_ids) and eng.healthy()
    paths = [p for p, _ in fake.requests]
    k = paths.index("/release_memory_occupation")
    assert paths[k:].count("/resume_memory_occupation") == 1 and "/flush_cache" in paths[k:] and paths[-1] == "/generate"
    assert paths[paths.index("/resume_memory_occupation") + 1] == "/update_weights_from_disk"   # the weights came back


def test_the_stand_in_refuses_what_sglang_refuses(setup):
    "SGLang 0.5.23's request contract: an unknown sampling key or a wrongly typed value is HTTP 400; unknown top-level keys pass."
    pol, fake = setup
    eng = pol.engine
    for bad in ({"foo": 1}, {"max_new_tokens": 2.0}, {"no_stop_trim": 1}):
        with pytest.raises(SGLangError, match="HTTP 400 .*(unknown field `foo`|expected)"):
            eng._post("/generate", {"input_ids": [[3, 4]], "sampling_params": {"max_new_tokens": 2} | bad, "return_logprob": True})
    ok = eng._post("/generate", {"input_ids": [[3, 4]], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True, "extra": 1})
    assert isinstance(ok, list) and ok[0]["meta_info"]["input_token_logprobs"] == []
    assert eng._post("/release_memory_occupation") is None and eng._post("/resume_memory_occupation") is None   # `null`
    assert eng.flush_cache()["text"].startswith("Cache flushed.")


def test_aborted_prompts_are_asked_again_then_fail(setup):
    pol, fake = setup
    eng = pol.engine
    fake.faults = ["abort-one"]                      # the first prompt aborted (HTTP 200, finish_reason abort)
    out = eng.generate([[3, 4], [5, 6], [7, 8]], 2, 1.0, pol.eos_ids)
    gens = [b for p, b in fake.requests if p == "/generate"]
    assert len(out) == 3 and all(o.ids for o in out) and [len(b["input_ids"]) for b in gens] == [3, 1]
    assert gens[1]["input_ids"] == [[3, 4]]
    fake.faults = ["abort"] * 3
    with pytest.raises(SGLangError, match="aborted.*after 3 attempts"): eng.generate([[3, 4]], 2, 1.0, pol.eos_ids)


def test_health_is_503_while_starting():
    pol = _policy()
    fake = FakeSGLang(copy.deepcopy(pol.model), pol.pad_id, starting=2)
    try:
        eng = SGLangEngine(fake.url)
        assert [eng.healthy(), eng.healthy(), eng.healthy()] == [False, False, True]
        fake.starting = 1
        eng.wait_ready(timeout=60, every=0.01)
        assert eng.healthy()
    finally: fake.close()


def test_resume_without_cpu_backup_loses_the_weights_until_reloaded(setup):
    "SGLang's memory saver maps new memory on resume; without --enable-weights-cpu-backup the old contents are gone."
    pol, fake = setup
    eng = pol.engine
    eng.release_memory(); eng.resume_memory(reload=False)
    assert _max_logprob_gap(pol, _rollout(pol).episodes) > 1e-2          # garbage weights: the check can fail
    eng.release_memory(); eng.resume_memory()                             # reloads /model_info's model_path
    assert _max_logprob_gap(pol, _rollout(pol, 1).episodes) < 1e-5
    fake.cpu_backup = True                                                 # --enable-weights-cpu-backup keeps them
    eng.release_memory(); eng.resume_memory(reload=False)
    assert _max_logprob_gap(pol, _rollout(pol, 2).episodes) < 1e-5


def test_seeds_are_per_prompt(setup):
    "With --enable-deterministic-inference one sampling_seed makes every copy of a prompt draw the same tokens; seeds go per prompt."
    pol, fake = setup
    fake.deterministic = True
    eng = pol.engine
    prompts = [[3, 4, 5]] * 6
    one = eng._post("/generate", {"input_ids": prompts, "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 7},
                                  "return_logprob": True})
    assert len({tuple(r["output_ids"]) for r in one}) == 1               # the trap: G identical samples
    out = eng.generate(prompts, 3, 1.0, pol.eos_ids, seed=7)
    assert len({tuple(o.ids) for o in out}) > 1
    body = [b for p, b in fake.requests if p == "/generate"][-1]
    assert [sp["sampling_seed"] for sp in body["sampling_params"]] == list(range(7, 13))
    assert eng.generate(prompts, 3, 1.0, pol.eos_ids, seed=7) == out    # and reproducible


def test_relative_weight_paths_are_sent_absolute(setup, tmp_path, monkeypatch):
    pol, fake = setup
    pol.model.save_pretrained(tmp_path / "w")
    monkeypatch.chdir(tmp_path)
    assert pol.engine.update_weights_from_disk("w")["success"] is True
    assert [b for p, b in fake.requests if p == "/update_weights_from_disk"][-1]["model_path"] == str(tmp_path / "w")


def test_a_bf16_engine_is_not_bit_exact(tmp_path):
    "An engine in bfloat16 samples with logprobs that differ from the float32 trainer's: the gap the device check reports."
    pol = _policy()
    fake = FakeSGLang(copy.deepcopy(pol.model), pol.pad_id, dtype=torch.bfloat16)
    try:
        pol.engine = SGLangEngine(fake.url)
        gap = _max_logprob_gap(pol, _rollout(pol).episodes)
        assert 1e-4 < gap < 0.5, gap
    finally: fake.close()


def test_pool_opponent_plays_on_the_engine_loaded_from_the_entry_folder(setup, tmp_path):
    "Population Co-Training on engines: the simulator's engine loads the drawn pool entry from disk whenever the draw changes."
    from scope_nb.users.modes import CheckpointPool, PoolSpeaker
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


@pytest.mark.parametrize("mp,dtype", [("none", torch.float32), ("bf16", torch.bfloat16)])
def test_weight_push_writes_once_in_the_compute_dtype_to_an_absolute_path(setup, tmp_path, monkeypatch, mp, dtype):
    "RayBackend._push_weights (the driver's write): safetensors in bfloat16 under mixed_precision = 'bf16' (half the bytes), absolute path, old pushes removed."
    from types import SimpleNamespace
    from safetensors import safe_open
    from scope_nb.scale.ray_backend import RayBackend
    pol, fake = setup
    monkeypatch.chdir(tmp_path)
    b = RayBackend.__new__(RayBackend)   # only the push path: no Ray cluster
    b.cfg, b.weights_dir, b.engines = SimpleNamespace(grpo=SimpleNamespace(mixed_precision=mp)), Path("w"), {"agent": [fake.url]}
    b.groups = {}   # no trainer group yet: the driver writes its own copy (a run's first push)
    for v in (1, 2): b._push_weights(pol, "agent", v)
    sent = [b_["model_path"] for p, b_ in fake.requests if p == "/update_weights_from_disk"]
    assert sent == [str(tmp_path / "w" / "agent_v000001"), str(tmp_path / "w" / "agent_v000002")]
    assert [d.name for d in (tmp_path / "w").iterdir()] == ["agent_v000002"]
    with safe_open(str(tmp_path / "w" / "agent_v000002" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}
    gap = _max_logprob_gap(pol, _rollout(pol).episodes)
    assert gap < 1e-5 if mp == "none" else 1e-5 < gap < 0.5
