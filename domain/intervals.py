"""A level swept in rounds: the level's figures from its rounds' (the median of each rate and
latency, the sum of each count) with an order-statistic interval of that median for output tok/s
and each latency percentile; and the one rule that judges two levels' rounds against each other
(compare_rounds: an exact permutation test, the change with its interval). docs/metrics.md says
why. The web tier stores what level_of_rounds returns with the level; the pages, the API, the CSV
and the analysis read it from there."""

import functools
import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from domain.levels import LATENCY_METRICS, LATENCY_PERCENTILES
from domain.wire.levels import LEVEL_KEYS

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

# The interval's coverage asked for; fewer than 6 rounds cannot reach it (median_interval).
COVERAGE = 0.95
# The false-alarm rate of a two-run verdict: identically distributed rounds are called a change
# in at most 5 % of comparisons (compare_rounds).
FALSE_ALARM = 0.05
# Splits of the pooled rounds the permutation test enumerates whole (five rounds a side:
# C(10, 5) = 252); past that (ten a side: 184,756), this many drawn with a fixed seed, which
# moves a p-value near 5 % by ±0.3 points at most (two standard errors).
EXACT_SPLITS = 20_000
DRAWN_SPLITS = 20_000


def median_interval(values):
    """The interval (low, high) of the median of `values` (a round's figure each, in its unit)
    from their order statistics: [x(k), x(n+1−k)] with the largest k whose coverage
    1 − 2·P(Binomial(n, ½) < k) is at least 95 %, whatever the rounds' distribution; with
    fewer than 6 rounds, their range (coverage 1 − 2^(1−n): 94 % for 5 rounds, 88 % for 4).
    One odd round moves it by one order statistic, never the figure's width. None with fewer
    than two values or any None among them."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k + 1 <= n // 2 and _median_coverage(n, k + 1) >= COVERAGE:
        k += 1
    return (ordered[k - 1], ordered[n - k])


def _median_coverage(n, k):
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


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
    fields (domain.wire.levels' keys, errors, usage_reported, started_at, finished_at, epoch s).

    Returns the fields plus "intervals": {key: [low, high]} for INTERVAL_KEYS that every round
    has (median_interval: the interval of the median, the figure itself), empty for one
    round. Rates, latencies and peaks are the median of the rounds; counts,
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
        interval = median_interval([r.get(key) for r in rounds])
        if interval is not None:
            intervals[key] = list(interval)
    fields["intervals"] = intervals
    return fields


@dataclass(frozen=True)
class RoundsCompared:
    """Two levels' rounds judged (compare_rounds). verdict: "lower" or "higher" beyond the
    noise, "within" it, "unknown" (why: too few rounds for the test to decide at FALSE_ALARM);
    ratio: now ÷ before, of the rounds' geometric means; ratio_interval: its 95 % interval (the
    ratios the test does not reject), None where the rounds are too few to bound it; p_value:
    the permutation test's, two-sided."""

    verdict: str
    ratio: float | None = None
    ratio_interval: tuple[float, float] | None = None
    p_value: float | None = None
    why: str = ""

    def change(self):
        """ "−84 % [−93 %, −71 %]": the change of now against before with its interval."""
        if self.ratio is None:
            return "no change measurable"
        text = _percent(self.ratio)
        if self.ratio_interval is None:
            return text
        return f"{text} [{_percent(self.ratio_interval[0])}, {_percent(self.ratio_interval[1])}]"


def _percent(ratio):
    change = round((ratio - 1) * 100)
    return "±0 %" if change == 0 else f"{'−' if change < 0 else '+'}{abs(change)} %"


# Why a verdict is "unknown", in the words a page shows.
SINGLE_ROUNDS = "single rounds: no noise estimate"


