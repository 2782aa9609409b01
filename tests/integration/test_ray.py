"""A local Ray cluster (2 rollout workers + a trainer actor) reproduces a single-process lab run's metrics, and so does
Co-Training with a 2-rank FSDP2 or megatron-core (tensor-parallel) trainer group per policy, Population Co-Training and self-play;
Ray shuts down and leaves no process behind. Runs in a network namespace with only loopback, since Ray probes outside addresses."""
import json, math, os, shutil, subprocess, sys, time
from pathlib import Path
import pytest

HERE = Path(__file__).parents[1]   # the helper scripts live beside conftest.py


def _left_in(netns_file: Path) -> list[str]:
    """The processes still in the test's own network namespace (named in `netns_file` by its shell). The test's cluster
    runs there alone, so after the run none may be left, while another Ray cluster on the machine (a concurrent test
    run) is not counted."""
    ns, out = netns_file.read_text().strip(), []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "ns" / "net") == ns:
                args = (d / "cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
                out.append(f"{d.name} {args}")
        except OSError:   # a process that ended while we looked
            pass
    return out


def _no_process_left(netns_file: Path):
    for _ in range(30):   # worker processes exit asynchronously after ray.shutdown(); give them a few seconds
        if not _left_in(netns_file): return
        time.sleep(0.5)
    assert not _left_in(netns_file), _left_in(netns_file)


def test_ray_run_matches_single_process(tmp_path):
    if shutil.which("unshare") is None: pytest.fail("needs util-linux's unshare (a loopback-only network namespace for Ray)")
    cmd = f"readlink /proc/self/ns/net > {tmp_path}/netns && ip link set lo up && exec {sys.executable} {HERE / 'ray_lab_check.py'} {tmp_path}"
    r = subprocess.run(["unshare", "-n", "bash", "-c", cmd], capture_output=True, text=True, timeout=2400,   # a hang guard: minutes on a busy machine
                       env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())

    def same(a_rows, b_rows, rel, abs_, pooled=False):
        assert [x["step"] for x in a_rows] == [x["step"] for x in b_rows] == list(range(5))
        for a, b in zip(a_rows, b_rows):
            assert set(a) == set(b), set(a) ^ set(b)
            for k in a:
                # pure float round-off, which depends on the trainer's summation order; except a pooled simulator's:
                # its turns are sampled by a drawn pool entry, so its gap is the entry's distance from the trained one
                if "logprob_gap" in k and not (pooled and k.startswith("sim/")):
                    assert a[k] < 1e-4 and b[k] < 1e-4, (a["step"], k, a[k], b[k])
                elif isinstance(a[k], float): assert math.isclose(a[k], b[k], rel_tol=rel, abs_tol=abs_), (a["step"], k, a[k], b[k])
                else: assert a[k] == b[k], (a["step"], k)
    same(rows["single"], rows["ray"], 1e-6, 1e-9)
    single = rows["single"]
    assert any(x.get("train/loss") for x in single) and single[-1]["eval/mean"] is not None
    # split trainers differ from one process only in float summation order (~1e-7 in a gradient); Adam divides by
    # sqrt(v), which turns that into differences of up to ~lr in near-zero gradient coordinates, so float metrics drift
    # to ~1e-4 relative by step 4 (measured 1.0e-4 in train/kl) while the sampled episodes stay identical
    for kind in ("cot-fsdp", "cot-megatron"): same(rows["cot-single"], rows[kind], 1e-3, 1e-6)
    visible = json.loads((tmp_path / "visible.json").read_text())   # pinned ranks (agent 0-1, simulator 2-3) kept their GPUs
    assert visible["cot-fsdp"] == ["0", "1", "2", "3"], visible
    assert visible["ray"] == [os.environ.get("CUDA_VISIBLE_DEVICES")], visible   # unpinned: whatever Ray gave (none here)
    assert all(x.get("sim/grad_norm", 0) > 0 for x in rows["cot-single"][1:])   # the simulator trained too
    same(rows["pop-single"], rows["pop-ray"], 1e-5, 1e-7, pooled=True)   # workers read the run's pool from the run folder
    # at step 2 the pool holds only the step-0 entry while the simulator has taken a step: its turns are off-policy
    assert rows["pop-single"][1]["sim/logprob_gap"] < 1e-4 < rows["pop-single"][2]["sim/logprob_gap"]
    assert rows["pop-single"][4]["sim/pool_size"] == 2
    same(rows["sp-single"], rows["sp-ray"], 1e-5, 1e-7)     # self-play: the worker's user is its agent
    assert rows["sp-single"][1]["sim/reward"] is not None and rows["sp-single"][1]["train/loss"]
    _no_process_left(tmp_path / "netns")


def test_ray_workers_generate_on_their_engines_with_synced_weights(tmp_path):
    "Each worker's agent samples on its own SGLang engine; engines release memory while the trainer steps, then load its weights."
    cmd = f"readlink /proc/self/ns/net > {tmp_path}/netns && ip link set lo up && cd {HERE} && exec {sys.executable} {HERE / 'ray_engine_check.py'} {tmp_path}"
    r = subprocess.run(["unshare", "-n", "bash", "-c", cmd], capture_output=True, text=True, timeout=2400,   # a hang guard: minutes on a busy machine
                       env={**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(HERE)})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "engines.json").read_text())
    assert res["driver_samples"] == 0 and res["eval_files"] == 3 * 10   # evaluated at steps 0, 2, 4 on 10 panel entries
    engines = res["engines"]
    for e, evals in zip(engines, res["eval_rounds"]):   # 4 steps x 2 agent turns, plus the evaluation rounds
        assert evals >= 30 and e["paths"].count("/generate") == 4 * 2 + evals
    pushes, reloads = [], []
    for e in engines:   # an update right after a resume is its reload
        calls, updates = e["calls"], e["update_paths"]
        after = [calls[i - 1] for i, c in enumerate(calls) if c == "/update_weights_from_disk"]
        pushes.append([u for u, a in zip(updates, after, strict=True) if a != "/resume_memory_occupation"])
        reloads.append([u for u, a in zip(updates, after) if a == "/resume_memory_occupation"])
        # the run's own weights reach the engine before it generates anything (it was started from the initial model)
        assert e["paths"].index("/update_weights_from_disk") < e["paths"].index("/generate")
    for p, r in zip(pushes, reloads):
        # the driver's weights before the first generation (step-0 evaluation), then the trainer's after each update
        assert len(p) == 5 and len(set(p)) == 5 and p[0].endswith("agent_v000000"), p
        assert r == p[:4], (r, p)   # each resume reloads what the engine last loaded
    assert pushes[0] == pushes[1]
    # the driver wrote only the first folder; rank 0 wrote the others, and no step's state dict came to the driver
    # except for the two checkpoints (steps 3 and 4)
    assert res["driver_writes"] == [pushes[0][0]] and sum(res["fetches"]) == 2, (res["driver_writes"], res["fetches"])
    for e in engines:   # colocated: every update is bracketed by release/resume, and the resume reloads the weights
        calls = e["calls"]
        assert calls.count("/release_memory_occupation") == calls.count("/resume_memory_occupation") == 4   # one per step
        for i, c in enumerate(calls):
            if c == "/resume_memory_occupation": assert calls[i + 1] == "/update_weights_from_disk", calls
    # resumed after step 3 on engines restarted from the launch folder: the step-3 weights are pushed before anything
    # generates, so the replayed step 4 samples from exactly them (before this push it sampled from the launch weights)
    rs = res["resumed"]
    assert rs["driver_samples"] == 0 and len(rs["driver_writes"]) == 1
    for e in rs["engines"]:
        assert e["paths"].index("/update_weights_from_disk") < e["paths"].index("/generate")
        assert e["update_paths"][0] == rs["driver_writes"][0]
    assert rs["gap_step4_vs_step3_weights"] < 1e-5, rs["gap_step4_vs_step3_weights"]
    assert res["gap_step4_vs_step3_weights"] < 1e-5
    _no_process_left(tmp_path / "netns")
