"""A user's install: scripts/check_install.sh creates a fresh venv, installs this checkout by its distribution
name without extras (no pyarrow), and runs the README's quickstart there, with the refusals of a second run into
the same output and of a job that needs the parquet extra (the script's checks). The quickstart reads 100,000
records instead of the README's 1,000,000: test_quickstart.py runs the README's full quickstart; here the point
is the install (13 s saved). pip uses the machine's configured index, as a user's would."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_venv_without_extras_runs_the_quickstart() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["QUICKSTART_RECORDS"] = "100000"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "check_install.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout, proc.stdout
    assert "quickstart output exact: 100000 lines over 1000 keys" in proc.stdout, proc.stdout
    installed = re.search(r"site-packages (\d+) MB, no pyarrow", proc.stdout)
    assert installed and int(installed.group(1)) < 100, proc.stdout  # pyarrow alone is 176 MB
