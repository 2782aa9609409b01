"""Run inside a loopback-only network namespace (tests/test_ray.py): lab runs single-process and on a local Ray cluster;
writes each run's metric rows (without timings) as JSON to argv[1]/rows.json.

- single / ray: RL (Single), 2 rollout workers and a one-rank torch trainer;
- cot-single / cot-fsdp / cot-megatron: Co-Training (agent and simulator both trained), 2 rollout workers and one
  2-rank trainer group per policy (FSDP2 or megatron-core tensor parallelism over gloo), each in its placement group."""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from scope_nb.config import Config, from_dict, validate
from scope_nb.experiments import experiment_dicts
from scope_nb.ray_backend import RayBackend
from scope_nb.report import load_run
from scope_nb.run import train

torch.set_num_threads(1)
out = sys.argv[1]
only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
RUNS = {"single": ("rl-single", None), "ray": ("rl-single", ("torch", 1)),
        "cot-single": ("co-training", None), "cot-fsdp": ("co-training", ("fsdp", 2)), "cot-megatron": ("co-training", ("megatron", 2))}
rows = {}
for name, (arm, ray) in RUNS.items():
    if only and name not in only: continue
    d = experiment_dicts("collapse-lab", "lab", (0,), f"{out}/{name}", [arm], steps=6)[0]
    d["agent"]["seeding"] = "episode"; d["user"]["seeding"] = "episode"; d["eval"]["every"] = 3; d["checkpoint"]["every"] = 3
    cfg = validate(from_dict(Config, d))
    backend = RayBackend(cfg, workers=2, num_cpus=4, trainer=ray[0], trainer_world=ray[1]) if ray else None
    try: train(cfg, progress=False, backend=backend)
    finally:
        if backend: backend.close()
    rows[name] = [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in load_run(cfg.run_dir).rows]
json.dump(rows, open(f"{out}/rows.json", "w"))
print("done")
