#!/usr/bin/env bash
# Install this checkout the way a user would, into a fresh venv with no extras, and run the quickstart there:
#   - `pip install <checkout>` installs the distribution sluice-dataflow with the `sluice` command, without pyarrow
#     (the `parquet` extra) or any other extra;
#   - the README's quickstart runs and its output is exact;
#   - running it again in the same directory is refused (out/ holds the first run's files);
#   - a job that reads Parquet is refused before anything starts, with the line that installs the extra.
# pip uses the machine's configuration (index, find-links); to run offline point it at local wheels, e.g.
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels scripts/check_install.sh
# Needs Python 3.11+. Exit status 0 when every check passed. KEEP=1 keeps the work directory.
# QUICKSTART_RECORDS=N runs the quickstart on N records instead of the README's 1,000,000 (the test suite uses
# 100,000: tests/integration/test_quickstart.py runs the full README quickstart; here the point is the install).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
records=${QUICKSTART_RECORDS:-1000000}
[[ "$records" =~ ^[1-9][0-9]*$ ]] && [ "$records" -ge 10000 ] || {
  echo "check_install: QUICKSTART_RECORDS must be an integer >= 10000 (every one of the 1000 keys appears)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-check-install.XXXXXX")
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "check_install: kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
unset PYTHONPATH  # the checkout must not be importable except through the install
say() { echo "check_install: $*"; }
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }
started=$(date +%s)

say "creating a fresh venv in $work/venv"
"$py" -m venv "$work/venv"
venv="$work/venv/bin"
# a copy of what a source distribution holds, so the build leaves nothing in the checkout (build/, egg-info)
mkdir "$work/src"
(cd "$root" && cp -r pyproject.toml README.md runtime netstack coordinator "$work/src/")
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
say "pip install <checkout> (no extras)"
"$venv/python" -m pip install --quiet --disable-pip-version-check "$work/src"
installed=$(date +%s)

"$venv/python" -m pip show sluice-dataflow >/dev/null || fail "the distribution sluice-dataflow is not installed"
[ -x "$venv/sluice" ] || fail "no sluice command in the venv"
if "$venv/python" -c 'import pyarrow' 2>/dev/null; then fail "pyarrow was installed without the parquet extra"; fi
site=$("$venv/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
size_mb=$(du -sm "$site" | cut -f1)
say "installed in $((installed - started)) s, site-packages $size_mb MB, no pyarrow"

# the quickstart, exactly as the README has it (but for the record count, QUICKSTART_RECORDS)
cd "$work"
"$venv/python" - "$root/README.md" "$records" <<'EOF'
import re, sys
blocks = re.findall(r"```python\n(.*?)```", open(sys.argv[1]).read(), re.S)
source = next(b for b in blocks if b.startswith("# wordcount.py"))
assert "count=1_000_000" in source, "the README's quickstart no longer reads count=1_000_000"
open("wordcount.py", "w").write(source.replace("count=1_000_000", f"count={int(sys.argv[2])}"))
EOF
say "sluice local wordcount:build --workers 2"
"$venv/sluice" local wordcount:build --workers 2 > quickstart.log 2>&1 || { tail -20 quickstart.log; fail "the quickstart did not finish"; }
grep -q "job FINISHED" quickstart.log || fail "no 'job FINISHED' in the quickstart's output"
"$venv/python" - "$records" <<'EOF' || fail "the quickstart's output is not exact"
import glob, json, sys
counts = {}
for path in glob.glob("out/part-*"):
    for line in open(path):
        key, n = json.loads(line)
        counts.setdefault(key, []).append(n)
assert len(counts) == 1000, len(counts)
assert sum(map(len, counts.values())) == int(sys.argv[1])
assert all(sorted(ns) == list(range(1, len(ns) + 1)) for ns in counts.values())
EOF
ran=$(date +%s)
say "quickstart output exact: $records lines over 1000 keys in $((ran - installed)) s"

# again in the same directory: refused, one line, nothing started
if "$venv/sluice" local wordcount:build --workers 2 > again.log 2>&1; then fail "a second run into out/ was not refused"; fi
grep -q "already holds output" again.log || { cat again.log; fail "the second run's refusal does not say why"; }
grep -q " pid " again.log && fail "the second run started processes before refusing"
say "a second run into the same out/ is refused: $(tail -1 again.log)"

# a job that needs the parquet extra: refused at submit with the install line
cat > parquetjob.py <<'EOF'
from runtime.api import DiscardSink, ParquetSource


def build(job):
    job.source(ParquetSource("in/")).sink(DiscardSink())
EOF
if "$venv/sluice" local parquetjob:build --workers 1 > parquet.log 2>&1; then fail "a Parquet job ran without pyarrow"; fi
grep -q "pip install 'sluice-dataflow\[parquet\]'" parquet.log || { cat parquet.log; fail "no install line for the parquet extra"; }
say "a Parquet job is refused: $(tail -1 parquet.log)"
say "all checks passed in $(($(date +%s) - started)) s"
