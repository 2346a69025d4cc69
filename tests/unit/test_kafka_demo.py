"""The Kafka demo's verdict (runtime/cli/kafka_demo.verify_counts): exact answers for exact, lost, repeated and
foreign output."""

from __future__ import annotations

from runtime.cli.kafka_demo import input_records, verify_counts

EXPECTED = {"a": 3, "b": 1}


def test_every_count_once_is_exact() -> None:
    verdict = verify_counts(EXPECTED, [("a", 1), ("b", 1), ("a", 2), ("a", 3)])
    assert (verdict.ok, verdict.expected_rows, verdict.got_rows, verdict.wrong_keys) == (True, 4, 4, {})
    assert verdict.summary() == "4 committed records, every key's counts 1..n exactly once"


def test_a_lost_a_repeated_and_a_foreign_record_are_each_named() -> None:
    verdict = verify_counts(EXPECTED, [("a", 1), ("a", 3), ("b", 1), ("b", 1), ("c", 1)])
    assert not verdict.ok
    assert verdict.wrong_keys == {
        "a": {"expected": 3, "got": 2, "missing": [2], "duplicated": [], "unexpected": []},
        "b": {"expected": 1, "got": 2, "missing": [], "duplicated": [1], "unexpected": []},
        "c": {"expected": 0, "got": 1, "missing": [], "duplicated": [], "unexpected": [1]},
    }
    assert verdict.summary().startswith("5 committed records where 4 were expected; 3 keys wrong")


def test_nothing_written_is_not_exact() -> None:
    verdict = verify_counts(EXPECTED, [])
    assert not verdict.ok and sorted(verdict.wrong_keys) == ["a", "b"]


def test_the_input_is_the_same_every_run() -> None:
    records = input_records(2000)
    assert records == input_records(2000) and [i for _, i in records] == list(range(2000))
    assert len({k for k, _ in records}) <= 1000
