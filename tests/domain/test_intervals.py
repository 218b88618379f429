import math

import numpy as np
import pytest

from domain.intervals import (
    INTERVAL_KEYS,
    compare_rounds,
    level_of_rounds,
    median_interval,
    with_interval,
)


def test_the_interval_of_the_median_of_five_rounds_is_their_range():
    # five rounds cannot reach 95 %: their range covers the median 1 − 2/32 = 94 % of the time
    assert median_interval([334.0, 145.0, 154.0, 92.0, 240.0]) == (92.0, 334.0)


def test_ten_rounds_drop_one_order_statistic_from_each_end():
    # [x(2), x(9)] covers the median 1 − 2·(1 + 10)/1024 = 97.9 %; [x(3), x(8)] only 89 %
    assert median_interval([float(v) for v in range(10, 0, -1)]) == (2.0, 9.0)


def test_one_odd_round_moves_the_interval_by_one_order_statistic_not_its_width():
    # the issue's rounds after a cap of 1: the 291 no longer stretches the interval to 5×
    low, high = median_interval([291.0, 25.0, 28.0, 10.0, 12.0, 26.0, 27.0, 11.0, 24.0, 29.0])
    assert (low, high) == (11.0, 29.0)


@pytest.mark.parametrize("values", [[], [10.0], [10.0, None, 12.0]])
def test_one_round_or_a_missing_figure_has_no_interval(values):
    assert median_interval(values) is None


# rounds of the real-vLLM watch test on a busy machine: a cap of 8, then --max-num-seqs 1
BASELINE = [334.0, 145.0, 154.0, 92.0, 240.0]
CAPPED = [291.0, 25.0, 28.0, 10.0, 12.0]


def test_the_issues_rounds_are_a_drop_beyond_the_noise_with_its_interval():
    judged = compare_rounds(CAPPED, BASELINE)
    # 4 of the 252 splits of the pooled logs differ as much: p = 10/252 with both tails
    assert judged.verdict == "lower" and judged.p_value == pytest.approx(10 / 252)
    assert judged.change() == "−83 % [−95 %, −22 %]"
    assert compare_rounds(BASELINE, CAPPED).verdict == "higher"


def test_identically_distributed_heavy_tailed_rounds_are_quiet_in_95_percent_of_pairs():
    rng = np.random.default_rng(40)
    quiet = 0
    for _ in range(1000):
        # log-normal rounds times a Pareto tail (α 1.5: infinite variance), a busy machine's
        a, b = (rng.lognormal(5.0, 0.5, 5) * (1 + rng.pareto(1.5, 5)) for _ in range(2))
        quiet += compare_rounds(a, b).verdict == "within"
    assert quiet >= 950


def test_rounds_too_few_for_the_test_say_so():
    assert compare_rounds([100.0], [300.0]).why == "single rounds: no noise estimate"
    judged = compare_rounds([100.0, 101.0, 99.0], [300.0, 301.0, 299.0])
    assert judged.verdict == "unknown"
    assert judged.why.startswith("3 and 3 rounds are too few for a test at 5 % false alarms")


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
    assert level["intervals"]["output_throughput"] == [1000.0, 1200.0]
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


def test_a_figure_is_written_with_its_interval_or_alone():
    assert with_interval(1234.4, (1180.0, 1290.2)) == "1,234 (1,180–1,290)"
    assert with_interval(47.25, (40.0, 52.5), digits=1) == "47.2 (40.0–52.5)"
    assert with_interval(1050.0, None) == "1,050"
