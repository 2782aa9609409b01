"""The vLLM client against the real vLLM server (the CPU build `make venv` installs into its own venv) serving the
packaged SmolLM2 in float32 with LoRA enabled: sampling logprobs vs the trainer's, weight updates in place (greedy
output changes and comes back; no stale prefix cache), LoRA adapters loaded, used and unloaded by name, clear errors."""
import copy
import pytest
import torch
from scope_nb.core.models import load_causal_lm
from scope_nb.core.policy import token_logprobs
from scope_nb.users.vllm_engine import VLLMEngine, VLLMError, VLLMServer, vllm_python


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if vllm_python() is None:
        pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    lm = load_causal_lm("smollm2")
    srv = VLLMServer("smollm2", lora_rank=8, max_loras=2, log_path=tmp_path_factory.mktemp("vllm") / "server.log")
    with srv:
        yield lm, srv, VLLMEngine(srv.url, srv.name)


def _ids(lm, text):
    return lm.tokenizer(text)["input_ids"]


def _gap(model, prompt, sample, T=1.0):
    "max |trainer logprob - engine sampling logprob| over the sample's tokens."
    seq = prompt + sample.ids
    with torch.no_grad():
        lp, _, _ = token_logprobs(model, [seq], T, 2, with_entropy=False)
    return max(abs(float(lp[0][len(prompt) + j]) - sample.logprobs[j]) for j in range(len(sample.ids)))


def _perturbed(lm, folder, scale=0.05, key="mlp"):
    m = copy.deepcopy(lm.model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if key in n:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    m.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return m


def test_sampling_logprobs_match_the_trainer_and_seeds(served):
    lm, srv, eng = served
    prompts = [_ids(lm, t) for t in ("The capital of France is", "A short poem about rain:", "def add(a, b):")]
    samples = eng.generate(prompts, 12, 1.0, [2])
    assert [len(s.ids) for s in samples] == [len(s.logprobs) for s in samples] and all(samples)
    gap = max(_gap(lm.model, p, s) for p, s in zip(prompts, samples))
    assert gap < 1e-3, gap   # float32 on both sides: round-off only (measured ~4e-5)
    # seeded: reproducible, and the G copies of a prompt draw their own tokens (one seed per prompt, not per request)
    a = eng.generate([prompts[0]] * 4, 8, 1.0, [2], seed=7)
    b = eng.generate([prompts[0]] * 4, 8, 1.0, [2], seed=7)
    assert [s.ids for s in a] == [s.ids for s in b]
    assert len({tuple(s.ids) for s in a}) > 1, [s.ids for s in a]
    assert eng.calls["/v1/completions"] == 1 + 8


def test_tied_embeddings_reach_the_engine_output_head_too(served, tmp_path):
    """vLLM 0.32.0 loses a tie on an in-place reload (new embeddings, old output head); the engine is served an untied
    copy, so moving SmolLM2's tied embeddings moves the engine's head as well, and the reverse update restores it."""
    lm, srv, eng = served
    assert srv.folder.name.endswith("-untied") and lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    prompts = [_ids(lm, t) for t in ("The capital of France is", "A short poem about rain:", "def add(a, b):")]
    new = _perturbed(lm, tmp_path / "embeddings", scale=0.02, key="embed_tokens")   # saved tied, as HF saves it
    eng.update_weights_from_disk(tmp_path / "embeddings")
    samples = eng.generate(prompts, 12, 1.0, [2])
    moved = max(_gap(new, p, s) for p, s in zip(prompts, samples))
    before = max(_gap(lm.model, p, s) for p, s in zip(prompts, samples))
    eng.update_weights_from_disk(lm.path)
    samples = eng.generate(prompts, 12, 1.0, [2])
    back = max(_gap(lm.model, p, s) for p, s in zip(prompts, samples))
    assert moved < 1e-3 < before and back < 1e-3, (moved, before, back)


def test_weight_update_in_place_and_no_stale_prefix_cache(served, tmp_path):
    lm, srv, eng = served
    long = _ids(lm, "Once upon a time, in a small village by the sea, " * 25)   # several cache blocks
    short = _ids(lm, "The capital of France is")
    g0 = eng.generate([short], 16, 0.0, [2])[0].ids
    eng.generate([long], 4, 1.0, [2])   # the long prompt's blocks are now in the prefix cache
    new = _perturbed(lm, tmp_path / "perturbed")
    # without the reset, the cached prefix answers with keys and values of the old weights: a gap well above round-off
    eng._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "perturbed")}})
    stale = _gap(new, long, eng.generate([long], 4, 1.0, [2])[0])
    eng.update_weights_from_disk(lm.path)   # back to the base: reload + reset
    eng.update_weights_from_disk(tmp_path / "perturbed")
    fresh = _gap(new, long, eng.generate([long], 4, 1.0, [2])[0])
    assert fresh < 1e-3 < stale, (fresh, stale)
    g1 = eng.generate([short], 16, 0.0, [2])[0].ids
    eng.update_weights_from_disk(lm.path)
    g2 = eng.generate([short], 16, 0.0, [2])[0].ids
    assert g1 != g0 and g2 == g0, (g0, g1, g2)


def test_lora_adapter_changes_logprobs_and_unloading_restores_the_base(served, tmp_path):
    from peft import LoraConfig, get_peft_model
    lm, srv, eng = served
    pm = get_peft_model(copy.deepcopy(lm.model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)   # peft starts B at 0 (the identity): move it
    pm.save_pretrained(tmp_path / "adapter")
    prompt = _ids(lm, "My favourite colour is")
    base = eng.generate([prompt], 10, 1.0, [2], seed=3)[0]
    eng.load_adapter("a", tmp_path / "adapter")
    with_a = eng.generate([prompt], 10, 1.0, [2], seed=3, adapter="a")[0]
    assert _gap(pm, prompt, with_a) < 1e-3   # the engine applies the adapter as peft does
    assert _gap(lm.model, prompt, with_a) > 1e-2   # and it is not the base
    eng.load_adapter("a", tmp_path / "adapter")   # pushing the same name again replaces it in place
    eng.unload_adapter("a")
    with pytest.raises(VLLMError, match="no model or adapter 'a'.*load the adapter first"):
        eng.generate([prompt], 4, 1.0, [2], adapter="a")
    again = eng.generate([prompt], 10, 1.0, [2], seed=3)[0]
    assert again.ids == base.ids and max(abs(x - y) for x, y in zip(again.logprobs, base.logprobs)) < 1e-4


def test_bad_folders_are_refused_before_the_engine_sees_them(served, tmp_path):
    lm, srv, eng = served
    with pytest.raises(VLLMError, match="has no config.json and \\*.safetensors"):
        eng.update_weights_from_disk(tmp_path / "missing")
    with pytest.raises(VLLMError, match="has no adapter_config.json"):
        eng.load_adapter("b", tmp_path)
    assert srv.alive() and eng.generate([_ids(lm, "Hello")], 2, 1.0, [2])   # the engine still serves
