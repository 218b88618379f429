"""The SLO capacity search: the largest load (concurrency, or Poisson req/s) whose level meets an
SLO profile. No Django here: the worker asks `next_load` which level to run next, the web tier
and the load generator's CLI read the answer with `capacity_answer`; docs/metrics.md defines
capacity, the conservative answer, the answer on medians and the binding metric.

The search grows the load geometrically from `start` until a level fails the SLO, then bisects
the bracket (the largest load met below the smallest load failed) until it is at most WIDTH of
its lower end wide (or one concurrency), or the search has run `budget` levels.

A level is a dict of LevelResult fields (domain.wire.levels' keys) with "intervals", as
domain.intervals.level_of_rounds returns it and the API's levels read."""

import math
from dataclasses import dataclass

from domain.levels import MAX_ROUNDS
from domain.numbers import is_integer, is_number
from domain.slo import (
    DEFAULT_MAX_FAILED_PERCENT,
    METRIC_LABELS,
    SLO_PERCENTILES,
    judge,
    profile_problems,
    stat_key,
)

MODES = ("concurrency", "request_rate")
# Each step of the growth doubles the load: 1 → 64 in six levels.
GROWTH = 2.0
# The bracket is narrow enough once its width is at most this share of its lower end: the
# rounds of one level on the real vLLM CPU server spread ±20–40 %, so a finer bracket buys
# levels, not knowledge.
WIDTH = 0.05
# A capacity search runs each level this many times, so that each level has an interval.
DEFAULT_ROUNDS = 3
# At most this many levels per search unless asked: growth from 1 past 1024 (12 levels) and the
# bisection of 1024–2048 to 5 % (5 more) fit.
DEFAULT_BUDGET = 20
MAX_BUDGET = 64
# A request-rate search descends no lower than this (req/s) when even its start fails.
MIN_RATE = 0.01
# Why a search ended, in the words a page shows after the load.
ENDS = {
    "bracketed": "the bracket is narrow enough",
    "end_met": "the end of the range meets the SLO: the capacity is at least that",
    "none_met": "no load tried meets the SLO",
    "budget": "the level budget is spent before the bracket narrowed",
    "stopped": "the search stopped before it ended",
}


@dataclass(frozen=True)
class Search:
    """What a capacity search tries: mode "concurrency" (loads are integers) or "request_rate"
    (req/s), from `start`, never above `end` (None: no end), at most `budget` levels."""

    mode: str
    start: float
    end: float | None = None
    budget: int = DEFAULT_BUDGET

    @property
    def unit(self):
        return "concurrent" if self.mode == "concurrency" else "req/s"

    def load_text(self, load):
        """ "48 concurrent" or "3.25 req/s"."""
        if self.mode == "concurrency":
            return f"{load:g} concurrent"
        return f"{load:.3g} req/s"


def search_problems(mode, start, end=None, budget=None):
    """{field: sentence} of what is wrong with a search's range (empty when it may run); fields
    are named mode, start, end and budget."""
    problems = {}
    if mode not in MODES:
        problems["mode"] = f"The mode must be one of {', '.join(MODES)}, not {mode!r}."
        return problems
    whole = mode == "concurrency"
    for name, value in (("start", start), ("end", end)):
        if value is None and name == "end":
            continue
        if whole and not is_integer(value):
            problems[name] = f"The {name} must be a whole number of concurrent requests."
        elif not is_number(value) or not math.isfinite(value) or value <= 0:
            problems[name] = f"The {name} must be a number above 0."
    if "start" not in problems and "end" not in problems and end is not None and start > end:
        problems["end"] = f"The end ({end:g}) must not be below the start ({start:g})."
    if budget is not None and (not is_integer(budget) or not 2 <= budget <= MAX_BUDGET):
        problems["budget"] = f"The level budget must be a whole number from 2 to {MAX_BUDGET}."
    return problems


