#!/usr/bin/env bash
# GPU device check (one GPU, PyTorch + transformers only; < 8 minutes): GRPO steps of the torch backend in bf16 on a
# randomly initialised Qwen3-0.6B-sized model, generation and training tokens/s, peak memory; a megatron-core
# forward/backward with the converted weights if megatron-core is installed. Extra arguments go to device_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -c 'import torch, transformers' || { echo "device_check: needs torch and transformers" >&2; exit 2; }
exec timeout 470 "$PY" launch/device_check.py "$@"
