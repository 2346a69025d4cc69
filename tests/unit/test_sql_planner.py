"""Planning SQL onto DataStream operators (runtime/sql/logical.py, physical.py, changelog.py, explain.py): the
operators a query becomes, their uids, changelog modes and sinks' refusals; then what the plans compute, run
through real operator chains in this process (tests/support/sql_chain.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.explain import explain  # noqa: E402
from runtime.sql.session import session_of  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

BIDS = """
CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');
"""
PRINT = "CREATE TABLE out1 ({cols}) WITH ('connector' = 'print');\n"


def job_of(text: str) -> Job:
    job = Job("q")
    job.sql(text)
    return job


def test_a_window_aggregation_becomes_source_window_calc_and_sink_with_uids_from_the_plan() -> None:
    text = BIDS + PRINT.format(cols="auction BIGINT, ws TIMESTAMP(3), c BIGINT") + """
        INSERT INTO out1 SELECT auction, window_start, COUNT(*)
        FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end;
    """
    job = job_of(text)
    assert [(n.kind, n.name.split("(")[0]) for n in job.nodes] == [
        ("source", "Source: bids"), ("keyed_process", "WindowAggregate"), ("map", "Calc"), ("sink", "Sink: out1")]
    assert job.nodes[0].watermarks is not None and job.nodes[0].watermarks.max_delay_ms == 999
    uids = [n.uid for n in job.nodes]
    assert all(u.startswith("sql-") for u in uids) and len(set(uids)) == len(uids)
    # the same query in another script (another statement before it) keeps its uids: a savepoint finds its state
    other = job_of(BIDS + PRINT.format(cols="auction BIGINT, ws TIMESTAMP(3), c BIGINT").replace("out1", "out0")
                   + "INSERT INTO out0 SELECT auction, ts, price FROM bids WHERE price > 3;\n"
                   + text.replace(BIDS, ""))
    assert set(uids) <= {n.uid for n in other.nodes}
    # a changed query gets new uids downstream of the change: it does not take the old query's state
    changed = job_of(text.replace("INTERVAL '10' SECOND", "INTERVAL '20' SECOND"))
    assert changed.nodes[0].uid == uids[0] and changed.nodes[1].uid != uids[1]


def test_an_append_only_sink_refuses_an_updating_query_at_planning_time() -> None:
    text = BIDS + """CREATE TABLE totals (auction BIGINT, c BIGINT)
        WITH ('connector' = 'filesystem', 'path' = 'out', 'format' = 'json');
        INSERT INTO totals SELECT auction, COUNT(*) FROM bids GROUP BY auction;"""
    job = Job("q")
    with pytest.raises(SqlError) as caught:
        job.sql(text)
    assert str(caught.value) == (
        "line 6, column 9: Table sink 'default_catalog.default_database.totals' doesn't support consuming update "
        "changes which is produced by node GroupAggregate(groupBy=[auction], select=[COUNT(*)])")
    assert job.nodes == []  # nothing of the script was added
    # with a primary key the filesystem table upserts: the same query plans
    upsert = job_of(text.replace("c BIGINT)", "c BIGINT, PRIMARY KEY (auction) NOT ENFORCED)"))
    assert upsert.nodes[-1].kind == "sink"


def test_a_statement_set_reads_a_table_once_and_explain_shows_modes_keys_state_and_watermarks() -> None:
    text = BIDS + PRINT.format(cols="auction BIGINT, c BIGINT") + """
        CREATE TABLE out2 (bidder BIGINT, s BIGINT) WITH ('connector' = 'blackhole');
        SET 'parallelism.default' = '3';
        EXECUTE STATEMENT SET BEGIN
          INSERT INTO out1 SELECT auction, COUNT(*) FROM bids GROUP BY auction;
          INSERT INTO out2 SELECT bidder, SUM(price) FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts),
            INTERVAL '5' SECOND)) GROUP BY bidder, window_start, window_end;
        END;"""
    job = job_of(text)
    assert [n.kind for n in job.nodes].count("source") == 1
    assert {n.parallelism for n in job.nodes} == {3}
    shown = explain(session_of(job))
    assert "GroupAggregate(groupBy=[auction], select=[COUNT(*)])  changelog=[I,UB,UA]" in shown
    assert "keys auction, state per key: COUNT(*)" in shown
    assert "WindowAggregate(groupBy=[bidder], window=[TUMBLE(time_col=[ts], size=[5000 ms])], " \
           "select=[SUM(price)])  changelog=[I]" in shown
    assert "watermarks ts - 1000 ms, every 200 ms" in shown
    assert "(reused)" in shown  # the second query's source is the first one's


def test_watermark_interval_follows_set_pipeline_auto_watermark_interval() -> None:
    query = PRINT.format(cols="auction BIGINT, c BIGINT") + "INSERT INTO out1 SELECT auction, price FROM bids;"

    def strategy(settings: str) -> Any:
        job = job_of(BIDS + settings + query)
        return next(n for n in job.nodes if n.kind == "source").watermarks

    assert strategy("").emit_interval_ms == 200  # Flink's default: periodic
    assert strategy("SET 'pipeline.auto-watermark-interval' = '50ms';").emit_interval_ms == 50
    assert strategy("SET 'pipeline.auto-watermark-interval' = '0';").emit_interval_ms is None  # after each row
    with pytest.raises(SqlError, match="pipeline.auto-watermark-interval': not a duration: 'soon'"):
        job_of(BIDS + "SET 'pipeline.auto-watermark-interval' = 'soon';" + query)


@pytest.mark.parametrize(("query", "message"), [
    ("INSERT INTO out1 SELECT auction, bidder FROM bids GROUP BY auction",
     "Expression 'bidder' is not being grouped"),
    ("INSERT INTO out1 SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE plain, DESCRIPTOR(ts), INTERVAL '1' "
     "SECOND)) GROUP BY auction, window_start, window_end",
     "TUMBLE: column ts is not a time attribute: window table functions need the rowtime column of a table with "
     "a WATERMARK FOR it, or a processing-time column (AS PROCTIME())"),
    ("INSERT INTO out1 SELECT auction, COUNT(*) FROM TABLE(CUMULATE(TABLE bids, DESCRIPTOR(ts), INTERVAL '3' "
     "SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end",
     "CUMULATE: the window size (10000 ms) must be an integral multiple of the step (3000 ms)"),
    ("INSERT INTO out1 SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' "
     "SECOND)) GROUP BY auction",
     "a GROUP BY over a window table function must group by window_start and window_end"),
    ("INSERT INTO out1 SELECT auction, price FROM bids ORDER BY price",
     "ORDER BY in a streaming query must start with the rowtime attribute ascending (Flink's sort on a time "
     "attribute), or have a LIMIT"),
    ("INSERT INTO nope SELECT auction, price FROM bids",
     "Object 'nope' not found: no table or view of that name was created (tables: bids, out1, plain)"),
    ("SELECT * FROM bids", "a SELECT on its own has no sink here: INSERT INTO a table (a 'print' table shows rows)"),
    ("INSERT INTO out1 SELECT auction FROM bids",
     "Column types of query result and sink for 'default_catalog.default_database.out1' do not match: the query "
     "has 1 columns (auction), the sink 2 (auction, c)"),
])
def test_queries_that_cannot_be_planned_say_why(query: str, message: str) -> None:
    text = BIDS + "CREATE TABLE plain (auction BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'datagen');\n" \
        + PRINT.format(cols="auction BIGINT, c BIGINT") + query + ";"
    with pytest.raises(SqlError) as caught:
        job_of(text)
    assert caught.value.message == message
    assert caught.value.line == 6


# -- what the plans compute, through real chains ----------------------------------------------------------------


def tail(query: str, cols: str) -> SqlTailChain:
    return SqlTailChain(BIDS + PRINT.format(cols=cols) + query)


def rows(ts_and_values: list[tuple[int, int, int, int]]) -> list[tuple[int, Any]]:
    """(auction, bidder, price, ts) -> (timestamp, row)."""
    return [(t, (a, b, p, t)) for a, b, p, t in ts_and_values]


def printed(capsys: Any) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_tumble_window_aggregation_emits_each_window_once_when_the_watermark_passes_it(capsys: Any) -> None:
    chain = tail("INSERT INTO out1 SELECT auction, window_start, window_end, COUNT(*), SUM(price), MAX(price), "
                 "COUNT(DISTINCT bidder) FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) "
                 "GROUP BY auction, window_start, window_end;",
                 "auction BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), c BIGINT, s BIGINT, m BIGINT, d BIGINT")
    chain.feed(rows([(1, 10, 5, 1000), (1, 11, 7, 2000), (2, 10, 3, 9999), (1, 10, 1, 10_000)]))
    chain.watermark(9998)
    assert printed(capsys) == []
    chain.watermark(9999)
    assert printed(capsys) == ["+I[1, 1970-01-01 00:00:00, 1970-01-01 00:00:10, 2, 12, 7, 2]",
                               "+I[2, 1970-01-01 00:00:00, 1970-01-01 00:00:10, 1, 3, 3, 1]"]
    chain.feed(rows([(1, 12, 100, 5000)]))  # late: its window fired; dropped, as Flink drops it
    chain.watermark(30_000)
    assert printed(capsys) == ["+I[1, 1970-01-01 00:00:10, 1970-01-01 00:00:20, 1, 1, 1, 1]"]


def test_hop_and_cumulate_put_a_row_in_every_window_it_falls_in(capsys: Any) -> None:
    hop = tail("INSERT INTO out1 SELECT window_start, window_end, COUNT(*) FROM TABLE(HOP(TABLE bids, "
               "DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND)) GROUP BY window_start, window_end;",
               "ws TIMESTAMP(3), we TIMESTAMP(3), c BIGINT")
    hop.feed(rows([(1, 1, 1, 7000)]))
    hop.watermark(100_000)
    assert printed(capsys) == ["+I[1970-01-01 00:00:00, 1970-01-01 00:00:10, 1]",
                               "+I[1970-01-01 00:00:05, 1970-01-01 00:00:15, 1]"]
    cumulate = tail("INSERT INTO out1 SELECT window_start, window_end, SUM(price) FROM TABLE(CUMULATE(TABLE bids, "
                    "DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND)) GROUP BY window_start, window_end;",
                    "ws TIMESTAMP(3), we TIMESTAMP(3), s BIGINT")
    cumulate.feed(rows([(1, 1, 1, 500), (1, 1, 10, 2500), (1, 1, 100, 5999)]))
    cumulate.watermark(100_000)
    assert printed(capsys) == ["+I[1970-01-01 00:00:00, 1970-01-01 00:00:02, 1]",
                               "+I[1970-01-01 00:00:00, 1970-01-01 00:00:04, 11]",
                               "+I[1970-01-01 00:00:00, 1970-01-01 00:00:06, 111]"]


def test_session_windows_merge_rows_closer_than_the_gap_per_partition(capsys: Any) -> None:
    chain = tail("INSERT INTO out1 SELECT bidder, window_start, window_end, COUNT(*) FROM TABLE(SESSION(TABLE bids "
                 "PARTITION BY bidder, DESCRIPTOR(ts), INTERVAL '3' SECOND)) GROUP BY bidder, window_start, "
                 "window_end;", "bidder BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), c BIGINT")
    chain.feed(rows([(1, 7, 1, 1000), (1, 7, 1, 3000), (1, 8, 1, 3500), (1, 7, 1, 9000)]))
    chain.watermark(100_000)
    assert sorted(printed(capsys)) == ["+I[7, 1970-01-01 00:00:01, 1970-01-01 00:00:06, 2]",
                                       "+I[7, 1970-01-01 00:00:09, 1970-01-01 00:00:12, 1]",
                                       "+I[8, 1970-01-01 00:00:03.5, 1970-01-01 00:00:06.5, 1]"]


def test_an_unbounded_group_by_emits_an_updating_changelog_and_having_filters_it(capsys: Any) -> None:
    chain = tail("INSERT INTO out1 SELECT auction, COUNT(*), MAX(price) FROM bids GROUP BY auction "
                 "HAVING COUNT(*) < 3;", "auction BIGINT, c BIGINT, m BIGINT")
    chain.feed(rows([(1, 0, 5, 1), (2, 0, 1, 2), (1, 0, 9, 3), (1, 0, 2, 4)]))
    assert printed(capsys) == ["+I[1, 1, 5]", "+I[2, 1, 1]", "-U[1, 1, 5]", "+U[1, 2, 9]", "-U[1, 2, 9]"]


def test_views_udfs_case_and_cast_in_one_projection(capsys: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sql_udfs_x.py").write_text("def times_ten(v):\n    return None if v is None else v * 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        chain = tail("""CREATE TEMPORARY FUNCTION times_ten AS 'sql_udfs_x.times_ten' LANGUAGE PYTHON;
            CREATE VIEW pricey AS SELECT auction, price, ts FROM bids WHERE price > 2;
            INSERT INTO out1 SELECT auction, times_ten(price),
              CASE WHEN price > 5 THEN 'high' ELSE CAST(price AS STRING) END, ts
            FROM pricey;""", "auction BIGINT, p BIGINT, label STRING, ts TIMESTAMP(3)")
        chain.feed(rows([(1, 0, 1, 1), (1, 0, 3, 2), (1, 0, 8, 3)]))
        assert printed(capsys) == ["+I[1, 30, 3, 1970-01-01 00:00:00.002]",
                                   "+I[1, 80, high, 1970-01-01 00:00:00.003]"]
    finally:
        sys.modules.pop("sql_udfs_x", None)


WEIGHTED_AVG = """
class WeightedAvg:
    \"\"\"PyFlink's AggregateFunction example: accumulate changes the accumulator in place.\"\"\"
    result_type = "BIGINT"

    def create_accumulator(self):
        return [0, 0]

    def accumulate(self, acc, value, weight):
        acc[0] += value * weight
        acc[1] += weight

    def merge(self, acc, others):
        for other in others:
            acc[0] += other[0]
            acc[1] += other[1]

    def get_value(self, acc):
        return None if acc[1] == 0 else acc[0] // acc[1]


