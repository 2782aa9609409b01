#!/usr/bin/env bash
# GPU device check (one GPU, < 8 minutes), one PASS/FAIL/SKIP line per part: versions; bf16 GRPO steps (tokens/s,
# peak memory); a 1-rank NCCL FSDPTrainer step; megatron-core vs transformers and a MegatronTrainer step; an SGLang
# server (generate with logprobs, engine-trainer gap, weight update from disk, release/resume). megatron and sglang
# parts are skipped when not installed. A part cut by the time limit is named. Extra arguments go to device_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -c 'import torch, transformers' || { echo "device_check: needs torch and transformers" >&2; exit 2; }
exec timeout 470 "$PY" launch/device_check.py "$@"
