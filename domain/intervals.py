"""A level swept in rounds: the level's figures from its rounds' (the median of each rate and
latency, the sum of each count) and a 95 % t-interval over the rounds for output tok/s and each
latency percentile; docs/metrics.md says why a t-interval over rounds. The web tier stores what
this returns with the level, the pages, the API, the CSV and the analysis read it from there."""

import math
import statistics

from domain.levels import LATENCY_METRICS, LATENCY_PERCENTILES, LEVEL_KEYS

# A level runs at most this many rounds in a row: ten rounds give a t-interval within 1.2× of
# the normal one (t 2.262 against 1.960), more buy little but time.
MAX_ROUNDS = 10

# Two-sided 95 % quantiles of Student's t, t(0.975, df) for df = 1 … 30 (any table of t).
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
# Past 30 degrees of freedom t(0.975) lies between 2.042 and 1.960; 2.042 keeps the interval
# on the wide side.

# The figures a level gives an interval for: output tok/s and every latency percentile (ms),
# the median (p50) among them.
INTERVAL_KEYS = (
    "output_throughput",
    *(
        f"{stat}_{metric}_ms"
        for metric in LATENCY_METRICS
        for stat in ("median", *(f"p{p}" for p in LATENCY_PERCENTILES))
    ),
)
# What a level adds up over its rounds: every request it sent counts once, in the time it took.
SUMMED_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens")
# What is the same in every round of a level (the level's own description).
SHARED_KEYS = ("concurrency", "request_rate", "input_len", "output_len")
# A round's fields: what the level is, its figures, and how its requests went.
ROUND_KEYS = (*SHARED_KEYS, *LEVEL_KEYS, "errors", "usage_reported", "started_at", "finished_at")
# What the figure of one round cannot be given an interval for, in the words a page shows.
ONE_ROUND = "one round: no interval"


def t_interval(values):
    """The 95 % confidence interval (low, high) of the mean of `values` (a round's figure each,
    in its unit): mean ± t(0.975, n − 1) · s / √n, the low end held at 0 (no figure here is
    negative). None with fewer than two values or any None among them."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    n = len(values)
    mean = statistics.fmean(values)
    half = T_975[min(n - 1, len(T_975)) - 1] * statistics.stdev(values) / math.sqrt(n)
    return (max(mean - half, 0.0), mean + half)


def _median(values):
    present = [v for v in values if v is not None]
    # a figure some round lacks (no usage reported) is left out of the level rather than guessed
    if not present or len(present) < len(values):
        return None
    return statistics.median(present)


def _total(values):
    present = [v for v in values if v is not None]
    return sum(present) if len(present) == len(values) else None


def level_of_rounds(rounds):
    """The level's fields from its rounds, in round order: each round a dict of LevelResult
    fields (domain.levels' keys, errors, usage_reported, started_at, finished_at, epoch s).

    Returns the fields plus "intervals": {key: [low, high]} for INTERVAL_KEYS that every round
    has, empty for one round. Rates, latencies and peaks are the median of the rounds; counts,
    tokens and durations their sum; errors summed by reason; the level runs from its first
    round's start to its last round's end.
    """
    fields = {key: rounds[0].get(key) for key in SHARED_KEYS if key in rounds[0]}
    for key in LEVEL_KEYS:
        values = [r.get(key) for r in rounds]
        fields[key] = _total(values) if key in SUMMED_KEYS else _median(values)
    if fields.get("failed") is None:
        fields["failed"] = 0
    if fields.get("max_concurrent_requests") is not None:
        fields["max_concurrent_requests"] = round(fields["max_concurrent_requests"])
    errors = {}
    for r in rounds:
        for reason, count in (r.get("errors") or {}).items():
            errors[reason] = errors.get(reason, 0) + count
    fields["errors"] = errors
    usage = {r.get("usage_reported") for r in rounds}
    fields["usage_reported"] = False if False in usage else (True if usage == {True} else None)
    starts = [r["started_at"] for r in rounds if r.get("started_at") is not None]
    ends = [r["finished_at"] for r in rounds if r.get("finished_at") is not None]
    fields["started_at"] = min(starts) if starts else None
    fields["finished_at"] = max(ends) if ends else None
    intervals = {}
    for key in INTERVAL_KEYS:
        interval = t_interval([r.get(key) for r in rounds])
        if interval is not None:
            intervals[key] = list(interval)
    fields["intervals"] = intervals
    return fields


def overlap(a, b):
    """Whether two (low, high) intervals share a value: two figures whose 95 % intervals
    overlap cannot be told apart from the rounds' noise."""
    return a[0] <= b[1] and b[0] <= a[1]


def with_interval(value, interval, digits=0):
    """ "1,234 (1,180–1,290)": a figure with its interval, or the figure alone without one."""
    text = f"{value:,.{digits}f}"
    if interval is None:
        return text
    return f"{text} ({interval[0]:,.{digits}f}–{interval[1]:,.{digits}f})"
