#!/usr/bin/env bash
# Create .venv and install sluice with its test dependencies, the `spark` extra
# (PySpark, for `sluice data` and the demo) and the `nats` extra (nats-py, for the
# NATS connector) and the `s3` extra (obstore, for s3:// checkpoint storage). Idempotent: does
# nothing when the venv is newer than pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "sluice: Python 3.11 or newer is required (python3.11 not found on PATH)" >&2
  return 1
}

stamp=.venv/.sluice-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ -x .venv/bin/sluice ]; then
  exit 0
fi
py=$(find_python)
if [ ! -x .venv/bin/python ]; then
  echo "sluice: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
echo "sluice: installing dependencies into .venv" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,spark,nats,s3]'
touch "$stamp"
