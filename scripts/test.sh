#!/usr/bin/env bash
# Set everything up (first run only), then ruff, mypy and the test suite; arguments go to pytest.
# SLUICE_SKIP_LINT=1 skips ruff and mypy (e.g. when iterating on one test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [ "${SLUICE_SKIP_LINT:-0}" != "1" ]; then
  echo "sluice: ruff check ." >&2
  .venv/bin/ruff check .
  echo "sluice: mypy" >&2
  .venv/bin/mypy
fi
exec .venv/bin/python -m pytest "$@"
