#!/usr/bin/env bash
# Set everything up (first run only), then lint and the test suite tier by tier, each timed:
#   lint (ruff, mypy); unit + netstack (seconds; if they fail, nothing else runs); integration and chaos.
# Arguments go to one pytest run instead of the tiers: scripts/test.sh tests/unit -k foo runs just that.
# SLUICE_SKIP_LINT=1 skips ruff and mypy (e.g. when iterating on one test).
# Each tier runs in SLUICE_TEST_PROCESSES pytest processes (pytest-xdist; default 2, one per core: most of a
# test's time is spent waiting on its processes, not computing); a file's tests stay in one process, so do all
# Spark tests (tests/conftest.py). SLUICE_TEST_PROCESSES=0 runs each tier in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

timings=()
failed=0

# tier NAME COMMAND...: run it, print how long it took; its exit status is the command's
tier() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "sluice: == $name" >&2
  "$@" || status=$?
  timings+=("$name $((SECONDS - start))s")
  echo "sluice: == $name took $((SECONDS - start))s$([ "$status" = 0 ] || echo ", FAILED")" >&2
  return "$status"
}

summary() {
  echo "sluice: tiers: $(IFS=,; echo "${timings[*]}" | sed 's/,/, /g')" >&2
}

lint() {
  echo "sluice: ruff check ." >&2
  .venv/bin/ruff check .
  echo "sluice: mypy" >&2
  .venv/bin/mypy
}

if [ "${SLUICE_SKIP_LINT:-0}" != "1" ]; then
  tier lint lint || { summary; exit 1; }
fi

if [ "$#" -gt 0 ]; then
  tier pytest .venv/bin/python -m pytest "$@" || failed=1
  summary
  exit "$failed"
fi

processes=${SLUICE_TEST_PROCESSES:-2}
spread=(-n "$processes")
[ "$processes" = 0 ] || spread+=(--dist loadgroup --no-loadscope-reorder)
tier unit+netstack .venv/bin/python -m pytest "${spread[@]}" tests/unit tests/netstack || { summary; exit 1; }
# one run for both: the chaos tests (all in the Spark group) go on beside the integration tests
# the slowest tests are listed: the suite's time budget (15 min on two cores) is spent there
tier integration+chaos .venv/bin/python -m pytest "${spread[@]}" --durations=15 tests/integration tests/chaos || failed=1
summary
exit "$failed"
