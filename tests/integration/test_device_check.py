"""launch/device_check.sh is valid bash and its parts run end to end on the CPU with a tiny config: versions, GRPO,
a 1-rank FSDP and megatron step (gloo), and the SGLang part against the loopback stand-in of tests/fake_sglang.py
(the GPU run, which starts a real SGLang server, is for device machines). A part that runs out of time is named."""
import importlib.util, json, signal, subprocess, sys, time
from pathlib import Path
from fake_sglang import FakeSGLang

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--tiny", "--device", "cpu", "--batch", "4", "--prompt", "16", "--new", "8", "--steps", "2"]


def _script_model():
    "The tiny model device_check.py builds (same config and seed), for the stand-in to serve."
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "launch" / "device_check.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod.build(type("A", (), {"tiny": True})())[1]


def test_device_check_parts_on_cpu():
    assert subprocess.run(["bash", "-n", str(ROOT / "launch" / "device_check.sh")]).returncode == 0
    fake = FakeSGLang(_script_model(), 0, starting=2)   # 503 twice while "loading"
    try:
        r = subprocess.run([sys.executable, str(ROOT / "launch" / "device_check.py"), *SMOKE, "--sglang-url", fake.url],
                           capture_output=True, text=True, timeout=600)
    finally: fake.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    rows = [json.loads(l) for l in lines if l.startswith("{")]
    assert [x["step"] for x in rows] == [1, 2]
    assert all(x["gen_tokens_per_s"] > 0 and x["train_tokens_per_s"] > 0 and x["grad_norm"] > 0 for x in rows)
    verdicts = [l.split(":")[0].split(" (")[0] for l in lines if l.split(" ")[0] in ("PASS", "FAIL", "SKIP")]
    assert verdicts == ["PASS versions", "PASS grpo", "PASS fsdp", "PASS megatron", "PASS sglang"], lines[-8:]
    assert any("pinned: sglang==0.5.23" in l for l in lines)
    sg = next(l for l in lines if l.startswith("PASS sglang"))
    assert "update, restore and resume checked" in sg
    paths = [p for p, _ in fake.requests]
    k = paths.index("/resume_memory_occupation")   # the part's resume was followed by the reload
    assert paths[k - 1] == "/release_memory_occupation" and paths[k + 1] == "/update_weights_from_disk"
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "device_check.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "CUDA is not available" in r.stderr


def test_a_part_that_runs_out_of_time_is_named():
    fake = FakeSGLang(_script_model(), 0, starting=10**9)   # never ready
    try:
        p = subprocess.Popen([sys.executable, str(ROOT / "launch" / "device_check.py"), *SMOKE, "--parts", "versions,sglang",
                              "--sglang-url", fake.url], stdout=subprocess.PIPE, text=True)
        out = ""
        for line in p.stdout:   # stop it once it is inside the sglang part, as the shell script's timeout would
            out += line
            if line.startswith("PASS versions"):
                while not any(path == "/generate" for path, _ in fake.requests) and fake.starting > 10**9 - 3:
                    time.sleep(0.2)
                p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally: fake.close()
    assert p.returncode == 124 and "FAIL sglang: timed out" in out, out[-1500:]