def compare_rounds(now, before):
    """How a level's rounds `now` stand against `before`'s (each a list of one figure per round,
    in one unit, > 0: output tok/s or a latency in ms): the one rule of every two-run verdict.

    An exact permutation test of the difference of the rounds' mean log figure (the log of the
    ratio of their geometric means) over every split of the pooled rounds: for identically
    distributed rounds it calls a change in at most FALSE_ALARM of comparisons whatever their
    distribution, and the logs keep one odd round from outweighing the rest. The ratio's
    interval holds the ratios the same test does not reject, so a change is called exactly
    when the interval leaves out 1. Too few rounds for any split to reach FALSE_ALARM (3 and 3:
    1 in 10 at best) give "unknown", saying so."""
    now = np.log([float(v) for v in now if v is not None and v > 0])
    before = np.log([float(v) for v in before if v is not None and v > 0])
    if not len(now) or not len(before):
        return RoundsCompared("unknown", why="a side has no figure")
    ratio = float(np.exp(now.mean() - before.mean()))
    if len(now) < 2 and len(before) < 2:
        return RoundsCompared("unknown", ratio, why=SINGLE_ROUNDS)
    picks = _splits(len(now) + len(before), len(now))
    if 2 / len(picks) > FALSE_ALARM:
        why = (
            f"{len(now)} and {len(before)} rounds are too few for a test at "
            f"{FALSE_ALARM * 100:.0f} % false alarms (4 a side are the fewest)"
        )
        return RoundsCompared("unknown", ratio, why=why)
    p_value = _permutation_p(now, before, picks)
    verdict = "within"
    if p_value <= FALSE_ALARM:
        verdict = "lower" if ratio < 1 else "higher"
    low, high = _shift_interval(now, before, picks)
    return RoundsCompared(verdict, ratio, (math.exp(low), math.exp(high)), p_value)


@functools.cache
def _splits(n, m):
    """Indexes of the first side for the splits of n pooled rounds into m and n − m (read-only:
    cached, as every comparison of m and n − m rounds takes the same)."""
    if math.comb(n, m) <= EXACT_SPLITS:
        picks = np.array(list(itertools.combinations(range(n), m)))
    else:
        rng = np.random.default_rng(0)
        picks = np.array([rng.choice(n, m, replace=False) for _ in range(DRAWN_SPLITS)])
    picks.flags.writeable = False
    return picks


def _permutation_p(a, b, picks):
    return _shifted_p(a, b, picks)(0.0)


def _shifted_p(a, b, picks):
    """p(d): the permutation test's p-value of a − d against b. Each split's difference of
    means is linear in d (α + β·d, β from how many of a's rounds it draws), so one pass over
    the splits serves every d."""
    pooled = np.concatenate([a, b])
    m, rest = len(a), len(b)
    sums = pooled[picks].sum(axis=1)
    from_a = (picks < m).sum(axis=1)
    alpha = sums / m - (pooled.sum() - sums) / rest
    beta = -from_a / m + (m - from_a) / rest
    centre = a.mean() - b.mean()

    def p(d):
        observed = abs(centre - d)
        # a split equal to the observed one in exact arithmetic counts, rounding aside
        return float(np.mean(np.abs(alpha + beta * d) >= observed * (1 - 1e-9) - 1e-12))

    return p


def _shift_interval(a, b, picks):
    """(low, high) of the log shifts d for which the test keeps a − d and b alike."""
    centre = a.mean() - b.mean()
    reach = (max(a.max(), b.max()) - min(a.min(), b.min())) * 2 + 1.0
    p = _shifted_p(a, b, picks)
    ends = []
    for far in (centre - reach, centre + reach):
        inside, outside = centre, far
        for _ in range(24):
            middle = (inside + outside) / 2
            inside, outside = (middle, outside) if p(middle) > FALSE_ALARM else (inside, middle)
        ends.append(inside)
    return ends[0], ends[1]


def with_interval(value, interval, digits=0):
    """ "1,234 (1,180–1,290)": a figure with its interval, or the figure alone without one."""
    text = f"{value:,.{digits}f}"
    if interval is None:
        return text
    return f"{text} ({interval[0]:,.{digits}f}–{interval[1]:,.{digits}f})"
