"""Service-level objectives: the limits of a profile, the one rule that says whether they are
well formed, and the judgement of a level's figures against them. No Django here: the web tier
(profiles, pages, the analysis) and the load generator's CLI both use it.

A limit is (metric, percentile, ms): "TPOT p99 under 50 ms". Its figure is the LevelResult field
`{stat}_{metric}_ms` of domain.levels, where p50 is vLLM's "median"."""

import math
from dataclasses import dataclass

from domain.levels import LATENCY_METRICS
from domain.numbers import is_number

# The percentiles a limit may name; p50 reads the level's median.
SLO_PERCENTILES = ("p50", "p90", "p95", "p99")
# A level's failed share may not exceed this many % unless the profile says otherwise.
DEFAULT_MAX_FAILED_PERCENT = 1.0
# No SLO names a latency above a day; a larger number is a typo (and would overflow a column).
MAX_LIMIT_MS = 86_400_000.0
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def stat_key(metric, percentile):
    """The LevelResult field of a metric at a percentile: ("tpot", "p99") → "p99_tpot_ms"."""
    stat = "median" if percentile == "p50" else percentile
    return f"{stat}_{metric}_ms"


def profile_problems(limits, max_failed_percent):
    """{field: sentence} of what is wrong with a profile (empty when it may be stored).

    limits: {metric (ttft, tpot, itl, e2el): (percentile or "", limit in ms or None)};
    max_failed_percent: the largest share of failed requests, in % (0–100). Fields are named
    `{metric}_percentile`, `{metric}_ms` and `max_failed_percent`."""
    problems = {}
    named = 0
    for metric in LATENCY_METRICS:
        percentile, limit_ms = limits.get(metric, ("", None))
        label = METRIC_LABELS[metric]
        if limit_ms is None:
            if percentile:
                problems[f"{metric}_ms"] = f"{label} has a percentile but no limit in ms."
            continue
        named += 1
        if not percentile:
            problems[f"{metric}_percentile"] = (
                f"{label} has a limit but no percentile: one of {', '.join(SLO_PERCENTILES)}."
            )
        elif percentile not in SLO_PERCENTILES:
            problems[f"{metric}_percentile"] = (
                f"{label}'s percentile must be one of {', '.join(SLO_PERCENTILES)}, "
                f"not {percentile!r}."
            )
        if not is_number(limit_ms) or not math.isfinite(limit_ms):
            problems[f"{metric}_ms"] = f"{label}'s limit must be a number of ms."
        elif limit_ms <= 0:
            problems[f"{metric}_ms"] = f"{label}'s limit must be above 0 ms, not {limit_ms:g}."
        elif limit_ms > MAX_LIMIT_MS:
            problems[f"{metric}_ms"] = f"{label}'s limit must be at most {MAX_LIMIT_MS:g} ms."
    if not named and not problems:
        problems["__all__"] = "A profile needs at least one limit (TTFT, TPOT, ITL or E2E latency)."
    share = max_failed_percent
    if not is_number(share) or not math.isfinite(share) or not 0 <= share <= 100:
        problems["max_failed_percent"] = (
            "The largest share of failed requests must be between 0 and 100 %."
        )
    return problems


@dataclass(frozen=True)
class LimitCheck:
    """One limit against a level: the figure judged (ms; the upper bound when one was given,
    else the point value), its margin (limit − figure, ms; negative when over) and its ratio
    (figure ÷ limit). figure None: the level has no such figure, so the limit is not met."""

    metric: str
    percentile: str
    limit_ms: float
    figure: float | None

    @property
    def met(self):
        return self.figure is not None and self.figure <= self.limit_ms

    @property
    def margin_ms(self):
        return None if self.figure is None else self.limit_ms - self.figure

    @property
    def ratio(self):
        return None if self.figure is None else self.figure / self.limit_ms

    def sentence(self):
        """ "TPOT p99: 47 ms, limit 50 ms" (or "no figure")."""
        name = f"{METRIC_LABELS[self.metric]} {self.percentile}"
        if self.figure is None:
            return f"{name}: no figure, limit {self.limit_ms:g} ms"
        return f"{name}: {self.figure:,.3g} ms, limit {self.limit_ms:g} ms"


@dataclass(frozen=True)
class Judgement:
    """A level against a profile: each limit's check, the failed share (%) and whether the
    level meets every limit. binding: the limit closest to or most over its limit (largest
    figure ÷ limit; a missing figure binds first), None without latency limits."""

    checks: tuple
    failed_percent: float | None
    max_failed_percent: float

    @property
    def failures_met(self):
        return self.failed_percent is not None and self.failed_percent <= self.max_failed_percent

    @property
    def met(self):
        return self.failures_met and all(check.met for check in self.checks)

    @property
    def binding(self):
        if not self.checks:
            return None
        return max(self.checks, key=lambda c: math.inf if c.ratio is None else c.ratio)


def judge(limits, max_failed_percent, figures, upper=None):
    """A level's figures against a profile's limits (a Judgement).

    limits: {metric: (percentile, ms or None)} as profile_problems takes; figures: the level's
    LevelResult fields by name (`p99_tpot_ms`, …, plus `completed` and `failed` counts);
    upper: {field: upper bound in ms} (an interval's), judged in place of the point value where
    given."""
    upper = upper or {}
    checks = []
    for metric in LATENCY_METRICS:
        percentile, limit_ms = limits.get(metric, ("", None))
        if limit_ms is None:
            continue
        key = stat_key(metric, percentile)
        figure = upper.get(key, figures.get(key))
        checks.append(LimitCheck(metric, percentile, float(limit_ms), figure))
    completed, failed = figures.get("completed") or 0, figures.get("failed") or 0
    sent = completed + failed
    failed_percent = 100.0 * failed / sent if sent else None
    return Judgement(tuple(checks), failed_percent, float(max_failed_percent))
