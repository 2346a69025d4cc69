#!/usr/bin/env bash
# The full chaos run (2 M rows, kill -9 three times per run, Spark verifies), 5 runs of each mode; runs that
# kill the coordinator twice (a new one recovers the job from its records and latest checkpoint); runs that
# rescale the job to a random parallelism between the kills (RESCALES=0 skips them); runs of the windowed count
# over out-of-order input (WINDOWS=0 skips them); as root, also runs that cut
# worker-to-worker links in network namespaces (LINK_CUTS=0 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
workdir=$(mktemp -d -t sluice-chaos-XXXX)
.venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --workdir "$workdir" "$@"
.venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode aligned_timeout --workdir "$workdir" "$@"
.venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --kills 1 --coordinator-kills 2 \
  --workdir "$workdir" "$@"
if [ "${RESCALES:-3}" != 0 ]; then
  .venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --rescales "${RESCALES:-3}" \
    --workdir "$workdir" "$@"
fi
if [ "${WINDOWS:-1}" != 0 ]; then
  .venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --window-ms 500 --jitter-ms 400 \
    --max-delay-ms 150 --allowed-lateness-ms 100 --workdir "$workdir" "$@"
fi
if [ "$(id -u)" = 0 ] && [ "${LINK_CUTS:-2}" != 0 ]; then
  .venv/bin/python scripts/chaos.py --runs "${RUNS:-5}" --mode unaligned --kills 0 --link-cuts "${LINK_CUTS:-2}" \
    --workdir "$workdir" "$@"
fi
