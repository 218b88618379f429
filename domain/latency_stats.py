"""The one place that turns samples into summary statistics (mean, median, std, percentiles).

Percentiles use numpy's linear interpolation, as vLLM's and SGLang's serving benchmarks do, and
std is the population std (numpy's default ddof=0), so our numbers line up with theirs.
"""

from collections.abc import Iterable, Sequence

import numpy as np

from domain.levels import LATENCY_PERCENTILES, LATENCY_STATS


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of values by linear interpolation; None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def describe(values: Iterable[float]) -> dict[str, float | None]:
    """Summary of values in their own unit.

    Returns {"mean", "median", "std", "p90", "p95", "p99"} (domain.levels.LATENCY_STATS, what
    the web tier stores); every value is None when there are no values (never a made-up 0).
    """
    arr = np.fromiter(values, dtype=np.float64)
    if arr.size == 0:
        return dict.fromkeys(LATENCY_STATS)
    pcts = np.percentile(arr, [50, *LATENCY_PERCENTILES])
    out = {"mean": float(arr.mean()), "median": float(pcts[0]), "std": float(arr.std())}
    out.update({f"p{p}": float(v) for p, v in zip(LATENCY_PERCENTILES, pcts[1:], strict=True)})
    return out


def describe_ms(metric: str, seconds: Iterable[float]) -> dict[str, float | None]:
    """Summary of durations given in seconds, reported in ms under vLLM's key names.

    metric is e.g. "ttft": returns {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
    "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms"}, None values when there are no samples.
    """
    stats = describe(seconds)
    return {
        f"{name}_{metric}_ms": (None if value is None else value * 1000.0)
        for name, value in stats.items()
    }


def bucket_max(times: np.ndarray, weights: np.ndarray | None, start: float) -> float:
    """Largest per-second total of weights over 1 s buckets counted from start.

    times are event times in seconds (same clock as start), weights one per event (1 each when
    None). Returns 0.0 for no events.
    """
    if times.size == 0:
        return 0.0
    buckets = np.floor(times - start).astype(np.int64)
    buckets -= min(int(buckets.min()), 0)
    return float(np.bincount(buckets, weights=weights).max())


def interval_overlap_max(starts: np.ndarray, ends: np.ndarray, start: float) -> int:
    """Most intervals active in any 1 s bucket counted from start (vLLM's max concurrency).

    starts and ends are interval bounds in seconds; an interval counts in every bucket it
    touches. Returns 0 for no intervals.
    """
    if starts.size == 0:
        return 0
    first = np.floor(starts - start).astype(np.int64)
    last = np.floor(ends - start).astype(np.int64)
    first -= min(int(first.min()), 0)
    last = np.maximum(last, first)
    size = int(last.max()) + 2
    delta = np.zeros(size, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return int(np.cumsum(delta).max())