class NoMerge:
    def create_accumulator(self):
        return []

    def accumulate(self, acc, value):
        acc.append(value)

    def get_value(self, acc):
        return len(acc)
"""


@pytest.fixture
def udaf_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "sql_udafs_x.py").write_text(WEIGHTED_AVG)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "sql_udafs_x"
    sys.modules.pop("sql_udafs_x", None)


def test_a_python_aggregate_function_in_a_group_by_and_a_window_aggregation(capsys: Any, udaf_module: str) -> None:
    create = f"CREATE TEMPORARY FUNCTION wavg AS '{udaf_module}.WeightedAvg' LANGUAGE PYTHON;\n"
    chain = tail(create + "INSERT INTO out1 SELECT auction, wavg(price, bidder), COUNT(*) FROM bids GROUP BY auction;",
                 "auction BIGINT, w BIGINT, c BIGINT")
    chain.feed(rows([(1, 1, 10, 1), (2, 3, 4, 2), (1, 3, 2, 3)]))
    # (10*1 + 2*3) // 4 = 4: each update from the accumulator of the group's rows so far, none changed in place
    assert printed(capsys) == ["+I[1, 10, 1]", "+I[2, 4, 1]", "-U[1, 10, 1]", "+U[1, 4, 2]"]

    chain = tail(create + "INSERT INTO out1 SELECT auction, wavg(price, bidder) FILTER (WHERE price > 1), "
                 "window_end FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) "
                 "GROUP BY auction, window_start, window_end;", "auction BIGINT, w BIGINT, e TIMESTAMP(3)")
    chain.feed(rows([(1, 1, 10, 1000), (1, 5, 1, 2000), (1, 2, 4, 3000), (1, 1, 7, 12_000)]))
    chain.watermark(20_000)
    assert printed(capsys) == ["+I[1, 6, 1970-01-01 00:00:10]", "+I[1, 7, 1970-01-01 00:00:20]"]


def test_python_aggregate_functions_misused_say_why(capsys: Any, udaf_module: str) -> None:
    create = (f"CREATE TEMPORARY FUNCTION wavg AS '{udaf_module}.WeightedAvg' LANGUAGE PYTHON;\n"
              f"CREATE TEMPORARY FUNCTION nomerge AS '{udaf_module}.NoMerge' LANGUAGE PYTHON;\n")
    with pytest.raises(SqlError, match=r"aggregate WAVG\(price, bidder\) is not allowed here"):
        job_of(BIDS + PRINT.format(cols="auction BIGINT") + create +
               "INSERT INTO out1 SELECT auction FROM bids WHERE wavg(price, bidder) > 1;")
    with pytest.raises(SqlError, match="DISTINCT is supported in COUNT only"):
        job_of(BIDS + PRINT.format(cols="auction BIGINT, w BIGINT") + create +
               "INSERT INTO out1 SELECT auction, nomerge(DISTINCT price) FROM bids GROUP BY auction;")
    # a session window merges accumulators: one without merge() fails naming itself, at the first merge
    chain = tail(create + "INSERT INTO out1 SELECT auction, nomerge(price) FROM TABLE(SESSION(TABLE bids, "
                 "DESCRIPTOR(ts), INTERVAL '5' SECOND)) GROUP BY auction, window_start, window_end;",
                 "auction BIGINT, n BIGINT")
    with pytest.raises(SqlError, match=r"NOMERGE\(price\): the aggregate function has no merge"):
        chain.feed(rows([(1, 0, 1, 1000), (1, 0, 2, 9000), (1, 0, 3, 5000)]))
        chain.watermark(30_000)


TABLE_FUNCTIONS = """
def words(text):
    for word in text.split():
        yield word


