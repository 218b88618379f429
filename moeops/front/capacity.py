"""What the pages show of a capacity search's answer (moeops.runs.capacity stores it): the run
page's card and charts, and the one-line capacity of the deployment page, dashboard and compare."""

from domain.capacity import ENDS, limits_of
from domain.cost import cost_per_million_output_tokens
from domain.intervals import with_interval
from domain.slo import METRIC_LABELS
from moeops.front.charts.capacity import capacity_limit


def load_text(answer, load):
    """ "48 concurrent" or "3.25 req/s" in the answer's unit; "none" for no load."""
    if load is None:
        return "none"
    if answer.get("mode") == "request_rate":
        return f"{load:.3g} req/s"
    return f"{load:g} concurrent"


def bracket_text(answer, bracket):
    low, high = bracket
    if high is None:
        return f"at least {load_text(answer, low)}"
    if low is None:
        return f"below {load_text(answer, high)}"
    return f"{low:g}–{high:g}"


def headline(answer):
    """ "48 concurrent (48–50)": the conservative capacity with its bracket, for tables."""
    if not answer:
        return ""
    return f"{load_text(answer, answer.get('load'))} ({bracket_text(answer, answer['bracket'])})"


def _figure(value, digits, unit=""):
    if value is None:
        return None
    return f"{value:,.{digits}f}{unit}"


def card(run):
    """The run page's capacity card: the answer in sentences and what the deployment does at
    the capacity point (each figure, or None where it is unknown); None without an answer."""
    answer = run.capacity
    if not answer:
        return None
    point = answer.get("at_capacity") or {}
    host = run.deployment.host
    throughput = point.get("output_throughput")
    cost = cost_per_million_output_tokens(
        host.price_per_gpu_hour, host.currency, run.measured_gpu_count(), throughput
    )
    cap_share = point.get("cap_share")
    figures = [
        (
            "Output tok/s",
            with_interval(throughput, point.get("output_throughput_interval"))
            if throughput is not None
            else None,
        ),
        ("Goodput", _figure(point.get("request_goodput"), 2, " req/s")),
        ("tok/s per GPU", _figure(point.get("per_gpu"), 0)),
        ("tok/s per user", _figure(point.get("per_user"), 1)),
        (
            "Running-request cap in use",
            f"{cap_share:.0%} of {point['running_cap']}" if cap_share is not None else None,
        ),
        ("GPU utilisation", _figure(point.get("gpu_util"), 0, " %")),
        ("GPU power", _figure(point.get("power_w"), 0, " W")),
        (
            "Cost per 1M output tokens",
            f"{cost.value:,.2f} {host.currency}" if cost.value is not None else None,
        ),
    ]
    return {
        "answer": answer,
        "load": load_text(answer, answer.get("load")),
        "bracket": bracket_text(answer, answer["bracket"]),
        "load_on_medians": load_text(answer, answer.get("load_on_medians")),
        "bracket_on_medians": bracket_text(answer, answer["bracket_on_medians"]),
        "end": ENDS.get(answer.get("end"), ""),
        "binding": (answer.get("binding") or {}).get("sentence", ""),
        "profile": answer.get("profile", ""),
        "figures": figures,
        "cost_absent": cost.reason,
        "levels": len(answer.get("probes") or []),
        "requests": answer.get("requests"),
    }


def figures(run, levels):
    """{element id: figure} of each limited metric of the search's SLO against load."""
    limits, _ = limits_of(run.parameters)
    mode = run.parameters.get("mode") or "concurrency"
    out = {}
    for metric, (percentile, limit_ms) in limits.items():
        label = f"{METRIC_LABELS[metric]} {percentile}"
        out[f"slo-{metric}"] = capacity_limit(levels, mode, metric, percentile, limit_ms, label)
    return out
