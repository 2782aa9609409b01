#!/usr/bin/env bash
# Table 1, P4G column: RL (Single) at the paper's settings (`scope experiment show table1-p4g --scale gpu` prints them).
# Options: --dry-run, --settings release, --seed N, --gpus N, --base-port P, --out DIR; `scope launch stop RUN_DIR` stops it.
set -euo pipefail
exec "${SCOPE:-scope}" launch table1-p4g rl-single "$@"