class WordLengths:
    result_types = ["STRING", "INT"]

    def eval(self, text, at_least):
        for word in text.split():
            if len(word) >= at_least:
                yield word, len(word)
"""


def test_lateral_table_joins_each_row_with_the_rows_its_table_function_yields(
        capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sql_udtfs_x.py").write_text(TABLE_FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    script = ("CREATE TABLE lines (id BIGINT, line STRING) WITH ('connector' = 'datagen');\n"
              "CREATE FUNCTION words AS 'sql_udtfs_x.words' LANGUAGE PYTHON;\n"
              "CREATE FUNCTION lengths AS 'sql_udtfs_x.WordLengths' LANGUAGE PYTHON;\n")
    try:
        chain = SqlTailChain(script + PRINT.format(cols="id BIGINT, w STRING") +
                             "INSERT INTO out1 SELECT id, w FROM lines, LATERAL TABLE(words(line)) AS T(w) "
                             "WHERE w <> 'the';")
        assert chain.names[0].startswith("Correlate(invocation=[WORDS(line)], joinType=[INNER])"), chain.names
        chain.feed([(1, "the quick fox"), (2, ""), (3, "jumps")])
        assert printed(capsys) == ["+I[1, quick]", "+I[1, fox]", "+I[3, jumps]"]

        chain = SqlTailChain(script + PRINT.format(cols="id BIGINT, w STRING, n INT") +
                             "INSERT INTO out1 SELECT id, T.word, n + 0 FROM lines LEFT JOIN "
                             "LATERAL TABLE(lengths(line, 4)) AS T(word, n) ON TRUE;")
        chain.feed([(1, "the quick fox"), (2, "a b")])
        assert printed(capsys) == ["+I[1, quick, 5]", "+I[2, <NULL>, <NULL>]"]

        for query, message in [
                ("SELECT id, w FROM lines JOIN LATERAL TABLE(words(line)) AS T(w) ON w = 'x'",
                 "a join with LATERAL TABLE takes ON TRUE only: filter its rows in WHERE"),
                ("SELECT id, w FROM lines, LATERAL TABLE(nope(line)) AS T(w)",
                 "No match found for function signature nope"),
                ("SELECT id, w FROM lines, LATERAL TABLE(lengths(line, 1)) AS T(w)",
                 r"LENGTHS\(line, 1\) has 2 columns \(result_types\), the alias names 1")]:
            with pytest.raises(SqlError, match=message):
                job_of(script + PRINT.format(cols="id BIGINT, w STRING") + f"INSERT INTO out1 {query};")
    finally:
        sys.modules.pop("sql_udtfs_x", None)


def test_streams_cross_into_sql_and_tables_back_out() -> None:
    from runtime.api import BoundedOutOfOrderness, GeneratorSource

    job = Job("cross")
    stream = job.source(GeneratorSource(count=10), watermarks=BoundedOutOfOrderness(0, lambda r: r[2]))
    job.from_stream("gen", stream, "word STRING, seq BIGINT, ts TIMESTAMP(3)", rowtime="ts")
    job.sql("""CREATE VIEW counts AS SELECT word, window_start, COUNT(*) AS n
               FROM TABLE(TUMBLE(TABLE gen, DESCRIPTOR(ts), INTERVAL '1' SECOND))
               GROUP BY word, window_start, window_end;""")
    rows = job.table("counts")
    assert job.nodes[rows.node_id].name.startswith("Calc(select=[word, window_start, COUNT(*) AS n])")
    with pytest.raises(SqlError, match="rowtime 'seq' is not a TIMESTAMP column"):
        job.from_stream("other", stream, "word STRING, seq BIGINT", rowtime="seq")


def test_set_options_reach_the_job_and_the_checkpoint_flags() -> None:
    import argparse

    from runtime.cli.sql_command import apply_set_options

    job = job_of("SET 'parallelism.default' = '3'; SET 'pipeline.name' = 'nightly'; "
                 "SET 'state.backend.type' = 'rocksdb';" + BIDS
                 + PRINT.format(cols="auction BIGINT") + "INSERT INTO out1 SELECT auction FROM bids;")
    assert (job.default_parallelism, job.name, job.state_backend) == (3, "nightly", "rocksdb")
    defaults = {"checkpoint_interval": None, "checkpoint_mode": None}  # flags not given
    args = argparse.Namespace(**defaults)
    assert apply_set_options(args, {"execution.checkpointing.interval": "30 s",
                                    "execution.checkpointing.unaligned.enabled": "true"}) is None
    assert (args.checkpoint_interval, args.checkpoint_mode) == (30.0, "unaligned")
    flagged = argparse.Namespace(checkpoint_interval=5.0, checkpoint_mode=None)  # --checkpoint-interval 5s
    apply_set_options(flagged, {"execution.checkpointing.interval": "30s"})
    assert flagged.checkpoint_interval == 5.0  # the command line wins
    assert apply_set_options(argparse.Namespace(**defaults), {"execution.checkpointing.mode": "MAYBE"}) == \
        "SET 'execution.checkpointing.mode' = 'MAYBE': EXACTLY_ONCE or AT_LEAST_ONCE"
