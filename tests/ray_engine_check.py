"""Run inside a loopback-only network namespace (tests/test_ray.py): a lab run whose 2 Ray rollout workers generate on two
SGLang stand-ins (tests/fake_sglang.py, a real tiny model behind SGLang's endpoints); writes what the engines saw to argv[1]."""
import copy, json, sys, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
import torch
from fake_sglang import FakeSGLang
from scope_nb.config import Config, from_dict, validate
from scope_nb.files import read_jsonl
from scope_nb.experiments import experiment_dicts
from scope_nb.lab import lab_agent
from scope_nb.ray_backend import RayBackend
from scope_nb.run import train
from scope_nb.training import token_logprobs

torch.set_num_threads(1)
out = Path(sys.argv[1])
d = experiment_dicts("collapse-lab", "lab", (0,), str(out), ["rl-single"], steps=4)[0]
d["eval"]["every"] = 2; d["checkpoint"]["every"], d["checkpoint"]["keep"] = 1, 5
cfg = validate(from_dict(Config, d))
base = lab_agent(seed=0, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)
base.model.save_pretrained(out / "engine_start")   # the folder the engines were started from (their /model_info path)
fakes = [FakeSGLang(copy.deepcopy(base.model), base.pad_id, seed=i, model_path=str(out / "engine_start")) for i in range(2)]
import scope_nb.training as training   # the driver's own policy must never generate: count its local sampling calls
driver_samples, _sample = [], training.sample_batch
training.sample_batch = lambda *a, **k: driver_samples.append(1) or _sample(*a, **k)
backend = RayBackend(cfg, workers=2, num_cpus=2, engine_urls=[f.url for f in fakes], colocate=True)
try: train(cfg, progress=False, backend=backend)
finally: backend.close()
# the step-4 rollouts were sampled by the engines after they loaded the step-3 weights: the trainer's step-3
# checkpoint must reproduce their sampling logprobs exactly
from transformers import AutoModelForCausalLM
m3 = AutoModelForCausalLM.from_pretrained(cfg.run_dir / "checkpoints" / "step_000003" / "agent")
gap = 0.0
for e in read_jsonl(cfg.run_dir / "trajectories" / "step_000004.jsonl"):
    t = e.trajectories["agent"]
    with torch.no_grad(): lp, _, _ = token_logprobs(m3, [t.token_ids], 1.0, base.pad_id, with_entropy=False)
    gap = max(gap, max(abs(float(lp[0][j]) - t.logprobs[j]) for j, mk in enumerate(t.loss_mask) if mk))
# the evaluation episodes each engine played: worker w gets the tasks [n*w//2, n*(w+1)//2) of every panel entry and
# asks its engine once per agent round, so it sends max(agent turns) requests for its share
eval_rounds = [0, 0]
for f in sorted((cfg.run_dir / "eval").glob("step_*/*.jsonl")):
    eps, n = read_jsonl(f), cfg.eval.tasks
    for w in range(2):
        mine = [e for e in eps if n * w // 2 <= int(e.group.split("#")[1].split(":")[0]) < n * (w + 1) // 2]
        eval_rounds[w] += max(e.info["agent_turns"] for e in mine)
res = {"gap_step4_vs_step3_weights": gap, "driver_samples": len(driver_samples), "eval_rounds": eval_rounds,
       "eval_files": len(list((cfg.run_dir / "eval").glob("step_*/*.jsonl"))),
       "paths": [[p for p, _ in f.requests] for f in fakes],
       "update_paths": [[b["model_path"] for p, b in f.requests if p == "/update_weights_from_disk"] for f in fakes],
       "calls": [[p for p, _ in f.requests if p != "/generate"] for f in fakes]}
for f in fakes: f.close()
json.dump(res, open(out / "engines.json", "w"))
print("done")
