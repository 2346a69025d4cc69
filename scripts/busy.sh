#!/usr/bin/env bash
# Run a command with cores kept busy beside it, the way a shared CI machine is: the suite must pass so.
#   scripts/busy.sh ./scripts/test.sh           # one core busy (`yes > /dev/null`) for the whole run
#   SLUICE_BUSY_CORES=2 scripts/busy.sh CMD...  # more
# The busy loops are started before the command and ended (by PID) when it ends, however it ends; the
# command's exit status is this script's.
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: scripts/busy.sh COMMAND [ARGS...]" >&2; exit 2; }
cores=${SLUICE_BUSY_CORES:-1}
pids=()
reap() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap reap EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$cores"); do
  yes > /dev/null &
  pids+=("$!")
done
echo "sluice: $cores core(s) kept busy (pids ${pids[*]}); load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
status=0
"$@" || status=$?
echo "sluice: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit "$status"