def parse_slo(text):
    """The limits of "ttft:p99:500,tpot:p99:50" ({metric: (percentile, ms)}, as domain.slo
    takes them); raises ValueError with a sentence naming the part that is wrong."""
    limits = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        pieces = part.split(":")
        if len(pieces) != 3:
            raise ValueError(f"{part!r}: a limit is metric:percentile:ms, e.g. tpot:p99:50")
        metric, percentile, ms = (p.strip().lower() for p in pieces)
        if metric not in METRIC_LABELS:
            raise ValueError(f"{part!r}: the metric must be one of {', '.join(METRIC_LABELS)}")
        if percentile not in SLO_PERCENTILES:
            raise ValueError(
                f"{part!r}: the percentile must be one of {', '.join(SLO_PERCENTILES)}"
            )
        try:
            limits[metric] = (percentile, float(ms))
        except ValueError:
            raise ValueError(f"{part!r}: the limit must be a number of ms") from None
    problems = profile_problems(limits, 0.0)
    if problems:
        raise ValueError(" ".join(problems.values()))
    return limits


@dataclass(frozen=True)
class Probe:
    """One level the search ran: its load, the level's fields and its two judgements against
    the SLO: `conservative` judges each limited percentile's 95 % upper bound (the point value
    where the level ran once and has no interval), `on_medians` the level's figure itself."""

    load: float
    level: dict
    conservative: object
    on_medians: object

    @property
    def met(self):
        return self.conservative.met

    @property
    def met_on_medians(self):
        return self.on_medians.met


def probe_of(limits, max_failed_percent, load, level):
    """A Probe of a level (LevelResult fields with "intervals") at `load` against the limits
    ({metric: (percentile, ms or None)}) and the largest failed share (%)."""
    intervals = level.get("intervals") or {}
    upper = {}
    for metric, (percentile, limit_ms) in limits.items():
        if limit_ms is None:
            continue
        key = stat_key(metric, percentile)
        if intervals.get(key):
            upper[key] = intervals[key][1]
    return Probe(
        load=load,
        level=level,
        conservative=judge(limits, max_failed_percent, level, upper),
        on_medians=judge(limits, max_failed_percent, level),
    )


def straddles(probe):
    """Whether the level's intervals straddle a limit: it fails the SLO on its 95 % upper
    bounds but meets it on its medians, so that its rounds cannot yet say which side it is on."""
    return not probe.met and probe.met_on_medians


def needs_more_rounds(probe, rounds_run):
    """Whether a search runs the level once more before judging it: its intervals straddle a
    limit and it has run fewer than MAX_ROUNDS rounds. One slow round of a busy machine widens
    a 3- or 5-round interval past the limit; more rounds narrow it (t and √n) around the
    level's own figure, rather than failing the level on that round."""
    return straddles(probe) and rounds_run < MAX_ROUNDS


def bracket(probes, on_medians=False):
    """(largest load met below the smallest load failed, smallest load failed); either None
    where no such probe is. A load met above one failed is noise and is not the answer."""
    met = [p.met_on_medians if on_medians else p.met for p in probes]
    failed = [p.load for p, ok in zip(probes, met, strict=True) if not ok]
    high = min(failed, default=None)
    low = max(
        (
            p.load
            for p, ok in zip(probes, met, strict=True)
            if ok and (high is None or p.load < high)
        ),
        default=None,
    )
    return low, high


def _narrow(search, low, high):
    if search.mode == "concurrency" and high - low <= 1:
        return True
    return high - low <= WIDTH * low


def next_load(search, probes):
    """The load of the next level to run, or None when the search has ended (see `ended`)."""
    return _step(search, probes)[0]


def ended(search, probes):
    """Why the search ends here (a key of ENDS), or None while it goes on."""
    return _step(search, probes)[1]


def _step(search, probes):
    if not probes:
        return search.start, None
    load, end = _proposed(search, probes)
    if load is not None and len(probes) >= search.budget:
        return None, "budget"
    return load, end


