#!/usr/bin/env bash
# Figure 3: RL (Single) vs gemini-3-flash at the paper's settings (`scope experiment show fig3-modality --scale gpu` prints them).
# Options: --dry-run, --settings release, --seed N, --gpus N, --base-port P, --out DIR; `scope launch stop RUN_DIR` stops it.
set -euo pipefail
exec "${SCOPE:-scope}" launch fig3-modality single-gemini-3-flash "$@"
