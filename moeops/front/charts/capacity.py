"""Capacity searches: a search's limited metric against load (run page), and a deployment's
searches over time."""

from domain.capacity import capacity_range
from moeops.front.charts.figures import figure, limit_line, line_trace
from moeops.front.charts.load import CONCURRENCY_AXIS, add_band, level_concurrency, level_rate


def capacity_limit(levels, mode, metric, percentile, limit_ms, label):
    """One limit of a capacity search's SLO: the limited percentile (ms) of each level against
    its load (concurrency, or req/s in request_rate mode), with the band of its 95 % interval
    and the limit drawn across; `label` names the metric ("TPOT p99")."""
    stat = "median" if percentile == "p50" else percentile
    key = f"{stat}_{metric}_ms"
    x_of = level_concurrency if mode == "concurrency" else level_rate
    points = sorted(
        (x_of(lv), getattr(lv, key))
        for lv in levels
        if x_of(lv) is not None and getattr(lv, key) is not None
    )
    unit = "concurrent" if mode == "concurrency" else "req/s"
    traces = []
    if points:
        hover = "%{x} " + unit + "<br>%{y:,.1f} ms<extra>" + label + "</extra>"
        traces.append(line_trace(label, points, hovertemplate=hover))
        add_band(traces, label, levels, key, x_of)
    shape, annotation = limit_line(limit_ms, f"limit {limit_ms:g} ms")
    xaxis = CONCURRENCY_AXIS if mode == "concurrency" else {"title": {"text": "req/s"}}
    return figure(
        traces,
        f"{label} against load, limit {limit_ms:g} ms",
        xaxis,
        {"title": {"text": "ms"}, "rangemode": "tozero"},
        shapes=[shape],
        annotations=[annotation],
    )


def capacity_over_time(runs):
    """A deployment's capacity searches (oldest first) against when they ran: the conservative
    capacity with a bar up to where the medians fail (domain.capacity.capacity_range), and
    the answer on medians."""
    runs = [run for run in runs if capacity_range(run.capacity) is not None]
    mode = runs[0].capacity.get("mode") if runs else "concurrency"
    unit = "concurrent requests" if mode == "concurrency" else "req/s"
    when = [run.created.strftime("%Y-%m-%d %H:%M:%S") for run in runs]
    low = [capacity_range(run.capacity)[0] for run in runs]
    high = [capacity_range(run.capacity)[1] for run in runs]
    names = [run.display_label() for run in runs]
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "capacity (95 % upper bounds within the SLO)",
            "x": when,
            "y": low,
            "text": names,
            "error_y": {
                "type": "data",
                "symmetric": False,
                "array": [h - lo for lo, h in zip(low, high, strict=True)],
                "arrayminus": [0] * len(low),
            },
            "hovertemplate": "%{text}<br>%{y:g} " + unit + "<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "markers",
            "name": "on medians",
            "x": when,
            "y": [run.capacity.get("load_on_medians") for run in runs],
            "marker": {"symbol": "circle-open"},
            "hovertemplate": "%{y:g} " + unit + " on medians<extra></extra>",
        },
    ]
    return figure(
        traces,
        "Capacity at the default SLO profile over time",
        {"type": "date"},
        {"title": {"text": unit}, "rangemode": "tozero"},
    )
