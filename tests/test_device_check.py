"""launch/device_check.sh is valid bash and its Python runs end to end on the CPU with a tiny config (the GPU run is for device machines)."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_smoke_on_cpu():
    assert subprocess.run(["bash", "-n", str(ROOT / "launch" / "device_check.sh")]).returncode == 0
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "device_check.py"), "--tiny", "--device", "cpu", "--batch", "4", "--prompt", "16",
                        "--new", "8", "--steps", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert [x["step"] for x in rows] == [1, 2]
    assert all(x["gen_tokens_per_s"] > 0 and x["train_tokens_per_s"] > 0 and x["grad_norm"] > 0 for x in rows)
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "device_check.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "CUDA is not available" in r.stderr
