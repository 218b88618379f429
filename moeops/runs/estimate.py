"""How long a sweep will take, before it starts: from the decode pace this deployment's engine
showed in its newest sweep, else, where the stand-in engine answers it, from the stand-in's own
step time.

A continuous-batching engine runs at most `cap` requests at once; a level of concurrency c sends
its prompts in waves of min(c, cap) requests, each wave taking output_len decode steps. Prefill
and the client's own overhead are left out, so the estimate is a lower bound of about the right
size.
"""

import bisect
import math
from dataclasses import dataclass

from domain import capacity
from domain.levels import DEFAULT_PROMPTS_PER_STREAM
from localstack.standin import StandinConfig
from moeops.runs.models import SweepRun, of_the_deployment


@dataclass(frozen=True)
class Pace:
    """Seconds per decode step by running requests: points (running, s), ascending; `basis`
    says where they come from, for the page."""

    points: tuple[tuple[int, float], ...]
    cap: int | None
    basis: str

    def step_s(self, running):
        """The step time at `running` requests (s): interpolated between the points in
        log2(running), the nearest end outside them."""
        xs = [math.log2(c) for c, _ in self.points]
        x = math.log2(max(running, 1))
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return self.points[0][1]
        if i == len(xs):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = (xs[i - 1], self.points[i - 1][1]), (xs[i], self.points[i][1])
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def sweep_seconds(
    pace, *, levels, prompts_per_level, output_len, warmup=0, rounds=1, request_rates=()
):
    """Seconds a sweep of these levels (concurrencies), each run `rounds` times, takes at
    `pace`; with request_rates (req/s), one level per rate under each concurrency, which
    lasts at least as long as its rate takes to send its prompts."""
    total = 0.0
    for concurrency in levels:
        running = min(concurrency, pace.cap) if pace.cap else concurrency
        waves = math.ceil(prompts_per_level / running) + math.ceil(warmup / running)
        busy = waves * output_len * pace.step_s(running)
        if not request_rates:
            total += busy
        for rate in request_rates:
            total += max(busy, prompts_per_level / rate)
    return total * rounds


def _newest_check(deployment, checks, **exclude):
    """The deployment's newest health check but those matching `exclude` (a field and the
    value that rules a check out), from `checks` (newest first) where the caller read them."""
    if checks is None:
        checks = deployment.health_checks.exclude(**exclude)[:1]
    ((field, value),) = exclude.items()
    return next((check for check in checks if getattr(check, field) != value), None)


def _cap(deployment, checks):
    check = _newest_check(deployment, checks, max_running_requests=None)
    return (check and check.max_running_requests) or deployment.max_running_requests


def _latest_timed(deployment, runs):
    """The newest run of `runs` (else of the deployment, read here) with a level that measured
    its TPOT, or None."""
    if runs is None:
        runs = SweepRun.objects.filter(deployment=deployment, levels__median_tpot_ms__isnull=False)
        # an imported file of another model says nothing of this deployment's pace
        runs = of_the_deployment(runs).distinct().order_by("-created", "-id")[:1]
        runs = runs.prefetch_related("levels")
    for run in runs:
        if any(level.median_tpot_ms is not None for level in run.levels.all()):
            return run
    return None


def deployment_pace(deployment, runs=None, checks=None):
    """The deployment's Pace, or (None, why there is none). runs: the deployment's runs
    of_the_deployment, newest first, levels prefetched, where the caller has them already;
    checks: its health checks, newest first, holding its newest that reported a running cap and
    its newest not from an edit, where the caller has them already."""
    run = _latest_timed(deployment, runs)
    if run is not None:
        points = sorted(
            (level.concurrency, level.median_tpot_ms / 1000)
            for level in run.levels.all()
            if level.median_tpot_ms is not None and level.concurrency is not None
        )
        if points:
            cap = run.reported_running_cap() or _cap(deployment, checks)
            return Pace(tuple(points), cap, f"the TPOT of {run.display_label()}"), ""
    check = _newest_check(deployment, checks, trigger="edit")
    if check is not None and check.engine == "standin":
        standin = StandinConfig()
        cap = check.max_running_requests or standin.max_running_requests
        sizes = sorted({2**i for i in range(cap.bit_length()) if 2**i <= cap} | {cap})
        points = tuple((b, standin.step_seconds(b)) for b in sizes)
        return Pace(points, cap, "the stand-in engine's step time"), ""
    return None, "no sweep of this deployment measured its TPOT yet"


@dataclass(frozen=True)
class CapacityPlan:
    """The levels a capacity search is expected to run (concurrencies, in order), how long
    they take (s) and how many requests they send, rounds and warm-up included."""

    loads: tuple[int, ...]
    seconds: float
    requests: int


def predicted_level(pace, concurrency, output_len):
    """The figures a level of `concurrency` streams would show at `pace`, as domain.capacity
    judges them (ms): TPOT and ITL the step time at the requests the engine runs at once;
    requests past its cap queue a wave of output_len steps each, so the last wave's TTFT (the
    tail a p90–p99 limit reads) is the waves before it. Prefill is left out."""
    running = min(concurrency, pace.cap) if pace.cap else concurrency
    step_ms = pace.step_s(running) * 1000
    waves = math.ceil(concurrency / running)
    ttft = (waves - 1) * output_len * step_ms
    figures = {"completed": DEFAULT_PROMPTS_PER_STREAM * concurrency, "failed": 0}
    for stat in ("median", "p90", "p95", "p99"):
        figures[f"{stat}_tpot_ms"] = figures[f"{stat}_itl_ms"] = step_ms
        figures[f"{stat}_ttft_ms"] = ttft
        figures[f"{stat}_e2el_ms"] = ttft + output_len * step_ms
    return figures


def capacity_plan(pace, *, search, limits, max_failed_percent, output_len, rounds, warmup=0):
    """The CapacityPlan of a concurrency search (domain.capacity.Search) against the limits
    ({metric: (percentile, ms)}), its levels judged on the figures `pace` predicts
    (predicted_level) by the search's own next_load; each level sends
    DEFAULT_PROMPTS_PER_STREAM prompts per stream, `rounds` times."""
    probes, seconds, requests = [], 0.0, 0
    while (load := capacity.next_load(search, probes)) is not None:
        level = predicted_level(pace, load, output_len)
        probes.append(capacity.probe_of(limits, max_failed_percent, load, level))
        prompts = DEFAULT_PROMPTS_PER_STREAM * load
        seconds += sweep_seconds(
            pace,
            levels=[load],
            prompts_per_level=prompts,
            output_len=output_len,
            warmup=warmup,
            rounds=rounds,
        )
        requests += (prompts + warmup) * rounds
    return CapacityPlan(tuple(int(p.load) for p in probes), seconds, requests)
