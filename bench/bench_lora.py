"""LoRA adapters vs full weights on one vLLM server (SmolLM2-135M, float32, CPU build), side by side in one run.

    .venv/bin/python bench/bench_lora.py [--parts pool,cotrain] [--k 5] [--steps 3]

pool: a population pool of K simulator checkpoints played on one server, drawn in turn twice: K LoRA adapters (rank
      8, attention projections) loaded once each and then generated from by name, against K full checkpoints reloaded
      in place at every draw (`update_weights_from_disk`, prefix cache reset). Reported apart: the seconds to make an
      entry servable, the seconds of one 16-token generation with it, the bytes of an entry on disk.
cotrain: Co-Training of SmolLM2 against itself on the smoke config (`configs/smoke_smollm2.toml`, both roles trained,
      both on vLLM) for --steps steps, full weights (two servers, two KL reference copies, AdamW over every weight)
      against LoRA (one server, two adapters, the base as reference). Per arm: the run's median step time after the
      first step and the peak resident memory of its own process (subprocess, so arms do not share memory), plus the
      resident memory of its vLLM servers at the end.

Absolute times drift with the machine's load; the ratios are the result. Last line: the headline ratios.
"""
import argparse, copy, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_rss(pid: int) -> int:
    "Resident bytes of a process and all its descendants (vLLM's API server, engine core and worker)."
    import psutil
    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def timed(f) -> float:
    "Seconds that calling `f` takes."
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def part_pool(k: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from scope_nb.core.models import load_causal_lm
    from scope_nb.users.vllm_engine import VLLMEngine, VLLMServer, save_untied
    lm = load_causal_lm("smollm2")
    prompt = lm.tokenizer("Would you donate to a children's charity?")["input_ids"]
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        full, adapters = [], []
        for i in range(k):  # K different simulators: perturbed full copies, and adapters with B != 0
            g = torch.Generator().manual_seed(i)
            m = copy.deepcopy(lm.model)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    if "mlp" in n:
                        p.add_(torch.randn(p.shape, generator=g) * 0.01)
            full.append(save_untied(m, d / f"full_{i}"))
            a = get_peft_model(copy.deepcopy(lm.model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
            with torch.no_grad():
                for n, p in a.named_parameters():
                    if "lora_B" in n:
                        p.add_(torch.randn(p.shape, generator=g) * 0.01)
            a.save_pretrained(d / f"lora_{i}")
            adapters.append(d / f"lora_{i}")
        srv = VLLMServer("smollm2", lora_rank=8, max_loras=k, log_path=d / "server.log").start()
        try:
            eng = VLLMEngine(srv.url, srv.name)
            eng.generate([prompt], 8, 1.0, [2])  # warm-up
            swap_full, swap_lora, gen_full, gen_lora = [], [], [], []
            for rnd in range(2):  # two rounds over the pool: adapters are loaded in the first, named in the second
                for i in range(k):
                    swap_full.append(timed(lambda: eng.update_weights_from_disk(full[i])))
                    gen_full.append(timed(lambda: eng.generate([prompt], 16, 1.0, [2])))
                eng.update_weights_from_disk(lm.path)  # back to the base for the adapters
                for i in range(k):
                    swap_lora.append(timed(lambda: eng.load_adapter(f"pool{i}", adapters[i])) if rnd == 0 else 0.0)
                    gen_lora.append(timed(lambda: eng.generate([prompt], 16, 1.0, [2], adapter=f"pool{i}")))
            rss = tree_rss(srv.proc.pid)
        finally:
            srv.stop()
        disk_full = statistics.mean(folder_bytes(p) for p in full)
        disk_lora = statistics.mean(folder_bytes(p) for p in adapters)
    return dict(k=k, swap_full=statistics.median(swap_full), load_lora=statistics.median(swap_lora[:k]),
                gen_full=statistics.median(gen_full), gen_lora=statistics.median(gen_lora), disk_full=disk_full,
                disk_lora=disk_lora, server_rss=rss)


ARM = r'''
import json, resource, statistics, sys
from scope_nb.train.config import load_config
from scope_nb.train.run import read_metrics, train
from scope_nb.users.modes import Servers
sys.path.insert(0, sys.argv[3])
from bench_lora import tree_rss
rss, close = {}, Servers.close
def spy(self):
    rss.update({k: tree_rss(s.proc.pid) for k, s in self.servers.items() if getattr(s, "proc", None)})
    close(self)
Servers.close = spy
sets = json.loads(sys.argv[2])
run = train(load_config(sys.argv[1], sets), progress=False)
rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 1]
step = statistics.median(r["time/step"] - (r.get("time/eval") or 0.0) for r in rows)
print(json.dumps(dict(step=step, rollout=statistics.median(r["time/rollout"] for r in rows),
                      train=statistics.median(r["time/train"] for r in rows), servers=len(rss),
                      server_rss=sum(rss.values()), peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
'''


def part_cotrain(steps: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as d:
        base = [f"run.out_dir='{d}'", f"run.steps={steps}", "eval.every=10000", "checkpoint.every=10000",
                "agent.engine='vllm'", "user.train=true", "user.engine='vllm'", "grpo.lr=1e-4"]
        lora = ["agent.lora.rank=8", "agent.lora.alpha=16", "user.lora.rank=8", "user.lora.alpha=16"]
        for arm, sets in (("full", base + ["run.name='full'"]), ("lora", base + lora + ["run.name='lora'"])):
            r = subprocess.run([sys.executable, "-c", ARM, str(ROOT / "configs" / "smoke_smollm2.toml"), json.dumps(sets),
                                str(ROOT / "bench")], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"cotrain {arm} failed:\n{r.stderr[-3000:]}")
            out[arm] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="pool,cotrain")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    parts, head = a.parts.split(","), []
    MB = 2**20
    if "pool" in parts:
        p = part_pool(a.k)
        print(f"pool, K = {p['k']} on one server, two rounds of draws: making an entry servable, full checkpoint reloaded "
              f"at every draw {p['swap_full']:.2f} s vs adapter loaded once {p['load_lora']:.2f} s (then 0: drawn by "
              f"name); 16 sampled tokens with the full entry {p['gen_full']:.2f} s vs with the adapter "
              f"{p['gen_lora']:.2f} s; on disk per entry {p['disk_full'] / MB:.0f} MB vs {p['disk_lora'] / MB:.1f} MB; "
              f"server RSS holding {p['k']} adapters {p['server_rss'] / MB:.0f} MB")
        head.append(f"pool: reload/adapter-load {p['swap_full'] / p['load_lora']:.1f}x, generation with adapter/full "
                    f"{p['gen_lora'] / p['gen_full']:.2f}x, disk {p['disk_full'] / p['disk_lora']:.0f}x")
    if "cotrain" in parts:
        c = part_cotrain(a.steps)
        for arm, r in c.items():
            print(f"co-training {arm}: step {r['step']:.1f} s (rollout {r['rollout']:.1f}, update {r['train']:.1f}); "
                  f"trainer process peak RSS {r['peak_rss'] / MB:.0f} MB; {r['servers']} vLLM server(s), "
                  f"{r['server_rss'] / MB:.0f} MB")
        f, l = c["full"], c["lora"]
        head.append(f"co-training full/LoRA: step {f['step'] / l['step']:.2f}x, trainer memory "
                    f"{f['peak_rss'] / l['peak_rss']:.2f}x, engine memory {f['server_rss'] / l['server_rss']:.2f}x")
    print("; ".join(head))
