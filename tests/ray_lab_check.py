"""Run inside a loopback-only network namespace (tests/integration/test_ray.py): runs single-process and on a local Ray cluster;
writes each run's metric rows (without timings) as JSON to argv[1]/rows.json (argv[2]: optional comma-separated subset).

- single / ray: lab RL (Single), 2 rollout workers and a one-rank torch trainer;
- cot-single / cot-fsdp / cot-megatron: lab Co-Training (agent and simulator both trained), 2 rollout workers and one
  2-rank trainer group per policy (FSDP2 or megatron-core tensor parallelism over gloo), each in its placement group;
- pop-single / pop-ray: lab Population Co-Training (a checkpoint pool the workers read from the run folder);
- sp-single / sp-ray: self-play on the echo task (user.model = "same": one policy trained on both roles)."""
import json, sys, time, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
import torch
from scope_nb.train.config import Config, from_dict, load_config, validate
from scope_nb.experiments.registry import experiment_dicts
from scope_nb.scale.ray_backend import RayBackend
from scope_nb.experiments.report import load_run
from scope_nb.train.run import train

torch.set_num_threads(1)
out = sys.argv[1]
only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
HERE_ROOT = Path(__file__).resolve().parents[1]
RUNS = {"single": ("rl-single", None), "ray": ("rl-single", ("torch", 1)),
        "cot-single": ("co-training", None), "cot-fsdp": ("co-training", ("fsdp", 2)), "cot-megatron": ("co-training", ("megatron", 2)),
        "pop-single": ("population", None), "pop-ray": ("population", ("torch", 1)),
        "sp-single": ("self-play", None), "sp-ray": ("self-play", ("torch", 1))}


def config(name, arm):
    if arm == "self-play":
        return load_config(HERE_ROOT / "configs" / "echo_tiny.toml", [
            "user.model=same", "user.train=true", "user.temperature=1.0", "run.steps=4", f"run.out_dir={out}", f"run.name={name}",
            "agent.seeding=episode", "eval.every=2", "checkpoint.every=2"])
    d = experiment_dicts("collapse-lab", "lab", (0,), f"{out}/{name}", [arm], steps=4)[0]
    d["agent"]["seeding"] = "episode"; d["user"]["seeding"] = "episode"; d["eval"]["every"] = 2; d["checkpoint"]["every"] = 2
    d["grpo"]["train_only"] = []   # every weight: the split trainers (FSDP2, megatron) shard and train all of them
    d["eval"]["variance_split"] = dict(every=0)   # Eq. 6's split plays on the driver's policy: not under Ray, so off in both
    return validate(from_dict(Config, d))


# cot-fsdp pins its trainer ranks as `scope launch` would (agent on GPUs 0-1, simulator on 2-3); each rank reports the
# CUDA_VISIBLE_DEVICES it runs with, after its whole run (Ray sets it only when it creates the actor)
PINS = {"cot-fsdp": {"agent": [0, 1], "user": [2, 3]}}
if not only or any(RUNS[n][1] for n in only):   # one local cluster for every Ray run (each backend leaves it up)
    import ray as _ray
    t0 = time.perf_counter()
    _ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"ray.init: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
rows, visible = {}, {}
for name, (arm, ray) in RUNS.items():
    if only and name not in only: continue
    t0 = time.perf_counter()
    cfg = config(name, arm)
    backend = RayBackend(cfg, workers=2, num_cpus=4, trainer=ray[0], trainer_world=ray[1], trainer_gpus=PINS.get(name)) if ray else None
    try:
        train(cfg, progress=False, backend=backend)
        if backend:
            import ray as _ray
            visible[name] = _ray.get([a.visible_devices.remote() for a in backend.trainers])
    finally:
        if backend: backend.close()
    print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    rows[name] = [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in load_run(cfg.run_dir).rows]
json.dump(rows, open(f"{out}/rows.json", "w"))
json.dump(visible, open(f"{out}/visible.json", "w"))
print("done")
