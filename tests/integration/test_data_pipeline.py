"""The Spark data pipeline (runtime/data): generate input data sets, verify committed word-count and windowed
outputs.

Spark takes about ten seconds to start, so the module shares one local
SparkSession, and the CLI runs as a subprocess only for the end-to-end check,
against the run's Spark Connect server (no JVM start of its own).
Without Java or PySpark the Spark tests are skipped; the test of the
missing-Java message runs anyway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.cli.main import main
from runtime.cli.processes import child_env
from runtime.connectors.files import ParquetSource
from runtime.connectors.generator import EVENT_TIME_START_MS, key_names, zipf_cum_weights
from runtime.data import commands
from runtime.data.event_time import session_count, window_count
from runtime.data.generate import generate
from runtime.data.spark import DataError
from runtime.data.verify import EventTimeOptions, verify
from tests.support.spark_connect import SparkConnectServer

pytestmark = pytest.mark.integration

ROWS = 20_000
KEYS = 50


@pytest.fixture(scope="module")
def uniform(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "uniform"
    generate(spark, str(out), rows=ROWS, keys=KEYS, skew="uniform", partitions=2, seed=7)
    return out


def read_rows(path: Path) -> list[tuple[str, int, int]]:
    table = pq.read_table(str(path))
    return sorted(zip(*(table[c].to_pylist() for c in ("seq", "key", "event_time_ms")), strict=True))


def write_wordcount_output(input_dir: Path, out: Path) -> list[str]:
    """The exact word-count output of `input_dir`, as two sink subtasks' committed FileSink parts would hold it;
    returns the lines in the order written."""
    out.mkdir(parents=True)
    table = pq.read_table(str(input_dir), columns=["seq", "key"]).sort_by("seq")
    counts: Counter[str] = Counter()
    parts: list[list[str]] = [[], []]
    for key in table["key"].to_pylist():
        counts[key] += 1
        parts[hash(key) % 2].append(json.dumps([key, counts[key]], separators=(",", ":")))
    for i, lines in enumerate(parts):
        (out / f"part-{i}-0-0.jsonl").write_text("\n".join(lines) + "\n")
    # Files a sink has not committed are hidden; verify must never read them.
    (out / ".part-0-0-1.jsonl.inprogress").write_text('["k00",1]\nnot json\n')
    return parts[0] + parts[1]


def test_generate_uniform_is_complete_deterministic_and_splits_for_parquet_source(
        spark: Any, uniform: Path, tmp_path: Path) -> None:
    rows = read_rows(uniform)
    assert [r[0] for r in rows] == list(range(ROWS)), "seq must run over 0..rows-1 exactly once"
    assert all(t == EVENT_TIME_START_MS + s for s, _, t in rows)
    keys = Counter(k for _, k, _ in rows)
    assert set(keys) == set(key_names(KEYS))  # all 50 keys, named like the runtime's generator (k00..k49)
    assert max(keys.values()) < 2 * min(keys.values()), keys

    files = sorted(p for p in uniform.iterdir() if p.name.endswith(".parquet"))
    assert len(files) == 2
    for f in files:
        assert pq.ParquetFile(f).metadata.num_row_groups >= 4, "row groups are ParquetSource's units of work"
        seqs = pq.read_table(f)["seq"].to_pylist()
        assert seqs == sorted(seqs), "each file is sorted by seq"

    # The runtime's ParquetSource, split over two subtasks, reads every row exactly once.
    seen = []
    for subtask in range(2):
        source = ParquetSource(str(uniform))
        source.open(subtask, 2)
        while (batch := source.read_batch(1000)) is not None:
            seen += [(s, k, t) for k, s, t in batch]
    assert sorted(seen) == rows

    # Same arguments, another partitioning: the same rows. Another seed: other keys.
    again = generate(spark, str(tmp_path / "again"), rows=ROWS, keys=KEYS, partitions=3, seed=7)
    assert again.files == 3 and again.rows == ROWS
    assert read_rows(tmp_path / "again") == rows
    generate(spark, str(tmp_path / "other"), rows=ROWS, keys=KEYS, partitions=2, seed=8)
    assert read_rows(tmp_path / "other") != rows


def test_generate_zipf_follows_the_zipf_weights(spark: Any, tmp_path: Path) -> None:
    result = generate(spark, str(tmp_path / "zipf"), rows=ROWS, keys=KEYS, skew="zipf", zipf_exponent=1.1,
                      partitions=2, seed=3)
    assert "20,000 rows, 50 keys (zipf 1.1, seed 3) in 2 files" in result.summary()
    rows = read_rows(tmp_path / "zipf")
    assert [r[0] for r in rows] == list(range(ROWS))
    counts = Counter(k for _, k, _ in rows)
    assert set(counts) <= set(key_names(KEYS))
    cum = zipf_cum_weights(KEYS, 1.1)
    for rank in (0, 1, 2, 10):
        expected = ROWS * (cum[rank] - (cum[rank - 1] if rank else 0.0)) / cum[-1]
        assert abs(counts[f"k{rank:02d}"] - expected) < 5 * expected**0.5 + 5, (rank, counts, expected)
    # Deterministic too.
    generate(spark, str(tmp_path / "zipf2"), rows=ROWS, keys=KEYS, skew="zipf", partitions=4, seed=3)
    assert read_rows(tmp_path / "zipf2") == rows


def test_verify_finds_exactly_the_missing_duplicate_and_wrong_rows(
        spark: Any, uniform: Path, tmp_path: Path) -> None:
    good = tmp_path / "good"
    lines = write_wordcount_output(uniform, good)
    ok = verify(spark, str(uniform), str(good))
    assert ok.ok, ok.report()
    assert (ok.expected_rows, ok.output_rows, ok.output_files) == (ROWS, ROWS, 2)
    assert re.fullmatch(r"verify wordcount: 20,000 expected rows, 20,000 output rows: 0 missing, 0 duplicate, "
                        r"0 wrong -> OK \(2 part files, [0-9.]+ s\)", ok.summary()), ok.summary()

    def corrupted(name: str, change: Any) -> Any:
        out = tmp_path / name
        out.mkdir()
        changed = change(list(lines))
        half = len(changed) // 2
        (out / "part-0-0-0.jsonl").write_text("\n".join(changed[:half]) + "\n")
        (out / "part-1-0-0.jsonl").write_text("\n".join(changed[half:]) + "\n")
        return verify(spark, str(uniform), str(out))

    dropped = lines[100]
    r = corrupted("dropped", lambda ls: ls[:100] + ls[101:])
    assert (r.missing, r.duplicate, r.wrong, r.output_rows) == (1, 0, 0, ROWS - 1)
    assert [json.dumps(e["row"], separators=(",", ":")) for e in r.examples["missing"]] == [dropped]

    r = corrupted("duplicated", lambda ls: ls + [ls[7], ls[7], ls[9]])
    assert (r.missing, r.duplicate, r.wrong, r.output_rows) == (0, 3, 0, ROWS + 3)
    assert sorted(e["copies"] for e in r.examples["duplicate"]) == [2, 3]

    key, n = json.loads(lines[5])
    r = corrupted("changed", lambda ls: ls[:5] + [json.dumps([key, n + 100_000])] + ls[6:] + ["not json"])
    assert (r.missing, r.duplicate, r.wrong, r.output_rows) == (1, 0, 2, ROWS + 1)
    assert r.examples["missing"][0]["row"] == [key, n]
    assert {e["line"] for e in r.examples["wrong"]} == {json.dumps([key, n + 100_000]), "not json"}
    report = r.report()
    assert "-> FAILED" in report.splitlines()[0] and "  wrong     not json" in report
    assert r.to_json()["ok"] is False and r.to_json()["wrong"] == 2

    # FileSink(format="parquet") output is read too: tuples are columns f0, f1.
    pq_out = tmp_path / "parquet"
    pq_out.mkdir()
    pairs = [json.loads(line) for line in lines]
    pq.write_table(pa.table({"f0": [p[0] for p in pairs], "f1": [p[1] for p in pairs]}),
                   str(pq_out / "part-0-0-0.parquet"))
    assert verify(spark, str(uniform), str(pq_out)).ok


def write_rows(out: Path, parts: list[list[Any]]) -> Path:
    """FileSink-style committed part files, one per list, plus a hidden in-progress file verify must not read."""
    out.mkdir(parents=True)
    for i, rows in enumerate(parts):
        (out / f"part-{i}-000001-0-0.jsonl").write_text(
            "".join(json.dumps(list(r), separators=(",", ":")) + "\n" for r in rows))
    (out / ".part-0-000002-0-1.jsonl.inprogress").write_text('["zz",0,0,1]\n')
    return out


def read_in_order(path: Path) -> list[tuple[str, int, int]]:
    """The records as a windowed job reads them: ParquetSource at parallelism 1."""
    source = ParquetSource(str(path))
    source.open(0, 1)
    records: list[tuple[str, int, int]] = []
    while (batch := source.read_batch(1000)) is not None:
        records += batch
    return records


def test_jittered_input_and_windowed_verify_agree_with_the_simulated_job(spark: Any, uniform: Path,
                                                                         tmp_path: Path) -> None:
    # --jitter-ms: event times up to J behind T + seq, deterministic, keys and seq as without jitter.
    rows, jitter = 5000, 300
    generate(spark, str(tmp_path / "in"), rows=rows, keys=KEYS, partitions=3, seed=7, jitter_ms=jitter)
    plain = {s: k for s, k, _ in read_rows(uniform)}
    jittered = read_rows(tmp_path / "in")
    assert [(s, k) for s, k, _ in jittered] == [(s, plain[s]) for s in range(rows)]
    behind = Counter(EVENT_TIME_START_MS + s - t for s, _, t in jittered)
    assert min(behind) == 0 and max(behind) == jitter and len(behind) > jitter // 2, behind
    generate(spark, str(tmp_path / "again"), rows=rows, keys=KEYS, partitions=2, seed=7, jitter_ms=jitter)
    assert read_rows(tmp_path / "again") == jittered

    # ParquetSource at parallelism 1 reads what generate writes in seq order: the order verify assumes.
    records = read_in_order(tmp_path / "in")
    assert [r[1] for r in records] == list(range(rows))

    # The job's output as the record-by-record simulation (event_time.py) has it; Spark's closed form agrees.
    # Sliding windows with lateness (late firings and late records), then sessions (jitter <= max delay).
    options = EventTimeOptions(window_ms=200, slide_ms=100, max_delay_ms=100, allowed_lateness_ms=50,
                               late_output=str(tmp_path / "late"))
    fired, late = window_count(records, size=200, slide=100, max_delay_ms=100, allowed_lateness_ms=50)
    assert len(late) > 30 and len(fired) > len({r[:3] for r in fired}) + 30  # many late records, late firings
    write_rows(tmp_path / "out", [fired[::2], fired[1::2]])
    write_rows(tmp_path / "late", [late])
    result = verify(spark, str(tmp_path / "in"), str(tmp_path / "out"), "window-count", options)
    assert result.ok, result.report()
    assert (result.expected_rows, result.late and result.late.expected_rows) == (len(fired), len(late))
    assert result.summary().startswith(
        f"verify window-count (window 200 ms, slide 100 ms, max delay 100 ms, lateness 50 ms): {len(fired):,} "
        f"expected rows, {len(fired):,} output rows: 0 missing, 0 duplicate, 0 wrong -> OK (2 part files")

    sessions = session_count(records, gap=40, max_delay_ms=jitter)
    write_rows(tmp_path / "sessions", [sessions])
    result = verify(spark, str(tmp_path / "in"), str(tmp_path / "sessions"), "session-count",
                    EventTimeOptions(gap_ms=40, max_delay_ms=jitter))
    assert result.ok and result.expected_rows == len(sessions), result.report()


def test_windowed_verify_on_a_hand_computed_input(spark: Any, tmp_path: Path) -> None:
    t = EVENT_TIME_START_MS  # a multiple of 10: windows of 10 ms start at t, t + 10, ...
    # Read order = file order, then row order: the source sees a@3 a@12 a@5 | b@11 a@0 c@1 (ms after t).
    (tmp_path / "in").mkdir()
    for name, rows in (("part-00000.parquet", [("a", 0, 3), ("a", 1, 12), ("a", 2, 5)]),
                       ("part-00001.parquet", [("b", 3, 11), ("a", 4, 0), ("c", 5, 1)])):
        pq.write_table(pa.table({"key": [r[0] for r in rows], "seq": [r[1] for r in rows],
                                 "event_time_ms": [t + r[2] for r in rows]}), str(tmp_path / "in" / name))
    inp = str(tmp_path / "in")

    # Tumbling 10 ms, max delay 0: after a@12 the watermark is t+11, [t, t+10) fires with 1, and a@5, a@0, c@1
    # are late. Windows without records (c's) never fire.
    strict = write_rows(tmp_path / "strict", [[("a", t, t + 10, 1), ("a", t + 10, t + 20, 1)],
                                               [("b", t + 10, t + 20, 1)]])
    late = write_rows(tmp_path / "late", [[("a", 2, t + 5), ("a", 4, t), ("c", 5, t + 1)]])
    result = verify(spark, inp, str(strict), "window-count",
                    EventTimeOptions(window_ms=10, late_output=str(late)))
    assert result.ok, result.report()
    assert result.late is not None and (result.late.expected_rows, result.late.output_files) == (3, 1)

    # Allowed lateness 5: those three are kept; each fires its window again ([t, t+10) of a: 1, 2, 3; c's
    # window, first seen after its time, fires at once).
    lenient = [("a", t, t + 10, 1), ("a", t, t + 10, 2), ("a", t, t + 10, 3), ("c", t, t + 10, 1),
               ("a", t + 10, t + 20, 1), ("b", t + 10, t + 20, 1)]
    options = EventTimeOptions(window_ms=10, allowed_lateness_ms=5)
    result = verify(spark, inp, str(write_rows(tmp_path / "lenient", [lenient])), "window-count", options)
    assert result.ok, result.report()

    # A missing row, a duplicate and a wrong row (a count off by one) are named; so is a missing late record.
    changed = lenient[:1] + lenient[2:] + [lenient[4], ("b", t + 10, t + 20, 2)]
    changed.remove(("b", t + 10, t + 20, 1))
    bad = verify(spark, inp, str(write_rows(tmp_path / "bad", [changed])), "window-count",
                 EventTimeOptions(window_ms=10, allowed_lateness_ms=5, late_output=str(late)))
    assert (bad.missing, bad.duplicate, bad.wrong, bad.ok) == (2, 1, 1, False), bad.report()
    assert [e["row"] for e in bad.examples["missing"]] == [["a", t, t + 10, 2], ["b", t + 10, t + 20, 1]]
    assert bad.examples["duplicate"] == [{"row": ["a", t + 10, t + 20, 1], "copies": 2,
                                          "line": f'["a",{t + 10},{t + 20},1]'}]
    assert [e["line"] for e in bad.examples["wrong"]] == [f'["b",{t + 10},{t + 20},2]']
    assert bad.late is not None and (bad.late.expected_rows, bad.late.wrong) == (0, 3), bad.report()
    assert "  wrong     [\"a\",2," in bad.report()

    # Sessions, gap 5: a's 0, 3, 5 chain into [t, t+10), a@12 is its own; with a max delay of 20 no record is
    # behind the watermark. With max delay 0, a@5 (and b@11, a@0, c@1) are: session-count refuses the input.
    sessions = [("a", t, t + 10, 3), ("a", t + 12, t + 17, 1), ("b", t + 11, t + 16, 1), ("c", t + 1, t + 6, 1)]
    result = verify(spark, inp, str(write_rows(tmp_path / "sessions", [sessions])), "session-count",
                    EventTimeOptions(gap_ms=5, max_delay_ms=20))
    assert result.ok, result.report()
    refused = (r"session-count needs an input where no record is behind the watermark.*4 records are, the first "
               r"seq 2 \(event time 1700000000005, watermark 1700000000011\)")
    with pytest.raises(DataError, match=refused):
        verify(spark, inp, str(tmp_path / "sessions"), "session-count", EventTimeOptions(gap_ms=5))


def test_join_verify_counts_a_missing_and_a_duplicated_pair_and_exits_1(
        spark: Any, uniform: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Left: the shared uniform input (in order); right: another seed, event times up to 30 ms out of order.
    right = tmp_path / "right"
    generate(spark, str(right), rows=5000, keys=KEYS, partitions=2, seed=9, jitter_ms=30)
    lefts, rights = read_rows(uniform), read_rows(right)
    by_key: dict[str, list[tuple[int, int]]] = {}
    for seq, key, ts in rights:
        by_key.setdefault(key, []).append((ts, seq))
    interval = [(key, ls, rs) for ls, key, lt in lefts for rt, rs in by_key.get(key, ()) if lt - 3 <= rt <= lt + 5]

    def starts(ts: int) -> range:  # sliding 20 ms windows every 10 ms
        return range(ts - ts % 10 - 10, ts - ts % 10 + 1, 10)

    windows: dict[tuple[str, int], list[int]] = {}
    for seq, key, ts in rights:
        for start in starts(ts):
            windows.setdefault((key, start), []).append(seq)
    window = [(key, ls, rs) for ls, key, lt in lefts for start in starts(lt) for rs in windows.get((key, start), ())]
    assert len(interval) > 500 and len(window) > len(set(window)) > 500  # sliding: a pair in two windows

    interval_opts = EventTimeOptions(right_input=str(right), lower_ms=-3, upper_ms=5, max_delay_ms=30)
    window_opts = EventTimeOptions(right_input=str(right), window_ms=20, slide_ms=10, max_delay_ms=30)
    for query, rows, opts in (("interval-join", interval, interval_opts), ("window-join", window, window_opts)):
        ok = verify(spark, str(uniform), str(write_rows(tmp_path / query, [rows[::2], rows[1::2]])), query, opts)
        assert ok.ok and ok.expected_rows == len(rows), ok.report()
    assert ok.summary().startswith(f"verify window-join (window 20 ms, slide 10 ms, max delay 30 ms): "
                                   f"{len(window):,} expected rows")

    # The CLI's exit status and line, in this process (the shared session stays up).
    monkeypatch.setattr(commands, "stop_session", lambda session: None)
    args = ["data", "verify", "--input", str(uniform), "--query", "interval-join", "--right-input", str(right),
            "--lower-ms", "-3", "--upper-ms", "5", "--max-delay-ms", "30", "--output"]
    missing = write_rows(tmp_path / "missing", [interval[:7] + interval[8:]])
    assert main([*args, str(missing)]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert re.match(rf"verify interval-join \(bounds \[-3, 5\] ms, max delay 30 ms\): {len(interval):,} expected "
                    rf"rows, {len(interval) - 1:,} output rows: 1 missing, 0 duplicate, 0 wrong -> FAILED", line), line
    duplicated = write_rows(tmp_path / "duplicated", [interval + [interval[3]]])
    assert main([*args, str(duplicated)]) == 1
    assert ": 0 missing, 1 duplicate, 0 wrong -> FAILED" in capsys.readouterr().out
    # With max delay 0 the right input has records behind its watermark: refused, exit status 2.
    assert main([*args[:-2], "0", "--output", str(missing)]) == 2
    assert re.match(r"sluice data verify: interval-join needs inputs where no record is behind its source's "
                    r"watermark \(.*\): in --right-input, [0-9,]+ records are", capsys.readouterr().err)


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "data", *args], cwd=cwd,
                          env=env or child_env("unused", None), capture_output=True, text=True, timeout=180)


def test_cli_generate_then_verify(spark: Any, spark_connect: SparkConnectServer, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # generate as a command of its own (quiet, nothing left in the current directory), on the run's warm Spark
    # Connect server rather than a JVM of its own; the relative output path means this directory, not the server's
    gen = _cli(["generate", "in", "--rows", "5000", "--keys", "20", "--skew", "zipf", "--partitions", "2",
                "--seed", "1", "--jitter-ms", "40", "--master", spark_connect.url], tmp_path)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert re.fullmatch(r"generated 5,000 rows, 20 keys \(zipf 1\.1, seed 1, jitter 40 ms\) in 2 files / \d+ row "
                        r"groups at "
                        rf"{re.escape(str(tmp_path / 'in'))} in [0-9.]+ s\n", gen.stdout), gen.stdout
    assert "Traceback" not in gen.stderr and " INFO " not in gen.stderr, gen.stderr  # Spark stays quiet
    # verify through the CLI in this process (the shared session stays up: one JVM start less), the windowed query
    # as scripts/chaos.sh calls it: the simulated job's firings and late records, one late record missing. (The
    # wordcount verdict's summary line: tests/chaos/test_chaos.py.)
    fired, late = window_count(read_in_order(tmp_path / "in"), size=50, max_delay_ms=10, allowed_lateness_ms=5)
    assert late, "a jitter of 40 ms behind a 10 ms delay must leave late records"
    write_rows(tmp_path / "windows", [fired])
    write_rows(tmp_path / "late", [late[1:]])  # one late record is missing
    monkeypatch.setattr(commands, "stop_session", lambda session: None)
    status = main(["data", "verify", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "windows"),
                   "--query", "window-count", "--window-ms", "50", "--max-delay-ms", "10", "--allowed-lateness-ms",
                   "5", "--late-output", str(tmp_path / "late"), "--json"])
    out = capsys.readouterr().out
    assert status == 1, out
    result = json.loads(out)
    assert (result["ok"], result["missing"], result["wrong"], result["expected_rows"]) == (False, 0, 0, len(fired))
    assert (result["late"]["ok"], result["late"]["missing"]) == (False, 1)
    assert result["late"]["examples"]["missing"][0]["row"] == list(late[0])
    assert not any(p.name in ("spark-warehouse", "metastore_db") for p in tmp_path.iterdir())


def test_cli_errors_exit_2_before_spark_starts(tmp_path: Path) -> None:
    no_java = {**child_env("unused", None), "PATH": "/usr/bin/nonexistent", "JAVA_HOME": ""}
    r = _cli(["generate", "in", "--rows", "10", "--keys", "2"], tmp_path, env=no_java)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "sluice data needs Java 17" in r.stderr and "JAVA_HOME" in r.stderr, r.stderr
    assert not (tmp_path / "in").exists()

    r = _cli(["verify", "--input", "missing", "--output", "out"], tmp_path)
    assert r.returncode == 2 and "no input at missing" in r.stderr, r.stderr
    r = _cli(["verify", "--input", "missing", "--output", "out", "--query", "window-count"], tmp_path)
    assert r.returncode == 2 and "--query window-count needs --window-ms > 0" in r.stderr, r.stderr
    r = _cli(["verify", "--input", "missing", "--output", "out", "--query", "session-count", "--gap-ms", "5",
              "--allowed-lateness-ms", "3"], tmp_path)
    assert r.returncode == 2 and "--query session-count takes no --allowed-lateness-ms" in r.stderr, r.stderr
    r = _cli(["verify", "--input", "missing", "--output", "out", "--query", "interval-join", "--lower-ms", "0",
              "--upper-ms", "5"], tmp_path)
    assert r.returncode == 2 and "--query interval-join joins two inputs: give the second with --right-input" \
        in r.stderr, r.stderr

    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    r = _cli(["generate", "precious", "--rows", "10", "--keys", "2"], tmp_path)
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr, r.stderr
    assert (tmp_path / "precious" / "notes.txt").exists()
    assert os.listdir(tmp_path / "precious") == ["notes.txt"]


def test_verify_reads_delta_and_iceberg_tables_through_arrow(spark: Any, uniform: Path, tmp_path: Path) -> None:
    """The word-count output committed to a Delta table by the DeltaSink itself verifies like part files; an
    Iceberg table's rows come into Spark the same way (key, values, line), a row committed twice twice."""
    pytest.importorskip("deltalake")
    pytest.importorskip("pyiceberg")
    from runtime.connectors.delta import DeltaSink
    from runtime.connectors.iceberg import IcebergSink
    from runtime.data.tables import OutputTable, table_frame
    from tests.support.iceberg_tables import make_counts_table, sqlite_catalog

    pairs = [tuple(json.loads(line)) for line in write_wordcount_output(uniform, tmp_path / "files")]
    catalog = sqlite_catalog(tmp_path / "iceberg")
    make_counts_table(catalog)
    for sink, rows in [(DeltaSink(str(tmp_path / "delta"), columns=["key", "n"]), pairs),
                       (IcebergSink(catalog, "db.counts", columns=["key", "n"]), [("k1", 1), ("k1", 2), ("k1", 2)])]:
        sink.open(0, 1, 0)
        for row in rows:
            sink.write(row)
        sink.snapshot_state(1)
        sink.commit(1)
        sink.drain()
        sink.close()
    delta = verify(spark, str(uniform), str(tmp_path / "delta"), table=OutputTable("delta", str(tmp_path / "delta")))
    assert delta.ok and (delta.output_rows, delta.output_files) == (ROWS, 1), delta.report()
    iceberg = table_frame(spark, OutputTable.parse("iceberg", "db.counts", json.dumps(catalog)), 1)
    assert sorted((r["key"], r["v0"], r["line"]) for r in iceberg.collect()) == [
        ("k1", 1, '["k1","1"]'), ("k1", 2, '["k1","2"]'), ("k1", 2, '["k1","2"]')]
    with pytest.raises(DataError, match="needs --catalog"):
        OutputTable.parse("iceberg", "db.counts", None)
