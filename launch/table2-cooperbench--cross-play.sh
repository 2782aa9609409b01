#!/usr/bin/env bash
# Table 2: Cross-play at the paper's settings (`scope experiment show table2-cooperbench --scale gpu` prints them).
# Options: --dry-run, --settings release, --seed N, --gpus N, --base-port P, --out DIR; `scope launch stop RUN_DIR` stops it.
set -euo pipefail
exec "${SCOPE:-scope}" launch table2-cooperbench cross-play "$@"
