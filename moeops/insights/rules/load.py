"""Rules of the load a run put on the engine: failed requests, the throughput plateau, queueing
at the engine's running cap (and the cap change the plan proposes), a client that could not keep
the load up, a capacity search stopped at the cap."""

import math
from dataclasses import dataclass

from domain.capacity import limited_by_cap
from domain.engine import CAP_FLAGS, reported_running_cap
from domain.intervals import FALSE_ALARM
from domain.numbers import is_integer, is_number
from moeops.insights.rules.evidence import _change_per_doubling, _line, _round
from moeops.insights.rules.run_data import (
    Proposal,
    RunData,
    _curve_levels,
    _level_of,
    _within_noise,
)

# Plateau: a step of the sweep that adds less than this much output throughput per doubling of
# concurrency is flat; 806 -> 879 tok/s (128 -> 256) is +9.1%, so the write-up's curve is flat.
# Where both levels of a step ran in rounds, the step is flat only if its rise is not beyond the
# noise (domain.intervals.compare_rounds): rounds 990, 1,000, 1,010, 1,005 -> 1,070, 1,080,
# 1,090, 1,085 at 128 -> 256 are +8% but measurably a rise, so no plateau; 900, 1,000, 1,100,
# 950 -> 980, 1,080, 1,180, 1,000 is flat.
PLATEAU_GAIN = 0.10

# Queueing: the engine's running count within this fraction of the cap counts as "at the cap"
# (scrapes land between scheduler steps, when a finished request has just left the batch).
CAP_FULL_FRACTION = 0.95
KV_CACHE_FULL = 0.9
# Findings whose plan item "Raise <flag> above <cap>" changes the engine's running-request cap.
CAP_FINDINGS = ("queueing", "plateau", "capacity")

# Client-bound: the load generator's CPU at or above this (%) during a level is saturated.
CLIENT_CPU_SATURATED_PERCENT = 90.0
# Client-bound: achieved concurrency below this fraction of the target (or of the requests the
# level sent, when it sent fewer than the target) means the client did not keep the load up.
CLIENT_CONCURRENCY_FRACTION = 0.90
# Keys of LevelResult.raw (the load generator's level result) that carry the client's CPU use:
# a percentage given as is, else CPU seconds over its processes (workers.loadgen.run_level).
CLIENT_CPU_PERCENT_KEY = "client_cpu_percent"
CLIENT_CPU_SECONDS_KEY = "client_cpu_s"


# -- plateau ---------------------------------------------------------------------------------


