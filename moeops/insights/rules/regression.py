"""The regression rule: a level's throughput below the deployment's previous comparable run's
(comparable_key says which runs compare), beyond the noise where rounds say what noise is."""

from domain.intervals import FALSE_ALARM, with_interval
from domain.workloads import workload_identity
from moeops.insights.rules.evidence import _key, _line, _round
from moeops.insights.rules.run_data import (
    Proposal,
    RunData,
    _curve_levels,
    _rounds_compared,
    _within_noise,
)

# Regression: a level whose output throughput is more than this fraction below the previous
# comparable run's, and beyond the noise: both levels ran in rounds and this run's 95 % interval
# lies wholly below the previous run's. 1,234 (1,180–1,290) -> 1,050 (1,010–1,090) is a
# regression; 1,234 (1,000–1,470) -> 1,050 (850–1,250), a 15 % drop of the medians, is within
# the noise and says nothing. Where a level has one round (no interval) a drop > 10 % is only a
# "possible regression" at info severity, as one round cannot tell a drop from noise (real vLLM's
# rounds spread ±20–40 %); and none where the one-round figure lies inside the other's interval.
REGRESSION_DROP = 0.10
# Regression: at most this many of the changes between the two runs are named in the text.
REGRESSION_CHANGES_SHOWN = 6


# -- regression ------------------------------------------------------------------------------


def _measured(levels):
    return [level for level in levels if not level.all_failed]


def comparable_key(parameters: dict) -> tuple | None:
    """What two runs must share to be compared: levels, input and output length, and the
    arrivals (request rates, burstiness, ramp-up; none for a closed loop) and the workload sent
    (domain.workloads.workload_identity); None if unset."""
    levels = parameters.get("levels")
    input_len, output_len = parameters.get("input_len"), parameters.get("output_len")
    if not levels or not isinstance(levels, list) or input_len is None or output_len is None:
        return None
    rates = parameters.get("request_rates") or [parameters.get("request_rate")]
    arrivals = (
        tuple(sorted(str(float(r)) for r in rates if r is not None)),
        str(float(parameters.get("burstiness") or 1.0)),
        str(float(parameters.get("ramp_up_s") or 0.0)),
    )
    workload = tuple(str(v) for v in workload_identity(parameters.get("workload")).values())
    return (tuple(sorted(map(str, levels))), str(input_len), str(output_len), *arrivals, workload)


def regression(data: RunData) -> list[Proposal]:
    """A level's output throughput more than 10% below the previous comparable run's and beyond
    the noise (REGRESSION_DROP says how); a level whose every request failed, in either run, is
    no throughput to compare. Drops of levels with one round are only a possible regression."""
    previous = data.previous
    if previous is None:
        return []
    now_levels = _curve_levels(_measured(data.levels))
    before_levels = _curve_levels(_measured(previous.levels))
    concurrency = sorted(set(now_levels) & set(before_levels))
    now = {c: now_levels[c].output_throughput for c in concurrency}
    before = {c: before_levels[c].output_throughput for c in concurrency}
    drops = {c: 1 - now[c] / before[c] for c in concurrency if before[c] > 0}
    verdicts = {c: _drop_verdict(now_levels[c], before_levels[c], d) for c, d in drops.items()}
    beyond = [c for c, verdict in verdicts.items() if verdict == "beyond noise"]
    possible = [c for c, verdict in verdicts.items() if verdict == "possible"]
    worst = beyond or possible
    if not worst:
        return []
    c = max(worst, key=lambda k: drops[k])
    before_label = previous.label or f"run {previous.uuid[:8]}"
    if previous.changes:
        shown = "; ".join(previous.changes[:REGRESSION_CHANGES_SHOWN])
        more = len(previous.changes) - REGRESSION_CHANGES_SHOWN
        changed = f" What changed since then: {shown}" + (
            f" (and {more} more)." if more > 0 else "."
        )
    else:
        changed = " Nothing on record changed between the two runs' snapshots."
    now_interval = now_levels[c].throughput_interval
    before_interval = before_levels[c].throughput_interval
    fell = (
        f"At concurrency {c} output tok/s fell from {with_interval(before[c], before_interval)} "
        f"in {before_label} to {with_interval(now[c], now_interval)} in this run (same levels "
        "and lengths)"
    )
    judged = _rounds_compared(now_levels[c], before_levels[c])
    if beyond:
        title = f"Throughput {drops[c]:.0%} below {before_label} at concurrency {c}"
        said = (
            f"{fell}: {judged.change()} beyond the noise (a permutation test of their rounds "
            f"at {FALSE_ALARM * 100:.0f} % false alarms, p = {judged.p_value:.3f}); "
            f"{len(beyond)} of {len(concurrency)} levels fell more than {REGRESSION_DROP:.0%} "
            "beyond the noise."
        )
    else:
        title = (
            f"Possible regression: throughput {drops[c]:.0%} below {before_label} at "
            f"concurrency {c}"
        )
        said = f"{fell}: {judged.why}: cannot tell from noise; re-run with rounds ≥ 4."
    return [
        Proposal(
            kind="regression",
            key=_key("vs", previous.uuid),
            severity="warning" if beyond else "info",
            title=title,
            text=said + changed,
            evidence={
                "previous_run": {"id": previous.id, "uuid": previous.uuid, "label": previous.label},
                "changes": list(previous.changes),
                "concurrency": concurrency,
                "output_throughput": [now[k] for k in concurrency],
                "previous_output_throughput": [before[k] for k in concurrency],
                "interval": [_interval_list(now_levels[k]) for k in concurrency],
                "previous_interval": [_interval_list(before_levels[k]) for k in concurrency],
                "drop": [_round(drops.get(k)) for k in concurrency],
                "verdict": [verdicts.get(k) for k in concurrency],
                "threshold": REGRESSION_DROP,
                "chart": _line(
                    concurrency,
                    "concurrency",
                    "output tok/s",
                    [
                        ("this run", [now[k] for k in concurrency]),
                        (before_label, [before[k] for k in concurrency]),
                    ],
                ),
            },
            plan=[f"Find what changed since {before_label} (engine, launch arguments, topology)"],
        )
    ]


def _drop_verdict(now, before, drop):
    """ "beyond noise" (the rounds fell: domain.intervals.compare_rounds), "possible" (a drop
    too few rounds cannot tell from noise) or None."""
    if drop <= REGRESSION_DROP:
        return None
    within = _within_noise(now, before)
    if within is None:
        return "possible"
    return None if within else "beyond noise"


def _interval_list(level):
    interval = level.throughput_interval
    return None if interval is None else [_round(v, 1) for v in interval]
