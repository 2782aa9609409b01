"""GPU device check, in parts, each ending with one `PASS <part>`, `FAIL <part>: why` or `SKIP <part>: why` line:

  versions   driver, CUDA, NCCL, torch, transformers, sglang, megatron-core, apex, ray
  grpo       GRPO steps of the torch backend (bf16 compute, float32 master weights) on a randomly initialised model of
             realistic shape: generation and training tokens/s, peak memory
  fsdp       one FSDPTrainer step on a 1-rank NCCL group (gloo on a CPU), collectives on the group's device
  megatron   megatron-core vs transformers with dropout off, every converted key checked on load (logprob gap), then one MegatronTrainer
             step on a 1-rank NCCL group
  sglang     an SGLang server on the same model (started here, or --sglang-url): token ids in, ids and logprobs out;
             the engine-trainer logprob gap; weights updated from disk change the greedy output; release + resume
             without a CPU backup, then the reload, give the weights back

Needs PyTorch and transformers; megatron-core and sglang parts are skipped when they are not installed. A part that
runs past the shell script's limit is named in a `FAIL <part>: timed out` line.
    python launch/device_check.py                          # Qwen3-0.6B-sized config on cuda:0
    python launch/device_check.py --tiny --device cpu      # seconds: the same code paths on a CPU (sglang: --sglang-url)
"""
import argparse, contextlib, copy, json, os, signal, subprocess, sys, tempfile, time, traceback
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True)
PARTS = ("versions", "grpo", "fsdp", "megatron", "sglang")
CURRENT = {"part": None}
RESULTS = []


class Skip(Exception):
    pass


def _on_term(signum, frame):
    print(f"FAIL {CURRENT['part']}: timed out (signal {signum})", flush=True)
    os._exit(124)


def part(name, fn, *args):
    "Run one part; print its PASS/FAIL/SKIP line; never let one part stop the others."
    CURRENT["part"] = name
    t0 = time.perf_counter()
    try:
        note = fn(*args)
        line = f"PASS {name}" + (f": {note}" if note else "")
    except Skip as e:
        line = f"SKIP {name}: {e}"
    except Exception as e:
        traceback.print_exc()
        line = f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}"
    RESULTS.append(line)
    print(f"{line} ({time.perf_counter() - t0:.1f}s)", flush=True)


def build(a):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**(TINY if a.tiny else QWEN3_06B))
    torch.manual_seed(0)
    return cfg, Qwen3ForCausalLM(cfg).eval()


def versions():
    from scope_nb.scale.launch import stack_versions
    for line in stack_versions(): print(line)


def _items(cfg, model, a, g):
    "(trajectory, advantage) pairs from prompts sampled on `model`."
    from scope_nb.core.episodes import RoleTrajectory
    from scope_nb.core.policy import sample_batch
    prompts = [torch.randint(1, cfg.vocab_size, (a.prompt,), generator=g).tolist() for _ in range(a.batch)]
    t0 = time.perf_counter()
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=model.device.type == "cuda"):
        samples = sample_batch(model, prompts, a.new, 1.0, [cfg.vocab_size - 1], 0, g)
    t_gen = time.perf_counter() - t0
    rewards = torch.rand(a.batch, generator=g)
    adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-8)).tolist()
    items = [(RoleTrajectory("agent", p + s.ids, [0] * len(p) + [1] * len(s.ids), [0.0] * len(p) + s.logprobs, float(r)), a_)
             for p, s, r, a_ in zip(prompts, samples, rewards.tolist(), adv)]
    return items, sum(len(s.ids) for s in samples) / t_gen


