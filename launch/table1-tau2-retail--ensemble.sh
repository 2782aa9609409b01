#!/usr/bin/env bash
# Table 1, τ² retail: RL + Ensemble (K=3) at the paper's settings (`scope experiment show table1-tau2-retail --scale gpu` prints them).
# Options: --dry-run, --settings release, --seed N, --gpus N, --base-port P, --out DIR; `scope launch stop RUN_DIR` stops it.
set -euo pipefail
exec "${SCOPE:-scope}" launch table1-tau2-retail ensemble "$@"
