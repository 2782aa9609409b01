"""HF -> Megatron -> HF conversion is exact for tiny Llama / Qwen2 / Qwen3 configs, the converted weights load strictly into
real megatron-core GPTModels built on the CPU, and the derived TransformerConfig matches the HF config's fields."""
import os, warnings
import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from scope_nb.fsdp import free_port
from scope_nb.megatron import gpt_model_kwargs, hf_to_megatron, megatron_config_kwargs, megatron_to_hf

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
