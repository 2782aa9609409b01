"""HF -> Megatron -> HF conversion is exact for tiny Llama / Qwen2 / Qwen3 configs, the converted weights load strictly into
real megatron-core GPTModels built on the CPU, the derived TransformerConfig matches the HF config's fields, and MegatronTrainer
with tensor parallelism 2 over gloo gives the single-process GRPOTrainer's gradients and weights."""
import os, pickle, subprocess, sys, warnings
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from scope_nb.core.dialogue import free_port
from scope_nb.scale.fsdp import init_local_group
from scope_nb.scale.megatron import gpt_model_kwargs, hf_to_megatron, megatron_config_kwargs, megatron_to_hf

warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)
CASES = [(LlamaConfig(**TINY, tie_word_embeddings=False), LlamaForCausalLM),
         (Qwen2Config(**TINY, tie_word_embeddings=False), Qwen2ForCausalLM),
         (Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True), Qwen3ForCausalLM)]


@pytest.fixture(scope="module")
def megatron():
    from megatron.core import parallel_state
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _build(hf_cfg):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    tc = TransformerConfig(**megatron_config_kwargs(hf_cfg), use_cpu_initialization=True)
    kw = megatron_config_kwargs(hf_cfg)
    spec = get_gpt_layer_local_spec(qk_layernorm=kw["qk_layernorm"])
    return tc, GPTModel(config=tc, transformer_layer_spec=spec, **gpt_model_kwargs(hf_cfg))


@pytest.mark.parametrize("hf_cfg,cls", CASES, ids=["llama", "qwen2", "qwen3"])
def test_roundtrip_and_strict_load(megatron, hf_cfg, cls):
    torch.manual_seed(0)
    hf = cls(hf_cfg)
    sd = {k: v for k, v in hf.state_dict().items()}
    tc, gpt = _build(hf_cfg)
    for k, v in gpt.state_dict().items():   # random values, so a misplaced tensor cannot pass by accident
        if torch.is_tensor(v) and v.is_floating_point() and k in hf_to_megatron(sd, hf_cfg): v.normal_()
    md = hf_to_megatron(sd, hf_cfg)
    real = {k: v for k, v in gpt.state_dict().items() if torch.is_tensor(v) and not k.endswith("_extra_state")}
    assert set(md) == set(real), (set(md) ^ set(real))
    assert all(md[k].shape == real[k].shape for k in md)
    missing, unexpected = gpt.load_state_dict(md, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    loaded = {k: v.clone() for k, v in gpt.state_dict().items() if k in md}
    back = megatron_to_hf(loaded, hf_cfg)
    assert set(back) == set(sd)
    for k in sd: assert torch.equal(back[k], sd[k]), k
    # the derived TransformerConfig carries the HF config's fields
    assert (tc.num_layers, tc.hidden_size, tc.num_attention_heads, tc.num_query_groups, tc.ffn_hidden_size, tc.kv_channels) == \
        (hf_cfg.num_hidden_layers, hf_cfg.hidden_size, hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads, hf_cfg.intermediate_size,
         getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads)
    assert tc.layernorm_epsilon == hf_cfg.rms_norm_eps and tc.normalization == "RMSNorm" and tc.gated_linear_unit
    assert tc.add_qkv_bias == (hf_cfg.model_type == "qwen2") and tc.qk_layernorm == (hf_cfg.model_type == "qwen3")


def test_unsupported_configs_are_named():
    from transformers import GPT2Config
    with pytest.raises(ValueError, match="model_type 'gpt2'"): megatron_config_kwargs(GPT2Config())


# --- MegatronTrainer: tensor-parallel GRPO gives the single-process trainer's numbers ---------------------------------
def _megatron_run(path, tp, rank):
    "Three GRPO steps with MegatronTrainer on this rank; rank 0 saves first-step gradients and final weights in HF layout."
    from test_fsdp import CFG, _policy
    from scope_nb.scale.megatron_train import MegatronTrainer, tp_unshard
    batches = pickle.loads(open(path + ".in", "rb").read())
    tr = MegatronTrainer(_policy(), CFG)
    grads, norms = None, []
    for i, items in enumerate(batches):
        norms.append(tr.step(items)["grad_norm"])
        if i == 0:
            mine = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters()}
            parts = [mine] if tp == 1 else [{} for _ in range(tp)]
            for n, g in mine.items():
                if tp == 1: continue
                got = [torch.empty_like(g) for _ in range(tp)]
                dist.all_gather(got, g.contiguous())
                for r in range(tp): parts[r][n] = got[r]
            grads = megatron_to_hf(tp_unshard(parts, tr.hf_config.vocab_size), tr.hf_config)
    params = tr._gather()
    assert all(torch.equal(params[k], v) for k, v in tr.policy.model.state_dict().items())   # the HF policy follows
    if rank == 0: torch.save((grads, params, norms), path + ".out")


