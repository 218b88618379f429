import numpy as np
import pytest

from domain import latency_stats


def test_it_interpolates_percentiles_linearly():
    # rank = q/100 * (n-1): p90 of 1..4 sits at 2.7 → 3 + 0.7 * (4 - 3)
    assert latency_stats.percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    assert latency_stats.percentile([10.0], 99) == 10.0


def test_it_describes_with_population_std_and_vllm_percentiles():
    stats = latency_stats.describe([1.0, 2.0, 3.0, 4.0])
    assert stats == {
        "mean": 2.5,
        "median": 2.5,
        "std": pytest.approx(1.118033988749895),
        "p90": pytest.approx(3.7),
        "p95": pytest.approx(3.85),
        "p99": pytest.approx(3.97),
    }


def test_it_reports_none_not_zero_when_there_are_no_samples():
    assert latency_stats.percentile([], 50) is None
    assert set(latency_stats.describe([]).values()) == {None}
    assert latency_stats.describe_ms("ttft", [])["mean_ttft_ms"] is None


def test_it_names_millisecond_keys_like_vllm():
    stats = latency_stats.describe_ms("tpot", [0.010, 0.020])
    assert set(stats) == {
        "mean_tpot_ms",
        "median_tpot_ms",
        "std_tpot_ms",
        "p90_tpot_ms",
        "p95_tpot_ms",
        "p99_tpot_ms",
    }
    assert stats["mean_tpot_ms"] == pytest.approx(15.0)


def test_it_finds_the_busiest_second():
    times = np.array([0.1, 0.5, 1.2, 1.3, 1.9, 2.5])
    assert latency_stats.bucket_max(times, None, start=0.0) == 3.0
    weights = np.array([5.0, 5.0, 1.0, 1.0, 1.0, 1.0])
    assert latency_stats.bucket_max(times, weights, start=0.0) == 10.0
    assert latency_stats.bucket_max(np.empty(0), None, start=0.0) == 0.0


def test_it_counts_requests_active_in_a_second():
    starts = np.array([0.0, 0.2, 1.5, 3.0])
    ends = np.array([1.1, 0.4, 2.0, 3.5])
    # second 1 holds the first (until 1.1) and the third (from 1.5)
    assert latency_stats.interval_overlap_max(starts, ends, start=0.0) == 2
    assert latency_stats.interval_overlap_max(np.empty(0), np.empty(0), start=0.0) == 0