def _proposed(search, probes):
    low, high = bracket(probes)
    whole = search.mode == "concurrency"
    if high is None:
        if search.end is not None and low >= search.end:
            return None, "end_met"
        load = low * GROWTH
        if search.end is not None:
            load = min(load, search.end)
        return (round(load) if whole else load), None
    if low is None:
        # even the lowest load tried fails: step down until one meets the SLO
        floor = 1 if whole else MIN_RATE
        if high <= floor:
            return None, "none_met"
        load = max(high / GROWTH, floor)
        return (max(math.floor(load), 1) if whole else load), None
    if _narrow(search, low, high):
        return None, "bracketed"
    middle = (low + high) / 2
    if whole:
        middle = math.floor(middle)
    return middle, None


def limit_text(check, load_text):
    """ "TPOT p99 binds: 47 ms at 48 concurrent, limit 50 ms"."""
    name = f"{METRIC_LABELS[check.metric]} {check.percentile}"
    if check.figure is None:
        return f"{name} binds: no figure at {load_text}, limit {check.limit_ms:g} ms"
    return f"{name} binds: {check.figure:,.3g} ms at {load_text}, limit {check.limit_ms:g} ms"


def _binding(search, capacity, failing):
    """The limit the capacity stops at: what the first failing level is most over (its failed
    share where that is what fails), its figure at the capacity point; where nothing failed, the
    limit the capacity point is closest to."""
    judged = failing.conservative if failing is not None else capacity.conservative
    if failing is not None and not judged.failures_met:
        share, limit = judged.failed_percent, judged.max_failed_percent
        said = "no requests" if share is None else f"{share:.3g} %"
        return {
            "metric": "failed",
            "percentile": "",
            "figure": share,
            "limit": limit,
            "sentence": f"failed requests bind: {said} at {search.load_text(failing.load)}, "
            f"limit {limit:g} %",
        }
    check = judged.binding
    if check is None:
        return None
    here = next(
        c
        for c in capacity.conservative.checks
        if (c.metric, c.percentile) == (check.metric, check.percentile)
    )
    return {
        "metric": check.metric,
        "percentile": check.percentile,
        "figure": here.figure,
        "limit": here.limit_ms,
        "sentence": limit_text(here, search.load_text(capacity.load)),
    }


def capacity_answer(search, probes, stopped=False):
    """The answer of the probes so far, as the run stores it (JSON):

    load (None when no load met) and load_on_medians, their brackets [low, high], why the
    search ended (`end`, a key of ENDS), `binding` ({metric, percentile, figure ms, limit ms,
    sentence} or None), `level` (the capacity point's fields) and `probes` (each load tried,
    in order, with whether it met the SLO conservatively and on medians)."""
    low, high = bracket(probes)
    medians_low, medians_high = bracket(probes, on_medians=True)
    end = "stopped" if stopped else ended(search, probes)
    capacity = next((p for p in probes if p.load == low), None)
    failing = next((p for p in probes if p.load == high), None)
    binding = _binding(search, capacity, failing) if capacity is not None else None
    if capacity is None and failing is not None:
        binding = _binding(search, failing, None)
    return {
        "mode": search.mode,
        "unit": search.unit,
        "load": low,
        "bracket": [low, high],
        "load_on_medians": medians_low,
        "bracket_on_medians": [medians_low, medians_high],
        "end": end,
        "binding": binding,
        "level": dict(capacity.level) if capacity is not None else None,
        "probes": [
            {"load": p.load, "met": p.met, "met_on_medians": p.met_on_medians} for p in probes
        ],
    }