def plateau(data: RunData) -> list[Proposal]:
    """The concurrency from which every later step of the sweep adds < 10% per doubling.

    Uses the levels at unlimited request rate with a concurrency and an output throughput; a
    step's gain is normalized to one doubling of concurrency, so 128 -> 512 counts as two.
    Requiring the flat part to run to the top of the sweep keeps one noisy step low in the
    curve from being called a plateau; where a step's levels ran in rounds, it is flat only if
    their rounds do not rise beyond the noise (PLATEAU_GAIN's example).
    """
    by_concurrency = _curve_levels(data.levels)
    curve = [(c, level.output_throughput) for c, level in by_concurrency.items()]
    if len(curve) < 2:
        return []
    gains = [
        _gain_per_doubling(c0, t0, c1, t1)
        for (c0, t0), (c1, t1) in zip(curve, curve[1:], strict=False)
    ]
    steps = list(by_concurrency.values())
    noise = [_within_noise(a, b) for a, b in zip(steps, steps[1:], strict=False)]
    start = len(gains)
    while (
        start > 0
        and gains[start - 1] is not None
        and gains[start - 1] < PLATEAU_GAIN
        # a step measured in rounds whose rise is beyond its noise is a rise, however small
        and noise[start - 1] is not False
    ):
        start -= 1
    if start == len(gains):
        return []
    at_c, at_t = curve[start]
    top_c, top_t = curve[-1]
    step_gain = gains[start]
    concurrency = [c for c, _ in curve]
    throughput = [t for _, t in curve]
    plan = ["Find the bottleneck behind the throughput plateau"]
    if start == len(gains) - 1:
        # only the sweep's last step is flat: one more level tells a plateau from noise
        plan.insert(0, f"Sweep above concurrency {top_c} to confirm the plateau")
    title = f"Throughput plateaus from concurrency {at_c} ({at_t:.0f} tok/s)"
    text = (
        f"Output throughput {_change_per_doubling(step_gain)} per doubling of concurrency after "
        f"{at_c} ({at_t:.0f} → {curve[start + 1][1]:.0f} tok/s) and reaches only "
        f"{top_t:.0f} tok/s at {top_c}: more concurrent requests no longer buy "
        f"throughput, so something other than the offered load limits it."
    )
    if all(noise[start:]):
        text += (
            " Every step from there rises within the noise of the levels' rounds (a "
            f"permutation test at {FALSE_ALARM * 100:.0f} % false alarms)."
        )
    cap, cap_source = running_cap(data)
    # from the cap on the engine runs no more requests at once: the rest queue
    at_cap = bool(cap) and at_c >= cap
    evidence = {
        "concurrency": concurrency,
        "output_throughput": throughput,
        "gain_per_doubling": [_round(g) for g in gains],
        # per step, whether its rise is within the levels' intervals; None for one round
        "within_noise": noise,
        "plateau_at": at_c,
        "plateau_throughput": at_t,
        "threshold": PLATEAU_GAIN,
        "running_cap": cap,
        "at_running_cap": at_cap,
        "chart": _line(
            concurrency,
            "concurrency",
            "output tok/s",
            [("output throughput", throughput)],
        ),
    }
    if at_cap:
        flag = _cap_flag(data)
        title += f", at the engine's cap ({flag} {cap})"
        text += (
            f" The flat part starts at or above the engine's running-request cap ({flag} {cap}, "
            f"{cap_source}): beyond {cap} concurrent requests the engine only queues the rest, "
            "so the cap is what the plateau coincides with; raise it first."
        )
        # the queue-cap finding's plan item, word for word: one action serves both
        plan.insert(0, _raise_cap_plan(flag, cap))
        # and its cap evidence, from which the item's change (and its button) is read
        evidence.update(
            {"cap": cap, "cap_source": cap_source, "flag": flag, "tested_concurrency": top_c}
        )
    return [
        Proposal(
            kind="plateau",
            key="throughput",
            severity="warning",
            title=title,
            text=text,
            evidence=evidence,
            plan=plan,
        )
    ]


def _gain_per_doubling(c0, t0, c1, t1):
    if t0 <= 0 or c1 <= c0:
        return None
    return (t1 / t0) ** (1 / math.log2(c1 / c0)) - 1


# -- queueing behind max-running-requests ----------------------------------------------------


