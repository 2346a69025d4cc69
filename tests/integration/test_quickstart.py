"""The README's quickstart, run as written with `sluice local`, must produce the exact word count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cli.processes import child_env
from tests.support.cluster import committed_output
from tests.support.readme import readme_example


def quickstart_source() -> str:
    return readme_example("wordcount")


def run_local(tmp_path: Path, entry: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = child_env("quickstart-token", None)
    env.pop("SLUICE_TOKEN")
    return subprocess.run([sys.executable, "-m", "runtime.cli", "local", entry, "--workers", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.integration
def test_quickstart_output_is_exact(tmp_path: Path) -> None:
    (tmp_path / "wordcount.py").write_text(quickstart_source())
    proc = run_local(tmp_path, "wordcount:build")
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

    # the same command again in the same directory: refused before anything starts, out/ untouched
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    again = run_local(tmp_path, "wordcount:build", timeout_s=60)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "pid" not in again.stdout and "Traceback" not in again.stderr, again.stdout + again.stderr
    (line,) = again.stderr.strip().splitlines()
    assert line.startswith("sluice local: job wordcount:build: the FileSink directory out/ already holds output")
    assert "if_exists='append'" in line, line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


@pytest.mark.integration
def test_the_readme_asynchronous_state_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "asynccount.py").write_text(readme_example("asynccount"))
    proc = run_local(tmp_path, "asynccount:build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts, hidden = committed_output(tmp_path / "async-out")
    assert hidden == [] and len(counts) == 100
    assert sum(len(v) for v in counts.values()) == 100_000
    assert all(ns == list(range(1, len(ns) + 1)) for ns in counts.values()), "per key, in order, exactly once"


@pytest.mark.integration
def test_the_readme_windows_example_sends_late_records_to_the_side_output(tmp_path: Path) -> None:
    (tmp_path / "windowed.py").write_text(readme_example("windowed"))
    proc = run_local(tmp_path, "windowed:build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    late = [json.loads(line) for f in sorted((tmp_path / "late").glob("part-*")) for line in f.open()]
    windows = [json.loads(line) for f in sorted((tmp_path / "windows").glob("part-*")) for line in f.open()]
    assert len(late) > 1000, f"the README says about a tenth of the records are late: {len(late)}"
    assert all(len(r) == 3 and r[0].startswith("k") for r in late), late[:3]  # (key, seq, event time) as read
    assert all(end - start == 1000 for _, start, end, _ in windows), windows[:3]
    # every record is either counted in a window (the last row of each window is complete) or late
    final: dict[tuple[str, int], int] = {}
    for key, start, _, n in windows:
        final[(key, start)] = max(final.get((key, start), 0), n)
    assert sum(final.values()) + len(late) == 100_000


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
