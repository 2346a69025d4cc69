#!/usr/bin/env bash
# The full chaos run (2 M rows, kill -9 three times per run, Spark verifies), 5 runs of each mode.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
workdir=$(mktemp -d -t sluice-chaos-XXXX)
.venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --workdir "$workdir" "$@"
.venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode aligned_timeout --workdir "$workdir" "$@"
