"""Compare the metrics of two run folders (or trees of runs), time fields aside: do two code versions train alike?

    python scripts/compare_metrics.py RUNS_BEFORE RUNS_AFTER

Every `metrics.jsonl` under the first folder must exist under the second at the same relative path; each pair of
files is compared row by row after dropping `time/*` and `wall_time`. Exit 1 if any file differs (the first
differing step and keys are printed)."""
import json, sys
from pathlib import Path


def rows(p: Path) -> list[dict]:
    "Rows of a metrics file without the time fields."
    out = []
    for line in p.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append({k: v for k, v in d.items() if not (k.startswith("time/") or k == "wall_time")})
    return out


def compare(a: Path, b: Path) -> int:
    fa = sorted(p.relative_to(a) for p in a.rglob("metrics.jsonl"))
    fb = sorted(p.relative_to(b) for p in b.rglob("metrics.jsonl"))
    if fa != fb: print(f"different sets of runs: {sorted(set(map(str, fa)) ^ set(map(str, fb)))}"); return 1
    bad = 0
    for f in fa:
        ra, rb = rows(a / f), rows(b / f)
        bad += ra != rb
        print(f"{f}: {len(ra)} rows, {'identical' if ra == rb else 'DIFFERENT'}")
        for x, y in zip(ra, rb):
            if x != y:
                print("  first difference at step", x.get("step"), {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)})
                break
    print(f"files differing: {bad} of {len(fa)}")
    return 1 if bad or not fa else 0


if __name__ == "__main__":
    if len(sys.argv) != 3: sys.exit(__doc__)
    sys.exit(compare(Path(sys.argv[1]), Path(sys.argv[2])))