def queueing(data: RunData) -> list[Proposal]:
    """Requests queued in the engine while its running count sits at the cap.

    The cap is the one the engine reported when the sweep started (the run snapshot), else the
    deployment's recorded max_running_requests. With engine samples the rule
    fires on samples with queued > 0 and running at the cap. Without engine samples it fires
    ("info") only when a level's achieved (else target) concurrency exceeded the cap, which
    queues the excess by construction of a continuous-batching engine; so does a run whose
    samples show no queue at the cap (vLLM's gauges read 0 between some of its steps). A queue
    below the cap with the KV cache full (or, where the engine does not report its cache, any
    queue below the cap) is the cache running short: no finding.
    """
    cap, cap_source = running_cap(data)
    if not cap:
        return []
    levels = sorted((lv for lv in data.levels if lv.concurrency), key=lambda lv: lv.concurrency)
    flag = _cap_flag(data)
    tested = max((lv.concurrency for lv in levels), default=None)
    at_cap = [
        s
        for s in data.engine_samples
        if (s.queued or 0) > 0 and (s.running or 0) >= CAP_FULL_FRACTION * cap
    ]
    evidence = {
        "cap": cap,
        "cap_source": cap_source,
        "flag": flag,
        "tested_concurrency": tested,
        "engine_samples": len(data.engine_samples),
    }
    plan = [_raise_cap_plan(flag, cap)]
    if not at_cap and any(_kv_cache_short(s) for s in data.engine_samples):
        return []
    if at_cap:
        concurrency = [lv.concurrency for lv in levels]
        per_level = {lv.concurrency: [] for lv in levels}
        for s in data.engine_samples:
            level = _level_of(s, data.levels)
            if level is not None and level.concurrency in per_level:
                per_level[level.concurrency].append(s)
        max_queued = max(s.queued for s in at_cap)
        evidence.update(
            {
                "basis": "engine_samples",
                "samples_queued_at_cap": len(at_cap),
                "max_queued": max_queued,
                "chart": _line(
                    concurrency,
                    "concurrency",
                    "requests",
                    [
                        ("max running", [_max_of(per_level[c], "running") for c in concurrency]),
                        ("max queued", [_max_of(per_level[c], "queued") for c in concurrency]),
                        ("cap", [cap] * len(concurrency)),
                    ],
                ),
            }
        )
        return [
            Proposal(
                kind="queueing",
                key="running-cap",
                severity="warning",
                title=f"Requests queue behind {flag} {cap}",
                text=(
                    f"In {len(at_cap)} of {len(data.engine_samples)} engine samples the engine ran "
                    f"{cap} requests (its cap) with up to {max_queued:.0f} more waiting: the cap, "
                    "not the GPUs, limits the batch at the concurrency tested."
                ),
                evidence=evidence,
                plan=plan,
            )
        ]
    # max_concurrent_requests counts requests per 1 s bucket, so it may exceed the concurrency
    offered = {
        lv.concurrency: min(lv.concurrency, lv.max_concurrent_requests or lv.concurrency)
        for lv in levels
    }
    above = [c for c in offered if offered[c] > cap]
    if not above:
        return []
    concurrency = list(offered)
    evidence.update(
        {
            "basis": "configuration",
            "levels_above_cap": above,
            "chart": _line(
                concurrency,
                "concurrency",
                "requests",
                [
                    ("concurrent requests offered", [offered[c] for c in concurrency]),
                    ("cap", [cap] * len(concurrency)),
                ],
            ),
        }
    )
    return [
        Proposal(
            kind="queueing",
            key="running-cap",
            severity="info",
            title=f"Levels above {flag} {cap} queue requests",
            text=(
                f"The engine runs at most {cap} requests at once; the sweep offered up to "
                f"{max(offered.values())}, so the rest waited in its queue. "
                + (
                    "The engine's samples did not catch the queue at the cap (its gauges read "
                    "between scheduler steps)."
                    if data.engine_samples
                    else "No engine samples were recorded to show the queue itself."
                )
            ),
            evidence=evidence,
            plan=plan,
        )
    ]


def _kv_cache_short(sample) -> bool:
    """A queue below the cap with the KV cache (nearly) full: the cache, not the cap, holds
    requests back. Where the engine reports its cache usage that decides: the running count
    alone misleads, since requests of one length finish in the same step and the gauges can
    read below the cap between steps while the cap is what queues."""
    if not (sample.queued or 0) > 0:
        return False
    if sample.kv_cache_usage is not None:
        return sample.kv_cache_usage >= KV_CACHE_FULL
    return True


def _cap_flag(data):
    """The engine's flag for its running-request cap."""
    # the stand-in takes SGLang's spelling, and so does an engine moeops does not know
    return CAP_FLAGS.get(data.engine, CAP_FLAGS["sglang"])


def _raise_cap_plan(flag, cap):
    """The plan item that raises the running-request cap: the queue-cap and the plateau
    findings propose it in these words, so that one item (and one engine action) serves both."""
    return f"Raise {flag} above {cap} and re-sweep"


@dataclass(frozen=True)
class CapChange:
    """The change a plan item that raises the running-request cap proposes: flag above cap
    (requests run at once), to target."""

    flag: str
    cap: int
    target: int

    def in_force(self, running_cap: int | None) -> bool:
        """Whether an engine running with running_cap has the change."""
        return running_cap is not None and running_cap > self.cap


