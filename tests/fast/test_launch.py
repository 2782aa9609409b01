"""Launchers: generated from the registry, valid bash, and every one's --dry-run works; Co-Training splits the node 4 + 4."""
import os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest
from scope_nb.scale.launch import launcher_scripts

from conftest import ROOT
LAUNCH = ROOT / "launch"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
ENV.pop("OPENROUTER_API_KEY", None)


def test_committed_launchers_match_the_registry():
    want = launcher_scripts()
    have = {p.name: p.read_text() for p in LAUNCH.glob("*--*.sh")}   # device_check.sh is not an experiment launcher
    assert set(have) == set(want), "regenerate with: python -c 'from scope_nb.scale.launch import write_launchers; write_launchers()'"
    assert all(have[k] == want[k] for k in want)
    assert all(os.access(LAUNCH / k, os.X_OK) for k in want)


def _run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)


def test_every_launcher_passes_bash_n_and_dry_run():
    names = sorted(launcher_scripts())
    assert len(names) >= 20
    for n in names:
        r = _run(["bash", "-n", str(LAUNCH / n)])
        assert r.returncode == 0, (n, r.stderr)
    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda n: (n, _run(["bash", str(LAUNCH / n), "--dry-run"])), names))
    for n, r in results:
        assert r.returncode == 0, (n, r.stderr[-2000:])
        assert "# Ray placement" in r.stdout and "# processes that would start" in r.stdout and "# pre-flight checks" in r.stdout, n
        # what a GPU run would use: the pinned and installed versions, and each group's memory per GPU and push time
        versions = r.stdout.split("# versions it would run with")[1].split("\n# ")[0]
        assert "pinned: sglang==0.5.23" in versions and "installed: driver" in versions and "torch " in versions, n
        memory = r.stdout.split("# memory per GPU (estimate)")[1].split("\n# ")[0]
        assert memory.count(" GB of AdamW state") == memory.count("weight push") >= 1 and "fits in 80 GB" in memory, n


def test_cotraining_dry_run_shows_two_groups_with_own_engines():
    r = _run(["bash", str(LAUNCH / "table1-tau2-retail--co-training.sh"), "--dry-run"])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("trainer group")]
    assert len(lines) == 2
    assert lines[0].startswith("trainer group agent") and "GPUs 0-3" in lines[0] and "ports [30000, 30001, 30002, 30003]" in lines[0]
    assert lines[1].startswith("trainer group user") and "GPUs 4-7" in lines[1] and "ports [30100, 30101, 30102, 30103]" in lines[1]
    assert "would fail: environment variable OPENROUTER_API_KEY is not set" in r.stdout
    single = _run(["bash", str(LAUNCH / "table1-p4g--rl-single.sh"), "--dry-run", "--settings", "release"])
    assert "GPUs 0-7" in single.stdout and "lr = 5e-07" in single.stdout and "steps = 1000" in single.stdout


def test_launch_without_gpus_fails_with_clear_messages():
    r = _run(["bash", str(LAUNCH / "table1-p4g--vs.sh")])
    assert r.returncode == 2
    assert "GPUs: need 8" in r.stdout and "OPENROUTER_API_KEY" in r.stdout
    r = _run([str(Path(sys.executable).parent / "scope"), "launch", "table1-p4g", "persona", "--dry-run"])
    assert r.returncode == 2 and "unknown arm(s) ['persona']" in r.stderr, r.stderr


def test_sglang_layout_files_match_the_plans():
    from scope_nb.scale.launch import layout_files
    have = {p.name: p.read_text() for p in (ROOT / "configs" / "sglang").glob("*.json")}
    assert have == layout_files(), "regenerate configs/sglang from scope_nb.scale.launch.layout_files()"


