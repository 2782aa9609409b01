"""Model-load time: dequantising the packaged GGUF vs reading the cached safetensors copy, side by side.

    .venv/bin/python bench/bench_model_load.py [--model smollm2] [--repeats 3]

Each load runs in a fresh process (so the cached load pays no warm in-process state) against a temporary
cache; the ratio is what to compare across machines, absolute seconds drift with load on the machine.
"""
import argparse, os, re, statistics, subprocess, sys, tempfile
from pathlib import Path

SCOPE = str(Path(sys.executable).parent / "scope")

def load_once(model, cache):
    r = subprocess.run([SCOPE, "info", "--chat", model, "Hi", "--max-new-tokens", "1"], capture_output=True, text=True,
                       env={**os.environ, "SCOPE_NB_CACHE": cache}, check=True)
    src, secs = re.search(rf"\[{re.escape(model)}\] loaded from (\w+) in ([\d.]+)s", r.stdout).groups()
    return src, float(secs)

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--model", default="smollm2"); ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    gguf, cached = [], []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory() as d:
            s1, t1 = load_once(a.model, d); s2, t2 = load_once(a.model, d)
            assert (s1, s2) == ("gguf", "cache"), (s1, s2)
            gguf.append(t1); cached.append(t2)
    g, c = statistics.median(gguf), statistics.median(cached)
    print(f"{a.model}: GGUF load {g:.2f}s, cached load {c:.2f}s (medians of {a.repeats}); cached is {g / c:.0f}x faster")