def cap_change(title: str, kind: str, evidence: dict, engine: str = "") -> CapChange | None:
    """The cap change of the plan item titled `title` whose finding (kind, evidence) names the
    engine's cap, or None: the item _raise_cap_plan words for it, to the largest concurrency the
    sweep offered, else twice the cap. engine: the deployment's, for the flag of a finding that
    names none."""
    if kind not in CAP_FINDINGS:
        return None
    flag = evidence.get("flag") or CAP_FLAGS.get(engine)
    cap, tested = evidence.get("cap"), evidence.get("tested_concurrency")
    if not isinstance(flag, str) or not flag.startswith("--"):
        return None
    if not is_integer(cap) or cap < 1:
        return None
    if title != _raise_cap_plan(flag, cap):
        return None
    target = tested if is_integer(tested) and tested > cap else 2 * cap
    return CapChange(flag, cap, target)


def running_cap(data: RunData) -> tuple[int | None, str | None]:
    """(cap, where it came from): what the engine reported first, then the deployment."""
    reported = reported_running_cap(data.observed)
    if reported:
        source = data.observed.get("max_running_requests_source") or "the engine"
        return reported, f"reported by the engine ({source})"
    if data.max_running_requests:
        return data.max_running_requests, "deployment"
    return None, None


def _max_of(samples, attr):
    values = [getattr(s, attr) for s in samples if getattr(s, attr) is not None]
    return max(values) if values else None


# -- client-bound ----------------------------------------------------------------------------


def client_cpu_percent(raw: dict | None, started_at=None, finished_at=None) -> float | None:
    """The load generator's CPU use during a level, in % of one core per client process.

    raw["client_cpu_percent"] when given; else raw["client_cpu_s"] / (wall s × processes),
    the wall time from the level's window (or raw's own started_at/finished_at). Each client
    process is one asyncio loop on one core, so 100% means the client could go no faster.
    """
    raw = raw if isinstance(raw, dict) else {}
    given = raw.get(CLIENT_CPU_PERCENT_KEY)
    if _is_number(given):
        return float(given)
    cpu_s = raw.get(CLIENT_CPU_SECONDS_KEY)
    start = started_at if started_at is not None else raw.get("started_at")
    end = finished_at if finished_at is not None else raw.get("finished_at")
    processes = raw.get("processes") if _is_number(raw.get("processes")) else 1
    if not (_is_number(cpu_s) and _is_number(start) and _is_number(end)) or end <= start:
        return None
    return 100.0 * cpu_s / ((end - start) * max(processes, 1))


def _is_number(value):
    return is_number(value) and math.isfinite(value)


def client_bound(data: RunData) -> list[Proposal]:
    """The load generator, not the server, limited a level.

    Either its CPU reached CLIENT_CPU_SATURATED_PERCENT (see `client_cpu_percent`), or its
    achieved concurrency (max_concurrent_requests) stayed below 90% of the target, the target
    being the level's concurrency or the requests it sent, whichever is fewer.
    """
    levels = sorted((lv for lv in data.levels if lv.concurrency), key=lambda lv: lv.concurrency)
    saturated, short = [], []
    for lv in levels:
        if lv.client_cpu_percent is not None and lv.client_cpu_percent >= (
            CLIENT_CPU_SATURATED_PERCENT
        ):
            saturated.append(lv.concurrency)
        target = min(lv.concurrency, lv.requests) if lv.requests else lv.concurrency
        achieved = lv.max_concurrent_requests
        if achieved is not None and achieved < CLIENT_CONCURRENCY_FRACTION * target:
            short.append(lv.concurrency)
    if not saturated and not short:
        return []
    concurrency = [lv.concurrency for lv in levels]
    reasons = []
    if saturated:
        reasons.append(
            f"its CPU reached {CLIENT_CPU_SATURATED_PERCENT:.0f}% or more at concurrency "
            + ", ".join(map(str, saturated))
        )
    if short:
        reasons.append(
            "it kept fewer than "
            f"{CLIENT_CONCURRENCY_FRACTION:.0%} of the target requests in flight at concurrency "
            + ", ".join(map(str, short))
        )
    return [
        Proposal(
            kind="client_bound",
            key="load-generator",
            severity="warning",
            title="The load generator limited the sweep",
            text="The load generator, not the server, set the pace: " + "; ".join(reasons) + ".",
            evidence={
                "levels_cpu_saturated": saturated,
                "levels_below_target": short,
                "concurrency": concurrency,
                "max_concurrent_requests": [lv.max_concurrent_requests for lv in levels],
                "client_cpu_percent": [_round(lv.client_cpu_percent, 2) for lv in levels],
                "thresholds": {
                    "client_cpu_percent": CLIENT_CPU_SATURATED_PERCENT,
                    "concurrency_fraction": CLIENT_CONCURRENCY_FRACTION,
                },
                "chart": _line(
                    concurrency,
                    "target concurrency",
                    "requests in flight",
                    [
                        ("target", concurrency),
                        ("achieved", [lv.max_concurrent_requests for lv in levels]),
                    ],
                ),
            },
            plan=["Give the load generator more CPU (or a second client machine) and re-sweep"],
        )
    ]