def at_capacity(level, *, num_gpus=None, running_cap=None, gpu_util=None, power_w=None):
    """What a deployment does at its capacity point (a level's fields): output tok/s, goodput
    (req/s within the per-request limits), tok/s per GPU and per user (1000 / median TPOT), the
    share of the engine's running-request cap the level's requests in flight take, GPU
    utilisation (%) and total GPU power (W) over the level; None where a figure is unknown."""
    throughput = level.get("output_throughput")
    tpot = level.get("median_tpot_ms")
    in_flight = requests_in_flight(level)
    return {
        "concurrency": level.get("concurrency"),
        "request_rate": level.get("request_rate"),
        "output_throughput": throughput,
        "output_throughput_interval": (level.get("intervals") or {}).get("output_throughput"),
        "request_goodput": level.get("request_goodput"),
        "per_gpu": throughput / num_gpus if throughput is not None and num_gpus else None,
        "per_user": 1000.0 / tpot if tpot else None,
        "running_cap": running_cap,
        "cap_share": in_flight / running_cap if in_flight and running_cap else None,
        "gpu_util": gpu_util,
        "power_w": power_w,
    }


def requests_in_flight(level):
    """Requests in flight at a level on average: its concurrency where every stream sends its
    next request at once (no rate), else Little's law: req/s × mean E2E latency (s)."""
    if level.get("request_rate") is None:
        return level.get("concurrency")
    rate, e2el = level.get("request_throughput"), level.get("mean_e2el_ms")
    if rate is None or e2el is None:
        return None
    return rate * e2el / 1000.0


def limited_by_cap(answer, running_cap):
    """Whether the capacity stops at the engine's running-request cap: the bracket straddles
    it (the capacity point runs at most `running_cap` requests at once, the first failing load
    more, which the engine only queues, so their TTFT grows). Concurrency searches only."""
    if not answer or not running_cap or answer.get("mode") != "concurrency":
        return False
    low, high = answer.get("bracket") or (None, None)
    return low is not None and high is not None and low <= running_cap < high


def search_of(parameters):
    """The Search a capacity run's parameters describe (mode, start, end, budget)."""
    kwargs = {"budget": parameters["budget"]} if parameters.get("budget") else {}
    mode = parameters.get("mode") or "concurrency"
    return Search(mode, parameters["start"], parameters.get("end"), **kwargs)


def limits_of(parameters):
    """({metric: (percentile, ms)}, largest failed share %) of a capacity run's parameters'
    `slo` ({"limits": {metric: [percentile, ms]}, "max_failed_percent": %})."""
    slo = parameters.get("slo") or {}
    limits = {m: (p, float(ms)) for m, (p, ms) in (slo.get("limits") or {}).items()}
    return limits, float(slo.get("max_failed_percent", DEFAULT_MAX_FAILED_PERCENT))


def capacity_range(answer):
    """(low, high) the capacity lies in, its uncertainty: from the conservative answer (every
    limit met on its 95 % upper bound) to the answer on medians' bracket top (the first load
    that fails even on its medians; the answer on medians itself where none failed). None for
    an answer without a load."""
    if not answer or answer.get("load") is None:
        return None
    low = answer["load"]
    medians_top = (answer.get("bracket_on_medians") or [None, None])[1]
    high = medians_top if medians_top is not None else answer.get("load_on_medians")
    return (low, max(high if high is not None else low, low))


def capacities_compared(before, after):
    """Whether two capacity answers differ beyond their noise, in a sentence; None where
    either has no answer. Two answers against different limits or modes are not compared."""
    if not before or not after:
        return None
    if (before.get("profile"), before.get("mode")) != (after.get("profile"), after.get("mode")):
        return "not compared: the searches ran against different SLO profiles or modes"
    a, b = capacity_range(before), capacity_range(after)
    if a is None or b is None:
        return "cannot tell: one search found no load that meets the SLO"
    unit = "concurrent" if after.get("mode") == "concurrency" else "req/s"
    figures = f"capacity {b[0]:g}–{b[1]:g} against {a[0]:g}–{a[1]:g} {unit}"
    if a[0] <= b[1] and b[0] <= a[1]:
        return f"within noise ({figures}: the ranges overlap)"
    return f"beyond the noise ({figures}: the ranges do not overlap)"
