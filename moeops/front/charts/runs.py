"""The run page's charts of its levels: throughput and latency against load, and what each
level did to the engine's counters."""

from moeops.front.charts.figures import figure, line_trace, log_axis_toggle
from moeops.front.charts.load import (
    LOAD_AXES,
    LOAD_WORDS,
    add_band,
    level_concurrency,
    level_rate,
    load_axis,
    load_line,
    load_lines,
)


def _vs_load(traces, name, levels, key, axis, unit_hover, **extra):
    """The lines of one metric of a run's levels vs load (load_lines), each with the band of
    its 95 % interval where the levels ran several rounds."""
    lines = load_lines(levels, key, axis)
    for cap, mine, points in lines:
        hover = unit_hover + "<extra>" + name + "</extra>"
        line = load_line(name, points, cap, len(lines), hover, **extra)
        traces.append(line)
        add_band(
            traces, line["name"], mine, key, level_rate if cap is not None else level_concurrency
        )


def run_throughput(levels):
    """A run's output and total (input + output) tok/s vs its load (load_axis: concurrency, or
    the rate asked, one line per cap); output tok/s with the band of its 95 % interval where the
    levels ran several rounds."""
    axis = load_axis(levels)
    traces = []
    for key, name in (("output_throughput", "output"), ("total_token_throughput", "total")):
        _vs_load(traces, name, levels, key, axis, "%{y:,.0f} tok/s")
    return figure(
        traces,
        f"Throughput vs {LOAD_WORDS[axis]}",
        LOAD_AXES[axis],
        {"title": {"text": "tok/s"}, "rangemode": "tozero"},
    )


def run_latency(levels, metric, title):
    """p50 and p99 of one latency metric (ttft, tpot, itl, e2el; ms) vs the run's load
    (load_axis), each with the band of its 95 % interval where the levels ran several rounds;
    TTFT with a linear/log switch."""
    axis = load_axis(levels)
    traces = []
    for stat, name, dash in (("median", "p50", "solid"), ("p99", "p99", "dash")):
        key = f"{stat}_{metric}_ms"
        _vs_load(traces, name, levels, key, axis, "%{y:,.1f} ms", line={"dash": dash})
    fig = figure(traces, title, LOAD_AXES[axis], {"title": {"text": "ms"}, "rangemode": "tozero"})
    if metric == "ttft":
        fig["layout"].update(log_axis_toggle(title))
    return fig


def engine_counters(levels):
    """What each level did to the engine, from its /metrics counters: prefix-cache hit rate and
    speculative-decoding acceptance (%, left axis) and preemptions (right axis), one point per
    level. levels: [(level name, LevelResult.engine_figures())], in the run's order; levels
    without counters are left out."""
    named = [(name, fig) for name, fig in levels if fig]
    traces = []
    for key, name in (
        ("prefix_cache_hit_rate", "prefix-cache hit rate"),
        ("spec_acceptance_rate", "speculative acceptance"),
    ):
        points = [(level, fig[key] * 100) for level, fig in named if fig.get(key) is not None]
        if points:
            hover = "%{x}<br>%{y:.1f} %<extra>" + name + "</extra>"
            traces.append(line_trace(name, points, hovertemplate=hover))
    preempted = [(level, fig["preemptions"]) for level, fig in named if fig.get("preemptions")]
    if preempted:
        traces.append(
            {
                "type": "bar",
                "name": "preemptions",
                "x": [level for level, _ in preempted],
                "y": [n for _, n in preempted],
                "yaxis": "y2",
                "opacity": 0.5,
                "hovertemplate": "%{x}<br>%{y:,.0f} preemptions<extra></extra>",
            }
        )
    return figure(
        traces,
        "Engine counters per level",
        {"title": {"text": "level"}, "type": "category"},
        {"title": {"text": "%"}, "range": [0, 100]},
        yaxis2={
            "title": {"text": "preemptions"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
    )
