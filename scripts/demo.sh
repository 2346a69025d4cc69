#!/usr/bin/env bash
# Set everything up (first run only) and run the demo: word count under backpressure on a local cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/sluice demo "$@"