def grpo(cfg, model, dev, a):
    from types import SimpleNamespace
    from scope_nb.train.grpo import GRPOConfig, GRPOTrainer
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    m = copy.deepcopy(model).to(dev)
    tr = GRPOTrainer(SimpleNamespace(model=m, pad_id=0), GRPOConfig(lr=1e-6, kl_coef=0.005, micro_batch=4, mixed_precision="bf16"))
    g = torch.Generator().manual_seed(0)
    for step in range(1, a.steps + 1):
        items, gen_tps = _items(cfg, m, a, g)
        sync(); t0 = time.perf_counter()
        st = tr.step(items)
        sync(); t_train = time.perf_counter() - t0
        row = dict(step=step, gen_tokens_per_s=gen_tps, train_tokens_per_s=sum(len(t.token_ids) for t, _ in items) / t_train,
                   loss=st["loss"], kl=st["kl"], grad_norm=st["grad_norm"],
                   peak_mem_gb=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        if not (st["grad_norm"] > 0 and row["gen_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0):
            raise RuntimeError(f"step {step}: no gradient or no tokens ({row})")
    if any(p.dtype != torch.float32 for p in m.parameters()): raise RuntimeError("master weights are not float32")


@contextlib.contextmanager
def one_rank_group(dev):
    import torch.distributed as dist
    from scope_nb.core.dialogue import free_port
    from scope_nb.scale.fsdp import init_local_group
    if dev.type == "cuda": torch.cuda.set_device(dev)
    init_local_group(0, 1, free_port(), "nccl" if dev.type == "cuda" else "gloo")
    try: yield
    finally: dist.destroy_process_group()


def fsdp(cfg, model, dev, a):
    from types import SimpleNamespace
    from scope_nb.scale.fsdp import FSDPTrainer, group_device
    from scope_nb.train.grpo import GRPOConfig
    items, _ = _items(cfg, model, a, torch.Generator().manual_seed(1))
    with one_rank_group(dev):
        m = copy.deepcopy(model).to(dev)
        tr = FSDPTrainer(SimpleNamespace(model=m, pad_id=0), GRPOConfig(lr=1e-6, kl_coef=0.005, micro_batch=4, mixed_precision="bf16"))
        st = tr.step(items[:3])   # an item count that does not fill the micro-batches evenly
        if not st["grad_norm"] > 0: raise RuntimeError(f"no gradient: {st}")
        return f"group device {group_device()}, loss {st['loss']:.4f}, grad_norm {st['grad_norm']:.3f}"


def megatron(cfg, model, dev, a):
    try: import megatron.core  # noqa: F401
    except ImportError: raise Skip("megatron-core is not installed")
    from types import SimpleNamespace
    from scope_nb.train.grpo import GRPOConfig
    from scope_nb.scale.megatron_train import MegatronTrainer
    from scope_nb.core.policy import token_logprobs
    items, _ = _items(cfg, model, a, torch.Generator().manual_seed(2))
    with one_rank_group(dev):
        m = copy.deepcopy(model).to(dev)   # float32: the comparison is of the conversion, not of bf16 rounding
        tr = MegatronTrainer(SimpleNamespace(model=m, pad_id=0), GRPOConfig(lr=1e-6, kl_coef=0.005, micro_batch=4))
        seqs = [t.token_ids for t, _ in items[:2]]
        with torch.no_grad():
            lp_mg, _, _ = tr._logprobs(tr.model, seqs, with_entropy=False)
            lp_hf, _, _ = token_logprobs(m, seqs, 1.0, 0, with_entropy=False)
        gap = float((lp_mg - lp_hf)[:, 1:].abs().max())
        st = tr.step(items[:3])
        if not (gap < 1e-3 and st["grad_norm"] > 0):
            raise RuntimeError(f"logprob gap megatron vs transformers {gap:.2e} (want < 1e-3), grad_norm {st['grad_norm']}")
        hf = next(m.parameters()).device
        if hf.type != "cpu": raise RuntimeError(f"the trainer's full HF copy is on {hf}, want cpu (only TP slices on the GPU)")
        return (f"logprob gap vs transformers {gap:.2e} (float32, dropout 0, converted weights with every key checked), "
                f"grad_norm {st['grad_norm']:.3f}, HF copy on cpu")


def sglang(cfg, model, dev, a, folder):
    from scope_nb.scale.sglang_client import SGLangEngine
    from scope_nb.core.policy import token_logprobs
    proc = None
    model.save_pretrained(folder / "start")
    url = a.sglang_url
    if not url:
        try: import sglang  # noqa: F401
        except ImportError: raise Skip("sglang is not installed (pip install 'scope_nb[gpu]')")
        if dev.type != "cuda": raise Skip("SGLang needs CUDA")
        from scope_nb.core.dialogue import free_port
        port = free_port()
        log = open(folder / "sglang.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(folder / "start"),
                                 "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
                                 "--mem-fraction-static", "0.3", "--enable-memory-saver"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
    try:
        eng = SGLangEngine(url)
        t0 = time.perf_counter()
        eng.wait_ready(timeout=240, every=2)
        print(f"sglang: ready in {time.perf_counter() - t0:.0f}s at {url}", flush=True)
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(1, cfg.vocab_size, (32,), generator=g).tolist() for _ in range(8)]
        out = eng.generate(prompts, 16, 1.0, [cfg.vocab_size - 1])
        ref = model.to("cpu").float()

        def gap(samples, m):
            seqs = [p + s.ids for p, s in zip(prompts, samples)]
            with torch.no_grad(): lp, _, _ = token_logprobs(m, seqs, 1.0, 0, with_entropy=False)
            return max(float((lp[i, len(p):len(p) + len(s.ids)] - torch.tensor(s.logprobs)).abs().max())
                       for i, (p, s) in enumerate(zip(prompts, samples)))
        g0 = gap(out, ref)
        print(f"sglang: engine-trainer logprob gap {g0:.3e} over {sum(len(s.ids) for s in out)} tokens", flush=True)
        greedy = lambda: [s.ids for s in eng.generate(prompts[:2], 16, 0.0, [cfg.vocab_size - 1])]
        before = greedy()
        moved = copy.deepcopy(ref)
        with torch.no_grad():
            for p in moved.parameters(): p.add_(0.05 * torch.randn_like(p))
        moved.save_pretrained(folder / "moved")
        eng.update_weights_from_disk(folder / "moved")
        after = greedy()
        eng.update_weights_from_disk(folder / "start")
        back = greedy()
        eng.release_memory(); eng.resume_memory()   # with --enable-memory-saver the reload gives the weights back
        resumed = greedy()
        g1 = gap(eng.generate(prompts, 16, 1.0, [cfg.vocab_size - 1]), ref)
        problems = [w for w, bad in (("the update did not change the greedy output", after == before),
                                     ("the original weights did not come back", back != before),
                                     ("the weights did not survive release/resume + reload", resumed != before),
                                     (f"logprob gap {g0:.2e} / {g1:.2e} after resume (want < 0.5)", not (g0 < 0.5 and g1 < 0.5)))
                    if bad]
        if problems: raise RuntimeError("; ".join(problems))
        return f"gap {g0:.2e} (after release/resume {g1:.2e}); update, restore and resume checked"
    finally:
        if proc is not None:
            proc.terminate()
            try: proc.wait(30)
            except subprocess.TimeoutExpired: proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda"); ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=16); ap.add_argument("--prompt", type=int, default=256); ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--sglang-url", default="", help="use this running SGLang server (its model: this script's, saved by it) instead of starting one")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available(): sys.exit("device_check: CUDA is not available; pass --device cpu --tiny for a smoke run")
        print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
        torch.cuda.reset_peak_memory_stats(dev)
    wanted = [p for p in a.parts.split(",") if p]
    if set(wanted) - set(PARTS): sys.exit(f"device_check: --parts: unknown {sorted(set(wanted) - set(PARTS))}; use {','.join(PARTS)}")
    cfg, model = build(a)
    print(f"model: Qwen3 config, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    with tempfile.TemporaryDirectory() as d:
        from pathlib import Path
        calls = {"versions": (versions,), "grpo": (grpo, cfg, model, dev, a), "fsdp": (fsdp, cfg, model, dev, a),
                 "megatron": (megatron, cfg, model, dev, a), "sglang": (sglang, cfg, model, dev, a, Path(d))}
        for name in wanted: part(name, *calls[name])
    print("device_check summary: " + "; ".join(RESULTS))
    sys.exit(1 if any(r.startswith("FAIL") for r in RESULTS) else 0)


if __name__ == "__main__":
    main()