def _megatron_rank(rank, world, port, path):
    torch.set_num_threads(1)
    init_local_group(rank, world, port)
    try: _megatron_run(path, world, rank)
    finally: dist.destroy_process_group()


def test_megatron_tp2_matches_single_process(tmp_path):
    from test_fsdp import CFG, _batches, _grads_and_params, _policy
    from scope_nb.train.grpo import GRPOTrainer
    batches = _batches()
    ref = GRPOTrainer(_policy(), CFG)
    want_g, want_p = _grads_and_params(ref, batches[:1], lambda t: t.clone())
    want_norms = [ref.step(items)["grad_norm"] for items in batches[1:]]
    want_p = {n: p.detach().clone() for n, p in ref.model.named_parameters()}
    path = str(tmp_path / "mg")
    open(path + ".in", "wb").write(pickle.dumps(batches))
    mp.spawn(_megatron_rank, args=(2, free_port(), path), nprocs=2, join=True)
    got_g, got_p, got_norms = torch.load(path + ".out")
    assert set(got_g) == set(want_g)
    torch.testing.assert_close(got_norms[1:], want_norms, rtol=1e-5, atol=0)   # the global norm over split and replicated tensors
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-6, msg=f"gradient of {n}")
        torch.testing.assert_close(got_p[n], want_p[n], rtol=1e-5, atol=1e-6, msg=f"parameter {n} after 3 steps")
    moved = max(float((want_p[n] - p0).abs().max().detach()) for n, p0 in _policy().model.named_parameters())
    assert moved > 1e-3


def test_megatron_tp_must_divide_groups():
    from scope_nb.scale.megatron_train import build_gpt
    with pytest.raises(ValueError, match="must divide num_key_value_heads"): build_gpt(CASES[0][0], tp=4)


def _megatron_uneven_body(rank, batches):
    "Steps of 1, 5 and 7 items; every collective checked to run on the group's device; HF-layout weights after each."
    from dist_checks import strict_group_device
    from test_fsdp import UNEVEN_CFG, _policy
    from scope_nb.scale.megatron_train import MegatronTrainer
    tr, out = MegatronTrainer(_policy(), UNEVEN_CFG), []
    with strict_group_device():
        for items in batches:
            stats = tr.step(items)
            out.append((stats, {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}))
    return out


def test_megatron_tp2_uneven_item_counts(tmp_path):
    "TP = 2 over gloo with 1, 5 and 7 items (micro-batch 2) gives the single-process update step by step, collectives on the group's device."
    from dist_checks import on_ranks
    from test_fsdp import UNEVEN_CFG, _policy, check_stepwise, stepwise, uneven_batches
    from scope_nb.train.grpo import GRPOTrainer
    batches = uneven_batches()
    want = stepwise(GRPOTrainer(_policy(), UNEVEN_CFG), batches, lambda t: t.clone())
    check_stepwise(on_ranks(_megatron_uneven_body, batches, tmp_path), want, atol=1e-6)


APEX_STUB = r'''
import sys, types
for name in ("apex", "apex.normalization", "apex.normalization.fused_layer_norm", "apex.contrib", "apex.contrib.layer_norm",
             "apex.contrib.layer_norm.layer_norm"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["apex.normalization.fused_layer_norm"].FusedLayerNormAffineFunction = object
sys.modules["apex.contrib.layer_norm.layer_norm"].FastLayerNormFN = object
'''


@pytest.mark.parametrize("apex", [False, True], ids=["no-apex", "apex-importable"])
def test_build_gpt_uses_rmsnorm_with_or_without_apex(apex):
    "Where apex imports (NGC containers) megatron-core picks FusedLayerNorm, which asserts LayerNorm: the build must ask for RMSNorm."
    code = (APEX_STUB if apex else "") + r'''
import os, warnings; warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM
from scope_nb.core.dialogue import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state; parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.gpt import gpt_layer_specs
from scope_nb.scale.megatron import hf_to_megatron
from scope_nb.scale.megatron_train import build_gpt
cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
m = build_gpt(cfg, 1)
md = hf_to_megatron(LlamaForCausalLM(cfg).state_dict(), cfg)
missing, unexpected = m.load_state_dict(md, strict=False)
assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
norms = {type(x).__name__ for n, x in m.named_modules() if n.endswith("layernorm")}
print(gpt_layer_specs.HAVE_APEX, sorted(norms))
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    have, norms = r.stdout.split(maxsplit=1)
    assert have == str(apex) and "FusedLayerNorm" not in norms and "RMSNorm" in norms, r.stdout
