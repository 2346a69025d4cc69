"""The README's quickstart, run as written with `sluice local`, must produce the exact word count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cli.processes import child_env
from tests.support.cluster import committed_output

ROOT = Path(__file__).resolve().parents[2]


def quickstart_source() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    matching = [b for b in blocks if b.startswith("# wordcount.py")]
    assert matching, "README has no ```python block starting with '# wordcount.py'"
    return matching[0]


@pytest.mark.integration
def test_quickstart_output_is_exact(tmp_path: Path) -> None:
    (tmp_path / "wordcount.py").write_text(quickstart_source())
    env = child_env("quickstart-token", None)
    env.pop("SLUICE_TOKEN")
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "local", "wordcount:build", "--workers", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "worker-1" in proc.stdout and "metrics 127.0.0.1:" in proc.stdout  # ports are printed
    assert "job FINISHED" in proc.stdout

    counts, hidden = committed_output(tmp_path / "out")
    assert hidden == [], f"in-progress files left behind: {hidden}"
    assert len(counts) == 1000
    assert sum(len(v) for v in counts.values()) == 1_000_000
    for key, ns in counts.items():
        assert sorted(ns) == list(range(1, len(ns) + 1)), f"{key}: counts are not exactly 1..n"
        assert ns == sorted(ns), f"{key}: a key's counts must arrive in order"


@pytest.mark.integration
def test_local_fails_cleanly_when_the_job_does_not_import(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import does_not_exist_anywhere\n")
    env = child_env("t", None)
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "local", "broken:build", "--workers", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    # checked before anything starts (tests/integration/test_cli_errors.py has the details)
    assert proc.returncode == 2
    assert "does_not_exist_anywhere" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pid" not in proc.stdout


def _assert_no_children_left(proc: subprocess.CompletedProcess[str]) -> None:
    pids = [int(m) for m in re.findall(r"pid\s+(\d+)", proc.stdout)]
    assert pids, "sluice local printed no pids"
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"process {pid} left running"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
