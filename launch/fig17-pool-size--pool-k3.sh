#!/usr/bin/env bash
# Figure 17: Population K=3 at the paper's settings (`scope experiment show fig17-pool-size --scale gpu` prints them).
# Options: --dry-run, --settings release, --seed N, --gpus N, --base-port P, --out DIR; `scope launch stop RUN_DIR` stops it.
set -euo pipefail
exec "${SCOPE:-scope}" launch fig17-pool-size pool-k3 "$@"
