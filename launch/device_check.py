"""GPU device check: GRPO steps of scope_nb's torch backend in bf16 on a randomly initialised model of realistic shape.

Needs only PyTorch and transformers (plus numpy); no SGLang, no Ray, no internet. Prints generation and training
tokens/s and peak memory, then a megatron-core forward/backward of the same shape if megatron-core is installed.
    python launch/device_check.py                   # Qwen3-0.6B-sized config on cuda:0
    python launch/device_check.py --tiny --device cpu   # a seconds-long smoke run of the same code path
"""
import argparse, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda"); ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=16); ap.add_argument("--prompt", type=int, default=256); ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    from types import SimpleNamespace
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from scope_nb.core import RoleTrajectory
    from scope_nb.grpo import GRPOConfig, GRPOTrainer
    from scope_nb.training import sample_batch
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available(): sys.exit("device_check: CUDA is not available; pass --device cpu --tiny for a smoke run")
        print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
        torch.cuda.reset_peak_memory_stats(dev)
    cfg = Qwen3Config(**(TINY if a.tiny else QWEN3_06B))
    dtype = torch.bfloat16
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = Qwen3ForCausalLM(cfg).to(device=dev, dtype=dtype).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen3 config, {n_params / 1e6:.1f}M parameters, bf16, built in {time.perf_counter() - t0:.1f}s")
    pol = SimpleNamespace(model=model, pad_id=0)
    tr = GRPOTrainer(pol, GRPOConfig(lr=1e-6, kl_coef=0.005, micro_batch=4), temperature=1.0)
    g = torch.Generator().manual_seed(0)
    report = {}
    for step in range(1, a.steps + 1):
        prompts = [torch.randint(1, cfg.vocab_size, (a.prompt,), generator=g).tolist() for _ in range(a.batch)]
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        sync(); t0 = time.perf_counter()
        samples = sample_batch(model, prompts, a.new, 1.0, [cfg.vocab_size - 1], 0, g)
        sync(); t_gen = time.perf_counter() - t0
        n_gen = sum(len(s.ids) for s in samples)
        rewards = torch.rand(a.batch, generator=g)
        adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-8)).tolist()
        items = [(RoleTrajectory("agent", p + s.ids, [0] * len(p) + [1] * len(s.ids), [0.0] * len(p) + s.logprobs, float(r)), a_)
                 for p, s, r, a_ in zip(prompts, samples, rewards.tolist(), adv)]
        sync(); t0 = time.perf_counter()
        st = tr.step(items)
        sync(); t_train = time.perf_counter() - t0
        n_train = sum(len(t.token_ids) for t, _ in items)
        report = dict(step=step, gen_tokens_per_s=n_gen / t_gen, train_tokens_per_s=n_train / t_train, loss=st["loss"], kl=st["kl"],
                      grad_norm=st["grad_norm"], peak_mem_gb=(torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None))
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in report.items()}), flush=True)
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        print("megatron-core: not installed, skipped"); return
    if dev.type != "cuda": print("megatron-core: forward needs CUDA, skipped"); return
    megatron_check(cfg, model, dev)


def megatron_check(cfg, hf_model, dev):
    "Forward/backward of a megatron-core GPTModel holding the converted weights; compares logits with transformers."
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig
    from scope_nb.core import free_port
    from scope_nb.megatron import gpt_model_kwargs, hf_to_megatron, megatron_config_kwargs
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    tc = TransformerConfig(**megatron_config_kwargs(cfg), bf16=True, params_dtype=torch.bfloat16)
    gpt = GPTModel(config=tc, transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=True), **gpt_model_kwargs(cfg)).to(dev)
    sd = {k: v.to(dev) for k, v in hf_to_megatron(hf_model.state_dict(), cfg).items()}
    gpt.load_state_dict(sd, strict=False)
    ids = torch.randint(1, cfg.vocab_size, (2, 128), device=dev)
    pos = torch.arange(128, device=dev)[None].expand(2, -1)
    t0 = time.perf_counter()
    logits = gpt(ids, pos, attention_mask=None)
    logits.float().logsumexp(-1).mean().backward()
    torch.cuda.synchronize()
    with torch.no_grad(): ref = hf_model(input_ids=ids).logits
    diff = (logits.float() - ref.float()).abs().max().item()
    print(json.dumps({"megatron_fwd_bwd_s": round(time.perf_counter() - t0, 3), "max_logit_diff_vs_transformers": round(diff, 4)}))
    parallel_state.destroy_model_parallel(); dist.destroy_process_group()


if __name__ == "__main__":
    main()
