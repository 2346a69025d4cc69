"""scripts/bench_windows.py's accounting of time, alike for Sluice and Flink: records/s with start-up and without
(the job's fixed cost fitted from the same measurement at two input sizes); and scripts/bench_ab.py's pairing of
two trees' runs round by round; the check that both engines emit the same rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_windows import accounting, startup_s  # noqa: E402


def test_the_fixed_cost_is_fitted_through_the_medians_of_the_two_sizes() -> None:
    # medians 2.5 s at 1,000 records and 1.1 s at 100: 900 records in 1.4 s, so s0 = 1.1 - 100 / (900 / 1.4)
    assert startup_s(1000, [3.0, 2.0, 2.5], 100, [1.2, 1.0, 1.1]) == pytest.approx(1.1 - 1.4 / 9)


def test_with_and_without_start_up_per_run_and_the_median_is_the_marginal_rate() -> None:
    acc = accounting(1000, [3.0, 2.0, 2.5], 100, [1.2, 1.0, 1.1])
    s0 = 1.1 - 1.4 / 9
    assert acc["startup_s"] == pytest.approx(s0)
    assert acc["with_startup"] == {"median": 400.0, "slowest": pytest.approx(1000 / 3)}
    assert acc["without_startup"]["median"] == pytest.approx(900 / 1.4)  # (1000 - 100) / (2.5 - 1.1)
    assert acc["without_startup"]["slowest"] == pytest.approx(1000 / (3.0 - s0))


def test_no_figures_without_start_up_when_the_sizes_give_no_rate() -> None:
    assert accounting(1000, [2.0], 0, [])["without_startup"] is None  # no small runs
    assert startup_s(1000, [2.0], 100, [2.5]) is None  # the small runs as slow as the large one
    assert startup_s(100, [2.0], 100, [1.0]) is None  # the same size
    acc = accounting(1000, [2.0, 4.0], 0, [])
    assert acc["startup_s"] is None and acc["with_startup"] == {"median": 375.0, "slowest": 250.0}


def test_a_negative_fit_is_reported_as_it_is() -> None:
    # 1,000 records in 1 s and 100 in 0.05 s: the small runs were relatively fast, s0 < 0
    assert startup_s(1000, [1.0], 100, [0.05]) == pytest.approx(0.05 - 100 * 0.95 / 900)


def test_the_ab_summary_pairs_the_runs_of_each_round() -> None:
    from bench_ab import paired_summary

    a = [{"cpu_us_per_record": c, "records_per_s": r} for c, r in ((2.0, 100.0), (1.0, 300.0), (4.0, 50.0))]
    b = [{"cpu_us_per_record": c, "records_per_s": r} for c, r in ((1.0, 200.0), (1.5, 250.0), (3.0, 60.0))]
    s = paired_summary(a, b)
    assert s["cpu_ratios_b_over_a"] == [0.5, 1.5, 0.75]
    assert s["cpu_ratio_b_over_a_median"] == 0.75 and s["rounds_b_cheaper"] == 2
    assert s["a"] == {"cpu_us_per_record_median": 2.0, "cpu_us_per_record_slowest": 4.0,
                      "records_per_s_median": 100.0, "records_per_s_slowest": 50.0}
    assert s["b"]["cpu_us_per_record_median"] == 1.5 and s["b"]["records_per_s_slowest"] == 60.0


def test_a_sluice_run_whose_rows_differ_from_flink_s_on_the_same_input_stops_the_benchmark() -> None:
    from bench_windows import check_rows

    flink = {2_000_000: 200_000, 20_000: 2_000}  # rows Flink emitted, by input size
    check_rows("session", {"records": 2_000_000, "rows_out": 200_000}, flink)
    check_rows("session", {"records": 50_000, "rows_out": 1}, flink)  # a size Flink was not counted at
    with pytest.raises(SystemExit, match="engines disagree"):
        check_rows("session@p200", {"records": 20_000, "rows_out": 1_999}, flink)
