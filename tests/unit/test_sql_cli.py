"""`sluice sql` and `sluice submit --sql` up to the point where processes would start: --explain prints the plan,
bad SQL is one line FILE:LINE:COLUMN and exit status 2 with nothing started (runtime/cli/sql_command.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.cli.main import main  # noqa: E402
from runtime.sql.entry import entry_for, script_of  # noqa: E402

SCRIPT = """SET 'execution.checkpointing.interval' = '2s';
CREATE TABLE bids (auction BIGINT, price BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('connector' = 'datagen', 'number-of-rows' = '10');
CREATE TABLE out1 (auction BIGINT, c BIGINT) WITH ('connector' = 'print');
INSERT INTO out1 SELECT auction, COUNT(*) FROM bids GROUP BY auction;
"""


def test_explain_prints_the_plan_and_starts_nothing(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "q.sql"
    path.write_text(SCRIPT)
    assert main(["sql", "--explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== Job 'q': 4 operators, default parallelism 1 ==\n")
    assert "SET execution.checkpointing.interval=2s\n" in out
    assert "GroupAggregate(groupBy=[auction], select=[COUNT(*)])  changelog=[I,UB,UA]" in out


def test_functions_are_imported_from_the_working_directory(tmp_path: Path, capsys: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    (tmp_path / "cli_udfs_cwd.py").write_text("def twice(v):\n    return v * 2\n")
    (tmp_path / "q.sql").write_text("CREATE FUNCTION twice AS 'cli_udfs_cwd.twice' LANGUAGE PYTHON;\n" +
                                    SCRIPT.replace("COUNT(*)", "SUM(twice(price))"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])  # as the console script
    try:
        assert main(["sql", "--explain", "q.sql"]) == 0, capsys.readouterr().err
        assert "select=[SUM(TWICE(price))]" in capsys.readouterr().out
    finally:
        sys.modules.pop("cli_udfs_cwd", None)


def test_bad_sql_is_one_line_with_file_line_and_column_and_status_2(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "bad.sql"
    path.write_text(SCRIPT.replace("COUNT(*) FROM bids", "COUNT(*) FROM bids WHERE price >"))
    assert main(["sql", str(path), "--workers", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"sluice sql: {path}:5:67: an expression is missing near 'GROUP BY'\n"
    assert captured.out == ""  # no cluster was started
    assert main(["submit", "--sql", str(path), "--coordinator", "127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == f"sluice submit: {path}:5:67: an expression is missing near 'GROUP BY'\n"


def test_a_missing_file_and_a_script_without_insert_are_refused(tmp_path: Path, capsys: Any) -> None:
    assert main(["sql", str(tmp_path / "none.sql")]) == 2
    assert "cannot read" in capsys.readouterr().err
    path = tmp_path / "ddl.sql"
    path.write_text(SCRIPT.split("INSERT")[0])
    assert main(["sql", str(path)]) == 2
    assert capsys.readouterr().err == f"sluice sql: {path}: the script has no INSERT INTO: nothing to run\n"


def test_the_entry_carries_the_script_itself() -> None:
    entry = entry_for(SCRIPT)
    module, _, name = entry.partition(":")
    assert module == "runtime.sql.entry" and ":" not in name
    assert script_of(name) == SCRIPT