# -- failed requests -------------------------------------------------------------------------


def failed_requests(data: RunData) -> list[Proposal]:
    """Levels where every request failed: the level measured the error, not the engine.

    The engine's own message comes first, verbatim (the load generator's all_failed_with), so
    that "Token id 25531 is out of vocabulary" is read before any chart.
    """
    dead = [lv for lv in data.levels if lv.all_failed]
    if not dead:
        return []
    first = min(dead, key=lambda lv: lv.concurrency or 0)
    cause = first.all_failed_with or "requests failed for several reasons"
    where = ", ".join(str(lv.concurrency) for lv in dead)
    return [
        Proposal(
            kind="failed_requests",
            key="all-failed",
            severity="critical",
            title=f"Every request failed at concurrency {where}: {cause}"[:200],
            text=(
                f"{cause}\n\nAll {first.failed} requests at concurrency {first.concurrency} "
                f"failed{' the same way' if first.all_failed_with else ''}; "
                f"{len(dead)} of {len(data.levels)} levels measured nothing but errors."
            ),
            evidence={
                "error": cause,
                "levels": [lv.concurrency for lv in dead],
                "failed": [lv.failed for lv in dead],
                "chart": None,
            },
            plan=["Fix what makes the engine refuse the requests, then sweep again"],
        )
    ]


# -- a capacity that stops at the running-request cap -----------------------------------------


def capacity_at_cap(data: RunData) -> list[Proposal]:
    """A capacity search whose bracket straddles the engine's running-request cap: the largest
    load within the SLO runs at most `cap` requests at once, the first load beyond it more,
    which the engine only queues. The cap, not the GPUs, sets the capacity: the plan item is
    the queue-cap finding's, word for word, so that its restart action serves it too."""
    cap, cap_source = running_cap(data)
    answer = data.capacity
    if not limited_by_cap(answer, cap):
        return []
    flag = _cap_flag(data)
    low, high = answer["bracket"]
    tested = max(p["load"] for p in answer.get("probes") or [{"load": high}])
    binding = (answer.get("binding") or {}).get("sentence")
    profile = answer.get("profile") or "the SLO profile"
    text = (
        f"The capacity search against {profile} ends at {low} concurrent requests, and the "
        f"first load beyond it ({high}) asks for more requests at once than the engine's "
        f"running-request cap ({flag} {cap}, {cap_source}) runs: the engine only queues the "
        "rest, so their latency grows while the GPUs may have room. "
    )
    if binding:
        text += f"{binding[0].upper()}{binding[1:]}. "
    text += "Raise the cap and search again to see what the GPUs themselves sustain."
    return [
        Proposal(
            kind="capacity",
            key="running-cap",
            severity="warning",
            title=f"Capacity stops at the engine's cap: {low} concurrent ({flag} {cap})",
            text=text,
            evidence={
                "capacity": low,
                "bracket": [low, high],
                "binding": binding,
                "cap": cap,
                "cap_source": cap_source,
                "flag": flag,
                "tested_concurrency": tested,
            },
            plan=[_raise_cap_plan(flag, cap)],
        )
    ]
