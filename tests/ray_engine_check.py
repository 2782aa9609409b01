"""Run inside a loopback-only network namespace (tests/integration/test_ray.py): a lab run whose 2 Ray rollout workers generate on two
SGLang stand-ins (tests/fake_sglang.py, a real tiny model behind SGLang's endpoints); writes what the engines saw to argv[1]."""
import copy, json, sys, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
import torch
from fake_sglang import FakeSGLang
from scope_nb.cli.commands import main
from scope_nb.train.config import Config, from_dict, to_toml, validate
from scope_nb.core.files import read_jsonl
from scope_nb.experiments.registry import experiment_dicts
from scope_nb.envs.lab import lab_agent
from scope_nb.core.policy import token_logprobs

torch.set_num_threads(1)
out = Path(sys.argv[1])
d = experiment_dicts("collapse-lab", "lab", (0,), str(out), ["rl-single"], steps=4)[0]
d["eval"]["every"] = 2; d["checkpoint"]["every"], d["checkpoint"]["keep"] = 3, 5   # checkpoints at steps 3 and 4
d["eval"]["variance_split"] = dict(every=0)   # the lab measures Eq. 6's split on the driver's policy: not under Ray
cfg = validate(from_dict(Config, d))
base = lab_agent(seed=0, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)
base.model.save_pretrained(out / "engine_start")   # the folder the engines were started from (their /model_info path)
fakes = [FakeSGLang(copy.deepcopy(base.model), base.pad_id, seed=i, model_path=str(out / "engine_start")) for i in range(2)]
import scope_nb.core.policy as training   # the driver's own policy must never generate: count its local sampling calls
driver_samples, _sample = [], training.sample_batch
training.sample_batch = lambda *a, **k: driver_samples.append(1) or _sample(*a, **k)
import scope_nb.scale.ray_backend as rb   # what the driver writes and what it fetches from the trainer group
driver_writes, fetches, _write, _sync = [], [], rb.write_weights, rb.RemoteTrainer.sync
rb.write_weights = lambda *a, **k: driver_writes.append(str(a[0])) or _write(*a, **k)
rb.RemoteTrainer.sync = lambda self: (fetches.append(self.stale), _sync(self))[1]
(out / "cfg.toml").write_text(to_toml(d))
def run(resume=False):
    "`scope train --backend ray` through the CLI's own entry point (in this process, so the counters above see it)."
    argv = ["train", str(out / "cfg.toml"), "--backend", "ray", "--workers", "2", "--colocate", "--no-progress",
            "--engine-urls", ",".join(f.url for f in fakes)]
    if resume:   # from the run folder alone: its config.toml recorded the [backend] the flags gave
        argv = ["train", str(cfg.run_dir / "config.toml"), "--resume", "--no-progress"]
    assert main(argv) == 0, argv
run()
from transformers import AutoModelForCausalLM
def gap_step4_vs_step3():
    "The step-4 rollouts were sampled by the engines after they loaded the step-3 weights: the trainer's step-3 "
    "checkpoint must reproduce their sampling logprobs exactly."
    m3, gap = AutoModelForCausalLM.from_pretrained(cfg.run_dir / "checkpoints" / "step_000003" / "agent"), 0.0
    for e in read_jsonl(cfg.run_dir / "trajectories" / "step_000004.jsonl"):
        t = e.trajectories["agent"]
        with torch.no_grad(): lp, _, _ = token_logprobs(m3, [t.token_ids], 1.0, base.pad_id, with_entropy=False)
        gap = max(gap, max(abs(float(lp[0][j]) - t.logprobs[j]) for j, mk in enumerate(t.loss_mask) if mk))
    return gap
def seen(reqs):
    "What one engine saw: every path, the folders it loaded, the calls other than /generate."
    return {"paths": [p for p, _ in reqs], "update_paths": [b["model_path"] for p, b in reqs if p == "/update_weights_from_disk"],
            "calls": [p for p, _ in reqs if p != "/generate"]}
# the evaluation episodes each engine played: worker w gets the tasks [n*w//2, n*(w+1)//2) of every panel entry and
# asks its engine once per agent round, so it sends max(agent turns) requests for its share
eval_rounds = [0, 0]
for f in sorted((cfg.run_dir / "eval").glob("step_*/*.jsonl")):
    eps, n = read_jsonl(f), cfg.eval.tasks
    for w in range(2):
        mine = [e for e in eps if n * w // 2 <= int(e.group.split("#")[1].split(":")[0]) < n * (w + 1) // 2]
        eval_rounds[w] += max(e.info["agent_turns"] for e in mine)
res = {"gap_step4_vs_step3_weights": gap_step4_vs_step3(), "driver_samples": len(driver_samples), "eval_rounds": eval_rounds,
       "eval_files": len(list((cfg.run_dir / "eval").glob("step_*/*.jsonl"))), "driver_writes": list(driver_writes),
       "fetches": list(fetches), "engines": [seen(f.requests) for f in fakes]}
# a crash after step 3 and engines restarted from their launch folder: the resumed run must serve the step-3 weights
import shutil
shutil.rmtree(cfg.run_dir / "checkpoints" / "step_000004")
n0 = [len(f.requests) for f in fakes]
for f in fakes:
    with f.lock: f.model.load_state_dict(base.model.state_dict()); f.model_path = str(out / "engine_start")
run(resume=True)
res["resumed"] = {"gap_step4_vs_step3_weights": gap_step4_vs_step3(), "driver_samples": len(driver_samples),
                  "driver_writes": driver_writes[len(res["driver_writes"]):],
                  "engines": [seen(f.requests[k:]) for f, k in zip(fakes, n0)]}
for f in fakes: f.close()
json.dump(res, open(out / "engines.json", "w"))
print("done")