def test_every_plans_train_command_is_accepted_by_scope():
    "The trainer command each plan would start parses with the real `scope` parser into the Ray backend it describes."
    from scope_nb.cli.commands import _parser, backend_overrides
    from scope_nb.train.config import BackendSection, apply_overrides
    from scope_nb.scale.launch import plan_launch
    from scope_nb.experiments.registry import EXPERIMENTS
    seen = 0
    for e in EXPERIMENTS.values():
        for a in e.scales.get("gpu", (None, []))[1]:
            if a.overrides.get("run", {}).get("steps") == 0: continue
            for trainer in ("fsdp", "megatron"):
                plan = plan_launch(e.name, a.name, trainer=trainer)
                cmd = plan.processes[-1]
                assert cmd[:2] == ["scope", "train"]
                args = _parser().parse_args(cmd[1:])   # the flags become the run's [backend] table
                b = BackendSection.model_validate(apply_overrides({}, backend_overrides(args))["backend"])
                per = len(plan.groups[0].gpus)
                assert (b.name, b.trainer, b.trainer_world, b.workers, b.gpus_per_rank, b.colocate) == ("ray", trainer, per, per, 1.0, True)
                assert b.engine_urls == [f"http://127.0.0.1:{q}" for q in plan.groups[0].engine_ports]
                assert bool(b.user_engine_urls) == (len(plan.groups) == 2)
                # each group's trainer ranks sit on its engines' GPUs, rank i beside engine i (issue: Ray's own pick
                # could put agent ranks beside simulator engines that never release memory while the agent trains)
                engine_gpus = {}
                for p in plan.processes:
                    if "sglang.launch_server" in p:
                        port = int(p[p.index("--port") + 1])
                        engine_gpus[f"http://127.0.0.1:{port}"] = int(p[0].split("=")[1])
                assert b.trainer_gpus == [engine_gpus[u] for u in b.engine_urls]
                if len(plan.groups) == 2:
                    assert b.user_trainer_gpus == [engine_gpus[u] for u in b.user_engine_urls]
                    assert not set(b.trainer_gpus) & set(b.user_trainer_gpus)
                else:
                    assert b.user_trainer_gpus == []
                seen += 1
    assert seen >= 40


STAND_IN = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_run_plan_starts_waits_and_stops_only_its_processes(tmp_path):
    "A non-dry launch with stand-ins for Ray, SGLang and the trainer: engines awaited on /health, trainer's status returned, the rest stopped."
    from scope_nb.core.dialogue import free_port
    from scope_nb.scale.launch import _alive, plan_launch, run_plan
    plan = plan_launch("table1-tau2-retail", "co-training", out=str(tmp_path), gpus=2, base_port=free_port())
    for g in plan.groups: g.engine_ports = [free_port() for _ in g.gpus]
    py = sys.executable
    plan.processes = ([[py, "-c", "import time; time.sleep(600)"]]
                      + [[f"CUDA_VISIBLE_DEVICES={gpu}", py, "-c", STAND_IN, str(port)] for g in plan.groups for gpu, port in zip(g.gpus, g.engine_ports)]
                      + [[py, "-c", "import os, sys; print(os.environ.get('CUDA_VISIBLE_DEVICES')); sys.exit(3)"]])
    lines = []
    assert run_plan(plan, ready_timeout=60, echo=lines.append) == 3
    run_dir = Path(plan.config["run"]["out_dir"]) / plan.config["run"]["name"]
    assert (run_dir / "config.toml").exists()
    import json
    rec = json.loads((run_dir / "launch" / "pids.json").read_text())
    assert [r["name"] for r in rec] == ["ray-head", "engine-agent-gpu0", "engine-user-gpu1", "trainer"]
    assert sum("ready on port" in l for l in lines) == 2 and sum("sent SIGTERM" in l for l in lines) == 3
    import time
    for _ in range(50):
        if not any(_alive(r["pid"]) for r in rec): break
        time.sleep(0.1)
    assert not any(_alive(r["pid"]) for r in rec)
    assert (run_dir / "launch" / "trainer.log").read_text().strip() == "None"   # engines got their GPU, the trainer none


def test_run_plan_names_the_log_of_an_engine_that_dies(tmp_path):
    from scope_nb.core.dialogue import free_port
    from scope_nb.scale.launch import plan_launch, run_plan
    plan = plan_launch("table1-tau2-retail", "rl-single", out=str(tmp_path), gpus=1, base_port=free_port())
    py = sys.executable
    plan.processes = [[py, "-c", "import time; time.sleep(600)"], [py, "-c", "import sys; sys.exit('no GPU')"], [py, "-c", "pass"]]
    lines = []
    assert run_plan(plan, ready_timeout=60, echo=lines.append) == 1
    assert any("engine-agent-gpu0 exited before it was ready" in l and "engine-agent-gpu0.log" in l for l in lines), lines
