import os, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
# the shared helpers (stand-in servers, the rank harness, fault proxy) live in tests/; tests/fast imports them too
sys.path.insert(0, str(ROOT / "tests"))
# Steadier timings on a 2-core machine (torch slows 5-30x when threads compete).
os.environ.setdefault("OMP_NUM_THREADS", "1")
