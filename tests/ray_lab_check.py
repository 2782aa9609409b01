"""Run inside a loopback-only network namespace (tests/test_ray.py): a lab run single-process and on a local Ray cluster
with 2 rollout workers and a trainer actor; writes both runs' metric rows (without timings) as JSON to argv[1]."""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from scope_nb.config import Config, from_dict, to_dict, validate
from scope_nb.experiments import experiment_dicts
from scope_nb.ray_backend import RayBackend
from scope_nb.report import load_run
from scope_nb.run import train

torch.set_num_threads(1)
out = sys.argv[1]
rows = {}
for name in ("single", "ray"):
    d = experiment_dicts("collapse-lab", "lab", (0,), f"{out}/{name}", ["rl-single"], steps=6)[0]
    d["agent"]["seeding"] = "episode"; d["eval"]["every"] = 3; d["checkpoint"]["every"] = 3
    cfg = validate(from_dict(Config, d))
    backend = RayBackend(cfg, workers=2, num_cpus=2) if name == "ray" else None
    try: train(cfg, progress=False, backend=backend)
    finally:
        if backend: backend.close()
    rows[name] = [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in load_run(cfg.run_dir).rows]
json.dump(rows, open(f"{out}/rows.json", "w"))
print("done")
