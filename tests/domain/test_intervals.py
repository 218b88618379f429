import math

import pytest

from domain.intervals import INTERVAL_KEYS, level_of_rounds, overlap, t_interval, with_interval


def test_the_t_interval_of_three_rounds_is_the_one_computed_by_hand():
    # mean 12, s = 2, t(0.975, 2) = 4.303: 12 ± 4.303 · 2 / √3 = 12 ± 4.9687
    low, high = t_interval([10.0, 12.0, 14.0])
    assert low == pytest.approx(7.0313, abs=1e-4)
    assert high == pytest.approx(16.9687, abs=1e-4)


def test_two_rounds_take_the_wide_t_of_one_degree_of_freedom():
    # mean 100, s = √2 · 10, t(0.975, 1) = 12.706: 100 ± 12.706 · 10 = 100 ± 127.06, held at 0
    assert t_interval([90.0, 110.0]) == pytest.approx((0.0, 227.06))


def test_equal_rounds_have_an_interval_of_no_width():
    assert t_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)


@pytest.mark.parametrize("values", [[], [10.0], [10.0, None, 12.0]])
def test_one_round_or_a_missing_figure_has_no_interval(values):
    assert t_interval(values) is None


def _round(throughput, p99_tpot, **extra):
    return {
        "concurrency": 8,
        "request_rate": None,
        "completed": 100,
        "failed": 1,
        "duration": 10.0,
        "total_output_tokens": 12800,
        "output_throughput": throughput,
        "p99_tpot_ms": p99_tpot,
        "max_concurrent_requests": 8,
        "errors": {"timeout": 1},
        "usage_reported": True,
        "started_at": 1000.0 + throughput,
        "finished_at": 1010.0 + throughput,
        **extra,
    }


def test_a_level_is_the_median_of_its_rounds_and_the_sum_of_their_requests():
    level = level_of_rounds([_round(1200.0, 40.0), _round(1000.0, 60.0), _round(1100.0, 50.0)])
    assert level["output_throughput"] == 1100.0 and level["p99_tpot_ms"] == 50.0
    assert level["completed"] == 300 and level["failed"] == 3 and level["duration"] == 30.0
    assert level["errors"] == {"timeout": 3}
    assert level["started_at"] == 2000.0 and level["finished_at"] == 2210.0
    assert level["intervals"]["output_throughput"] == pytest.approx(
        list(t_interval([1200, 1000, 1100]))
    )
    assert set(level["intervals"]) == {"output_throughput", "p99_tpot_ms"}


def test_one_round_is_the_level_as_it_ran_with_no_interval():
    one = _round(1200.0, 40.0)
    level = level_of_rounds([one])
    assert {k: level[k] for k in one} == one
    assert level["intervals"] == {}
    assert level["mean_ttft_ms"] is None and not math.isnan(level["output_throughput"])


def test_every_latency_percentile_and_output_throughput_get_an_interval():
    assert "output_throughput" in INTERVAL_KEYS
    assert {"median_ttft_ms", "p90_itl_ms", "p95_e2el_ms", "p99_tpot_ms"} <= set(INTERVAL_KEYS)
    assert "mean_ttft_ms" not in INTERVAL_KEYS


def test_intervals_that_share_a_value_overlap():
    assert overlap((1000.0, 1470.0), (850.0, 1250.0))
    assert overlap((1000.0, 1100.0), (1100.0, 1200.0))
    assert not overlap((1180.0, 1290.0), (1010.0, 1090.0))
    assert not overlap((1010.0, 1090.0), (1180.0, 1290.0))


def test_a_figure_is_written_with_its_interval_or_alone():
    assert with_interval(1234.4, (1180.0, 1290.2)) == "1,234 (1,180–1,290)"
    assert with_interval(47.25, (40.0, 52.5), digits=1) == "47.2 (40.0–52.5)"
    assert with_interval(1050.0, None) == "1,050"
