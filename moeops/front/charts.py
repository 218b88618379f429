"""Plotly figures as plain dicts (data + layout), rendered in the page by plotly.js.

Units as docs/metrics.md gives them: throughput in tok/s, latencies in ms, power in W, time as UTC
epoch s (shown as UTC dates).
"""

import datetime as dt
import re

from django.core.serializers.json import DjangoJSONEncoder

from domain.capacity import capacity_range
from domain.numbers import is_number

LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "legend": {"orientation": "h", "y": -0.25},
    "hovermode": "closest",
    "template": None,
    "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
}
# D3's category10, plotly's own default colorway; named here so groups can share a color.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
CONCURRENCY_AXIS = {"title": {"text": "concurrency"}, "type": "log", "dtick": 0.30103}
RATE_AXIS = {"title": {"text": "request rate asked (req/s)"}, "type": "log"}
LOAD_AXES = {"concurrency": CONCURRENCY_AXIS, "request_rate": RATE_AXIS}
LOAD_WORDS = {"concurrency": "concurrency", "request_rate": "request rate"}
# Above this many points a line reads better without a marker on every point.
MARKER_LIMIT = 60
# Pareto labels closer than this to one already placed (fraction of each axis's span, about
# a "c=128" label's size on a half-width chart) are left to the hover.
LABEL_GAP = (0.08, 0.06)


class CompactJSONEncoder(DjangoJSONEncoder):
    """JSON without a space after each "," and ":": a chart holds thousands of numbers."""

    item_separator = ","
    key_separator = ":"


def figure(traces, title, xaxis, yaxis, **layout):
    return {
        "data": traces,
        "layout": {
            **LAYOUT,
            "title": {"text": title},
            "xaxis": xaxis,
            "yaxis": yaxis,
            **layout,
        },
    }


def _mode(points):
    return "lines" if len(points) > MARKER_LIMIT else "lines+markers"


def epoch_to_plotly(ts):
    """UTC epoch s → the date string plotly's date axis reads ("2026-11-29 15:01:42.123")."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _level_points(levels, key):
    return sorted(
        (level.concurrency, getattr(level, key))
        for level in levels
        if level.concurrency is not None and getattr(level, key) is not None
    )


def _concurrency(level):
    return level.concurrency


def _rate(level):
    return level.request_rate


def load_axis(levels):
    """What a chart vs load plots the levels against: "request_rate" when every level sent at
    a rate (a rate sweep, a request-rate capacity search: at one cap its levels differ in
    rate alone), else "concurrency"."""
    placed = [level for level in levels if level.concurrency is not None]
    rated = placed and all(level.request_rate is not None for level in placed)
    return "request_rate" if rated else "concurrency"


def _load_lines(levels, key, axis):
    """[(cap or None, levels, points)]: on the concurrency axis one line of (concurrency,
    value); on the rate axis one line per cap (concurrency) of (asked req/s, value, achieved
    req/s), each sorted by x."""
    if axis == "concurrency":
        points = _level_points(levels, key)
        return [(None, levels, points)] if points else []
    caps = sorted({level.concurrency for level in levels if level.concurrency is not None})
    lines = []
    for cap in caps:
        mine = [lv for lv in levels if lv.concurrency == cap and lv.request_rate is not None]
        points = sorted(
            (lv.request_rate, getattr(lv, key), lv.achieved_request_rate)
            for lv in mine
            if getattr(lv, key) is not None
        )
        if points:
            lines.append((cap, mine, points))
    return lines


def _load_line(name, points, cap, caps, unit_hover, **extra):
    """One line of _load_lines: named for its cap when the chart has several; the hover says
    the level's load (its concurrency, or the rate asked and achieved) and unit_hover."""
    if cap is None:
        return _line(name, points, hovertemplate="c=%{x}<br>" + unit_hover, **extra)
    named = f"{name} (cap {cap})" if caps > 1 else name
    hover = "%{x:g} req/s asked, %{customdata:.3g} achieved<br>" + unit_hover
    line = _line(named, [(x, y) for x, y, _ in points], hovertemplate=hover, **extra)
    line["customdata"] = [achieved for _, _, achieved in points]
    return line


def _band(name, levels, key, x_of=_concurrency):
    """The 95 % interval over the rounds of `key` as a filled band around its line (one trace:
    the upper ends left to right, then the lower ends back), or None without intervals; x_of:
    a level's x (its concurrency)."""
    ends = sorted(
        (x_of(level), *level.interval(key))
        for level in levels
        if x_of(level) is not None and level.interval(key) is not None
    )
    if not ends:
        return None
    return {
        "type": "scatter",
        "mode": "lines",
        "name": f"{name} 95 % interval",
        "x": [c for c, _, _ in ends] + [c for c, _, _ in reversed(ends)],
        "y": [high for _, _, high in ends] + [low for _, low, _ in reversed(ends)],
        "fill": "toself",
        "opacity": 0.2,
        "line": {"width": 0},
        "hoverinfo": "skip",
    }


def _with_band(traces, name, levels, key, x_of=_concurrency):
    band = _band(name, levels, key, x_of)
    if band is not None:
        traces.append(band)


def _line(name, points, **extra):
    return {
        "type": "scatter",
        "mode": _mode(points),
        "name": name,
        "x": [x for x, _ in points],
        "y": [y for _, y in points],
        **extra,
    }


STANDIN_MARK = " [stand-in]"


def run_name(run):
    """A run as a chart names it: its label, marked when the stand-in engine answered it."""
    return run.display_label() + (STANDIN_MARK if run.is_standin else "")


def mark_standin(fig):
    """The figure of a stand-in run: every series and the title say so."""
    for trace in fig["data"]:
        trace["name"] = (trace.get("name") or "") + STANDIN_MARK
    title = fig["layout"].get("title") or {}
    if title.get("text"):
        title["text"] += " · stand-in engine, not a measurement"
    return fig


# A chart with the linear/log switch: the title at the top of a taller top margin, the switch in
# a row of its own between title and plot, so a long title (a stand-in's) never runs under it.
TOGGLE_MARGIN_TOP = 80


def _log_toggle(title):
    """Layout fields of a chart titled `title` with buttons that switch the y axis between
    linear and log (a TTFT that queues spans orders of magnitude across a sweep)."""
    return {
        "title": {"text": title, "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 10}},
        "margin": {**LAYOUT["margin"], "t": TOGGLE_MARGIN_TOP},
        "updatemenus": [
            {
                "type": "buttons",
                "direction": "right",
                # left, just above the plot: the top right is plotly's own mode bar
                "x": 0,
                "xanchor": "left",
                "y": 1.02,
                "yanchor": "bottom",
                "pad": {"t": 0, "r": 0},
                "showactive": True,
                "active": 0,
                "font": {"size": 11},
                "buttons": [
                    {
                        "label": "linear",
                        "method": "relayout",
                        "args": [{"yaxis.type": "linear", "yaxis.autorange": True}],
                    },
                    {
                        "label": "log",
                        "method": "relayout",
                        "args": [{"yaxis.type": "log", "yaxis.autorange": True}],
                    },
                ],
            }
        ],
    }


def throughput_vs_load(runs):
    """Output tok/s vs load, one line per run (and cap): the rate asked when every run's levels
    sent at rates, else concurrency (levels without a concurrency are left out)."""
    runs = list(runs)
    levels = {run.pk: list(run.levels.all()) for run in runs}
    axis = _common_axis(levels.values())
    traces = []
    for run in runs:
        lines = _load_lines(levels[run.pk], "output_throughput", axis)
        for cap, _, points in lines:
            hover = "%{y:.0f} tok/s<extra>%{fullData.name}</extra>"
            traces.append(_load_line(run_name(run), points, cap, len(lines), hover))
    return figure(
        traces,
        f"Output throughput vs {LOAD_WORDS[axis]}",
        LOAD_AXES[axis],
        {"title": {"text": "output tok/s"}, "rangemode": "tozero"},
    )


def _common_axis(level_lists):
    """The load axis of a chart of several runs: the rate when each run's is, else concurrency."""
    axes = {load_axis(levels) for levels in level_lists}
    return "request_rate" if axes == {"request_rate"} else "concurrency"


def _vs_load(traces, name, levels, key, axis, unit_hover, **extra):
    """The lines of one metric of a run's levels vs load (_load_lines), each with the band of
    its 95 % interval where the levels ran several rounds."""
    lines = _load_lines(levels, key, axis)
    for cap, mine, points in lines:
        hover = unit_hover + "<extra>" + name + "</extra>"
        line = _load_line(name, points, cap, len(lines), hover, **extra)
        traces.append(line)
        _with_band(traces, line["name"], mine, key, _rate if cap is not None else _concurrency)


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
        fig["layout"].update(_log_toggle(title))
    return fig


def _band_shapes(bands):
    """Shaded rectangles behind a time chart, one per concurrency level, and their labels."""
    shapes, annotations = [], []
    for i, (concurrency, start, end) in enumerate(bands):
        x0, x1 = epoch_to_plotly(start), epoch_to_plotly(end)
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": x0,
                "x1": x1,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#3056d3" if i % 2 else "#98a2b3",
                "opacity": 0.08,
                "line": {"width": 0},
                "layer": "below",
            }
        )
        annotations.append(
            {
                "x": epoch_to_plotly((start + end) / 2),
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "text": f"c={concurrency}" if concurrency is not None else "level",
                "font": {"size": 10, "color": "#667085"},
            }
        )
    return shapes, annotations


def _limit_line(value, label):
    shape = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": "y",
        "y0": value,
        "y1": value,
        "line": {"color": "#b42318", "dash": "dash", "width": 1.5},
    }
    annotation = {
        "xref": "paper",
        "x": 1,
        "xanchor": "right",
        "yref": "y",
        "y": value,
        "yanchor": "bottom",
        "showarrow": False,
        "text": label,
        "font": {"size": 11, "color": "#b42318"},
    }
    return shape, annotation


def _time_layout(bands, extra_shapes=(), extra_annotations=()):
    shapes, annotations = _band_shapes(bands)
    return {
        "shapes": [*shapes, *extra_shapes],
        "annotations": [*annotations, *extra_annotations],
    }


# Decimals a bucket's mean is sent with, per GPU figure: a tenth of what the hover shows whole;
# the 15 digits of a float mean are bytes that no one reads (min and max are samples' own).
MEAN_DIGITS = {"util": 1, "power": 1, "mem": 0, "clock": 0, "engine": 1}


def _rounded(means, digits, lows=None, highs=None):
    """Bucket means to `digits` decimals, held within their bucket's min and max (a mean of
    698.171 W is no 698.2 W above the bucket's peak)."""
    lows = lows or [None] * len(means)
    highs = highs or [None] * len(means)
    shown = []
    for mean, low, high in zip(means, lows, highs, strict=True):
        if mean is not None:
            mean = round(mean, digits) if digits else round(mean)
            mean = mean if high is None else min(mean, high)
            mean = mean if low is None else max(mean, low)
        shown.append(mean)
    return shown


def _whole(value):
    """A whole float as an int ("700" in JSON, not "700.0"); others as they are."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _time_x(series, group):
    """The x of a time chart's trace: its buckets' centres (UTC), as a first date and a step
    (x0, dx in ms, plotly's date step) where the buckets follow one another, which a long
    run's do, else as one date per bucket."""
    buckets = group["bucket"]
    centres = [series.bucket_start(b + 0.5) for b in buckets]
    if buckets[-1] - buckets[0] == len(buckets) - 1:
        return {"x0": epoch_to_plotly(centres[0]), "dx": round(series.width * 1000, 3)}
    return {"x": [epoch_to_plotly(t) for t in centres]}


def _gpu_traces(series, key, unit, fmt):
    traces = []
    for gpu_index in sorted(series.groups):
        group = series.groups[gpu_index]
        if all(v is None for v in group[key]):
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": _mode(group[key]),
                "name": f"GPU{gpu_index}",
                **_time_x(series, group),
                "y": _rounded(
                    group[key], MEAN_DIGITS[key], group[f"{key}_min"], group[f"{key}_max"]
                ),
                "customdata": [
                    [_whole(low), _whole(high)]
                    for low, high in zip(group[f"{key}_min"], group[f"{key}_max"], strict=True)
                ],
                "hovertemplate": f"%{{y:{fmt}}} {unit} (min %{{customdata[0]:{fmt}}}, "
                f"max %{{customdata[1]:{fmt}}})<extra>GPU{gpu_index}</extra>",
                "line": {"width": 1.5},
            }
        )
    return traces


def _bucket_note(series):
    if not series.count or not series.width or series.width <= 1.0:
        return ""
    return f" (mean per {series.width:.0f} s; {series.count:,} samples)"


def _single_reading(series):
    """True when the samples are one reading of the GPUs (one instant), as nvidia-smi gives."""
    return bool(series.count) and series.t0 == series.t1


def _reading_bars(series, key, unit):
    """One reading per GPU as bars labelled with their value (a time axis of one instant
    would show nothing)."""
    gpus = sorted(series.groups)
    values = [series.groups[g][key][0] for g in gpus]
    return [
        {
            "type": "bar",
            "name": "one reading",
            "x": [f"GPU{g}" for g in gpus],
            "y": values,
            "text": [f"{v:.0f} {unit}" if v is not None else "" for v in values],
            "textposition": "outside",
            "cliponaxis": False,
            "marker": {"color": "#3056d3"},
            "hovertemplate": "%{x}: %{y:.0f} " + unit + "<extra></extra>",
        }
    ]


def _reading_title(title, series):
    when = dt.datetime.fromtimestamp(series.t0, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{title}: one reading per GPU at {when} UTC"


def _gpu_figure(series, bands, key, unit, title, yaxis, shapes=None, annotations=None, fmt=".0f"):
    """Per-GPU `key` over time, or one bar per GPU when the samples are a single reading; no
    trace for a GPU without values of `key`."""
    limits = {} if shapes is None else {"shapes": shapes, "annotations": annotations}
    if not any(v is not None for g in series.groups.values() for v in g[key]):
        return figure([], title, {"type": "date"}, yaxis)
    if _single_reading(series):
        return figure(
            _reading_bars(series, key, unit),
            _reading_title(title, series),
            {"type": "category"},
            yaxis,
            **limits,
            showlegend=False,
        )
    return figure(
        _gpu_traces(series, key, unit, fmt),
        title + _bucket_note(series),
        {"type": "date", "title": {"text": "time (UTC)"}},
        yaxis,
        **_time_layout(bands, shapes or (), annotations or ()),
    )


def gpu_utilization(series, bands):
    """GPU utilization (%) over time, one line per GPU, levels as shaded bands."""
    yaxis = {"title": {"text": "utilization %"}, "range": [0, 100]}
    return _gpu_figure(series, bands, "util", "%", "GPU utilization", yaxis)


def gpu_memory(series, bands):
    """GPU memory used (MiB) over time per GPU, up to the GPUs' total memory."""
    total = series.extra.get("mem_total_mib")
    top = max((v for g in series.groups.values() for v in g["mem_max"] if v is not None), default=0)
    yaxis = {"title": {"text": "MiB"}, "range": [0, max(total or 0, top, 1) * 1.05]}
    return _gpu_figure(series, bands, "mem", "MiB", "GPU memory used", yaxis, fmt=",.0f")


def gpu_clock(series, bands):
    """SM clock (MHz) over time per GPU: a clock that drops under load is power or heat."""
    yaxis = {"title": {"text": "MHz"}, "rangemode": "tozero"}
    return _gpu_figure(series, bands, "clock", "MHz", "SM clock", yaxis, fmt=",.0f")


def gpu_power(series, bands):
    """GPU power (W) over time per GPU, with the enforced power limit as a dashed line."""
    limit = series.extra.get("power_limit_w")
    shapes, annotations = [], []
    top = max(
        (v for g in series.groups.values() for v in g["power_max"] if v is not None), default=0
    )
    if limit:
        shape, annotation = _limit_line(limit, f"power limit {limit:.0f} W")
        shapes.append(shape)
        annotations.append(annotation)
        top = max(top, limit)
    yaxis = {"title": {"text": "W"}, "range": [0, (top or 1) * 1.1]}
    return _gpu_figure(series, bands, "power", "W", "GPU power", yaxis, shapes, annotations)


def engine_queue(series, bands, max_running_requests=None):
    """The engine's running and queued requests over time, with its max-running-requests cap."""
    traces = []
    group = series.groups.get(None)
    if group:
        for key, name in (("running", "running"), ("queued", "queued")):
            traces.append(
                {
                    "type": "scatter",
                    "mode": _mode(group[f"{key}_mean"]),
                    "name": name,
                    **_time_x(series, group),
                    "y": _rounded(
                        group[f"{key}_mean"], MEAN_DIGITS["engine"], highs=group[f"{key}_max"]
                    ),
                    "customdata": [_whole(v) for v in group[f"{key}_max"]],
                    "hovertemplate": "%{y:.0f} " + name + " (max %{customdata:.0f})<extra></extra>",
                }
            )
    shapes, annotations = [], []
    if max_running_requests and traces:
        shape, annotation = _limit_line(
            max_running_requests, f"max running requests {max_running_requests}"
        )
        shapes.append(shape)
        annotations.append(annotation)
    return figure(
        traces,
        "Engine: running and queued requests" + _bucket_note(series),
        {"type": "date", "title": {"text": "time (UTC)"}},
        {"title": {"text": "requests"}, "rangemode": "tozero"},
        **_time_layout(bands, shapes, annotations),
    )


def kv_cache_use(series, bands):
    """The engine's KV-cache use (% of its cache) over time."""
    traces = []
    group = series.groups.get(None)
    if group and any(v is not None for v in group["kv_mean"]):
        y = [None if v is None else 100.0 * v for v in group["kv_mean"]]
        traces.append(
            {
                "type": "scatter",
                "mode": _mode(y),
                "name": "KV cache",
                **_time_x(series, group),
                "y": _rounded(y, MEAN_DIGITS["engine"]),
                "hovertemplate": "%{y:.0f} % of the KV cache<extra></extra>",
            }
        )
    return figure(
        traces,
        "Engine: KV-cache use" + _bucket_note(series),
        {"type": "date", "title": {"text": "time (UTC)"}},
        {"title": {"text": "% of the KV cache"}, "range": [0, 100]},
        **_time_layout(bands),
    )


def peaks_per_run(runs):
    """Each run's peak output tok/s (its `peak` annotation) as a bar, oldest run first; the
    stand-in's bars grey and marked."""
    shown = sorted((run for run in runs if run.peak is not None), key=lambda r: (r.created, r.pk))
    traces = []
    if shown:
        traces.append(
            {
                "type": "bar",
                "name": "peak output tok/s",
                # one category per run, even where two runs share a label
                "x": [str(run.uuid) for run in shown],
                "y": [run.peak for run in shown],
                "customdata": [run_name(run) for run in shown],
                "text": [f"{run.peak:,.0f}" for run in shown],
                "textposition": "outside",
                "cliponaxis": False,
                "marker": {"color": ["#98a2b3" if run.is_standin else "#3056d3" for run in shown]},
                "hovertemplate": "%{customdata}<br>%{y:,.0f} tok/s<extra></extra>",
            }
        )
    xaxis = {
        "type": "category",
        "tickmode": "array",
        "tickvals": [str(run.uuid) for run in shown],
        "ticktext": [
            _short(run.display_label()) + (STANDIN_MARK if run.is_standin else "") for run in shown
        ],
        "automargin": True,
    }
    return figure(
        traces,
        "Peak output throughput per run",
        xaxis,
        {"title": {"text": "tok/s"}, "rangemode": "tozero"},
        margin={"l": 55, "r": 15, "t": 35, "b": 35},
        showlegend=False,
    )


def _short(label, limit=28):
    return label if len(label) <= limit else label[: limit - 1] + "…"


# --- compare -------------------------------------------------------------------------------


def _legend(style):
    """Legend fields of a compare trace: its group, titled when runs are grouped."""
    fields = {"legendgroup": style["group"]}
    if style["group_title"]:
        fields["legendgrouptitle"] = {"text": style["group_title"]}
    return fields


def compare_vs_load(runs, styles, key, metric, ytitle, fmt=",.0f", log_toggle=False):
    """One metric of each run's levels vs load, titled "<metric> vs <load>": the rate asked
    (a line per run and cap) when every run's levels sent at rates, else concurrency (a rate
    level then at its cap); styles[run.pk] gives name and color; log_toggle adds a linear/log
    switch of the y axis."""
    levels = {run.pk: list(run.levels.all()) for run in runs}
    axis = _common_axis(levels.values())
    traces = []
    for run in runs:
        style = styles[run.pk]
        lines = _load_lines(levels[run.pk], key, axis)
        for cap, _, points in lines:
            hover = "%{y:" + fmt + "}<extra>%{fullData.name}</extra>"
            traces.append(
                _load_line(
                    style["name"],
                    points,
                    cap,
                    len(lines),
                    hover,
                    **_legend(style),
                    line={"color": style["color"], "dash": style["dash"]},
                    marker={"color": style["color"]},
                )
            )
    title = f"{metric} vs {LOAD_WORDS[axis]}"
    fig = figure(traces, title, LOAD_AXES[axis], {"title": {"text": ytitle}, "rangemode": "tozero"})
    if log_toggle:
        fig["layout"].update(_log_toggle(title))
    return fig


def pareto_front(points):
    """The points (x, y) no other point beats in both x and y, by ascending x."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def pareto(runs, styles, num_gpus):
    """Output tok/s per GPU vs tok/s per user (1000 / median TPOT), one line per run.

    num_gpus[run.pk] is the GPU count the per-GPU figure divides by. The dashed line is the
    Pareto front over every point shown.
    """
    traces, everything = [], []
    for run in runs:
        gpus = num_gpus[run.pk]
        points = sorted(
            (level.concurrency or 0, level.interactivity, level.throughput_per_gpu(gpus))
            for level in run.levels.all()
            if level.interactivity is not None and level.output_throughput is not None
        )
        if not points:
            continue
        style = styles[run.pk]
        everything += [(x, y) for _, x, y in points]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers+text",
                "name": style["name"],
                **_legend(style),
                "x": [x for _, x, _ in points],
                "y": [y for _, _, y in points],
                "customdata": [f"c={c}" for c, _, _ in points],
                "textposition": "top center",
                "textfont": {"size": 9, "color": "#667085"},
                "line": {"color": style["color"], "dash": style["dash"]},
                "marker": {"color": style["color"]},
                "hovertemplate": "%{customdata}<br>%{x:.1f} tok/s per user<br>"
                "%{y:,.0f} tok/s per GPU<extra>%{fullData.name}</extra>",
            }
        )
    _place_labels(traces)
    front = pareto_front(everything)
    if len(front) > 1:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "Pareto front",
                "x": [x for x, _ in front],
                "y": [y for _, y in front],
                "line": {"color": "#101828", "dash": "dot", "width": 1},
                "hoverinfo": "skip",
            }
        )
    return figure(
        traces,
        "Throughput per GPU vs interactivity",
        {"title": {"text": "tok/s per user (1000 / median TPOT)"}, "rangemode": "tozero"},
        {"title": {"text": "output tok/s per GPU"}, "rangemode": "tozero"},
    )


def _place_labels(traces):
    """Each trace's "text": its point's label (customdata) where no label placed before lies
    within LABEL_GAP of it, else "" (the hover still names it); the first trace's first."""
    xs = [x for t in traces for x in t["x"]]
    ys = [y for t in traces for y in t["y"]]
    if not xs:
        return
    span_x = (max(xs) - min(xs)) or 1.0
    span_y = (max(ys) - min(ys)) or 1.0
    placed = []
    for trace in traces:
        trace["text"] = []
        for x, y, label in zip(trace["x"], trace["y"], trace["customdata"], strict=True):
            near = any(
                abs(x - px) / span_x < LABEL_GAP[0] and abs(y - py) / span_y < LABEL_GAP[1]
                for px, py in placed
            )
            trace["text"].append("" if near else label)
            if not near:
                placed.append((x, y))


def peak_bars(runs, styles):
    """Each run's peak output tok/s as a horizontal bar (runs without levels by concurrency
    count too: the write-up gives Kimi K2's 800 → 5,800 tok/s without one)."""
    shown = [run for run in runs if run.peak is not None]
    traces = []
    if shown:
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "peak output tok/s",
                "y": [styles[run.pk]["name"] for run in shown],
                "x": [run.peak for run in shown],
                "marker": {"color": [styles[run.pk]["color"] for run in shown]},
                "customdata": [styles[run.pk]["group"] for run in shown],
                "text": [f"{run.peak:,.0f}" for run in shown],
                "textposition": "outside",
                "cliponaxis": False,
                "hovertemplate": "%{y}<br>%{x:,.0f} tok/s<extra></extra>",
            }
        )
    return figure(
        traces,
        "Peak output throughput",
        {"title": {"text": "tok/s"}, "rangemode": "tozero"},
        {"automargin": True, "autorange": "reversed", "type": "category"},
        showlegend=False,
        height=110 + 34 * max(len(shown), 1),
        margin={"l": 20, "r": 60, "t": 40, "b": 45},
    )


# --- kernels -------------------------------------------------------------------------------


BATCH_AXIS = {"title": {"text": "batch size M"}, "type": "log", "dtick": 0.30103}


def kernel_timings(timings):
    """Per batch size M: the written config's, the engine's default and shipped configs' and the
    floor's time of one MoE layer (µs), log axes."""
    traces = []
    series = (
        ("tuned_us", "tuned", "#157f3b", "solid"),
        ("default_us", "default config", "#b54708", "solid"),
        ("shipped_us", "shipped config", "#6941c6", "solid"),
        ("grouped_mm_us", "torch _grouped_mm", "#7f7f7f", "dot"),
        ("floor_us", "hardware floor", "#101828", "dash"),
    )
    for key, name, color, dash in series:
        points = [(t.batch_size, getattr(t, key)) for t in timings if getattr(t, key) is not None]
        if points:
            traces.append(
                _line(
                    name,
                    points,
                    line={"color": color, "dash": dash},
                    marker={"color": color},
                    hovertemplate="M=%{x}<br>%{y:,.1f} µs<extra>" + name + "</extra>",
                )
            )
    return figure(
        traces,
        "One MoE layer: written config vs the engine's own vs floor",
        BATCH_AXIS,
        {"title": {"text": "µs"}, "type": "log"},
    )


def kernel_speedups(timings):
    """Per batch size M: how many times faster the written config runs than the engine's default
    config and its shipped file's entry, as the tune timed them (1× where it wrote the engine's
    own): the gains the µs chart's log axis squeezes into one line."""
    traces = []
    series = (
        ("speedup", "vs the engine's default", "#b54708"),
        ("shipped_speedup", "vs the engine's shipped file", "#6941c6"),
    )
    for attr, name, color in series:
        points = [(t.batch_size, getattr(t, attr)) for t in timings if getattr(t, attr)]
        if points:
            traces.append(
                _line(
                    name,
                    points,
                    line={"color": color},
                    marker={"color": color},
                    hovertemplate="M=%{x}<br>%{y:.3f}×<extra>" + name + "</extra>",
                )
            )
    even = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1}
    return figure(
        traces,
        "Written config's speed-up over the engine's own",
        BATCH_AXIS,
        {"title": {"text": "× (above 1: faster)"}, "tickformat": ".2f"},
        shapes=[{**even, "line": {"color": "#101828", "dash": "dot", "width": 1}}],
    )


# --- topology ------------------------------------------------------------------------------

_LINK_RANK = {"SYS": 0, "SOC": 0, "NODE": 1, "PHB": 2, "PXB": 3, "PIX": 4, "same board": 5}
_LINK_SCALE = [[0, "#fda29b"], [0.4, "#fedf89"], [0.8, "#a6f4c5"], [1, "#039855"]]
_P2P_SCALE = [[0, "#fda29b"], [1, "#a6f4c5"]]


def _link_value(cell):
    cell = str(cell).strip()
    if re.fullmatch(r"NV\d+", cell):
        return 6
    return _LINK_RANK.get(cell)


def _p2p_value(cell):
    cell = str(cell).strip()
    if cell in ("X", "unknown", "U", ""):
        return None
    return 1 if cell == "OK" else 0


def topology_heatmap(block, title, kind="links"):
    """A {labels, matrix} block of nvidia-smi codes as a heatmap, codes written in the cells.

    Links: NVLink best, then PIX, PXB, PHB, NODE, SYS worst. P2P: OK vs anything else.
    """
    if not block or not block.get("matrix"):
        return figure([], title, {}, {})
    value = _link_value if kind == "links" else _p2p_value
    labels, matrix = block["labels"], block["matrix"]
    columns = labels[: len(matrix[0])] if matrix else labels
    trace = {
        "type": "heatmap",
        "x": columns,
        "y": labels[: len(matrix)],
        "z": [[value(cell) for cell in row] for row in matrix],
        "text": [[str(cell) for cell in row] for row in matrix],
        "texttemplate": "%{text}",
        "hovertemplate": "%{y} ↔ %{x}: %{text}<extra></extra>",
        "colorscale": _LINK_SCALE if kind == "links" else _P2P_SCALE,
        "zmin": 0,
        "zmax": 6 if kind == "links" else 1,
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
    }
    size = 40 + 34 * len(labels)
    return figure(
        [trace],
        title,
        {"side": "top", "type": "category"},
        {"autorange": "reversed", "type": "category"},
        height=max(size, 220),
        margin={"l": 60, "r": 10, "t": 70, "b": 10},
    )


# --- findings ------------------------------------------------------------------------------


def evidence_figure(evidence, title):
    """The figure of a finding's evidence["chart"] (the diagnosis's format), or None.

    {"type": "line" | "bar", "x", "x_label", "y_label", "series": [{"name", "y"}]} or
    {"type": "heatmap", "x", "y", "z" (nvidia-smi codes), "title"}.
    """
    spec = evidence.get("chart") if isinstance(evidence, dict) else None
    if not isinstance(spec, dict) or not spec.get("x"):
        return None
    if spec.get("type") == "heatmap":
        kind = "p2p" if "p2p" in str(spec.get("title", "")).lower() else "links"
        block = {"labels": spec.get("y") or spec["x"], "matrix": spec.get("z") or []}
        return topology_heatmap(block, spec.get("title") or title, kind)
    x = spec["x"]
    x_label = spec.get("x_label", "")
    traces = []
    for series in spec.get("series") or []:
        y = series.get("y") or []
        trace = {"name": series.get("name", ""), "x": x, "y": y}
        if spec.get("type") == "bar":
            trace |= {"type": "bar"}
        else:
            trace |= {"type": "scatter", "mode": "lines+markers"}
        traces.append(trace)
    if not traces:
        return None
    xaxis = {"title": {"text": x_label}}
    numeric = all(is_number(v) for v in x)
    if "concurrency" in x_label and numeric and min(x) > 0:
        xaxis |= {"type": "log", "dtick": 0.30103}
    elif not numeric or spec.get("type") == "bar":
        xaxis |= {"type": "category"}
    yaxis = {"title": {"text": spec.get("y_label", "")}, "rangemode": "tozero"}
    if "%" in spec.get("y_label", ""):
        # a percentage reads against its whole: 14 % must not fill the chart
        yaxis["range"] = [0, 100]
    return figure(
        traces,
        title,
        xaxis,
        yaxis,
        height=280,
        margin={"l": 55, "r": 15, "t": 35, "b": 40},
        legend={"orientation": "h", "y": -0.35},
    )


def capacity_limit(levels, mode, metric, percentile, limit_ms, label):
    """One limit of a capacity search's SLO: the limited percentile (ms) of each level against
    its load (concurrency, or req/s in request_rate mode), with the band of its 95 % interval
    and the limit drawn across; `label` names the metric ("TPOT p99")."""
    stat = "median" if percentile == "p50" else percentile
    key = f"{stat}_{metric}_ms"
    x_of = (lambda lv: lv.concurrency) if mode == "concurrency" else (lambda lv: lv.request_rate)
    points = sorted(
        (x_of(lv), getattr(lv, key))
        for lv in levels
        if x_of(lv) is not None and getattr(lv, key) is not None
    )
    unit = "concurrent" if mode == "concurrency" else "req/s"
    traces = []
    if points:
        hover = "%{x} " + unit + "<br>%{y:,.1f} ms<extra>" + label + "</extra>"
        traces.append(_line(label, points, hovertemplate=hover))
        band = _band(label, levels, key, x_of)
        if band is not None:
            traces.append(band)
    shape, annotation = _limit_line(limit_ms, f"limit {limit_ms:g} ms")
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
            traces.append(_line(name, points, hovertemplate=hover))
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


# --- watches -------------------------------------------------------------------------------


def watch_timeline(watch_runs, name="peak output tok/s"):
    """A watch's figure (name: Watch.figure_name) over its finished runs, oldest first, with the
    band of each run (the 95 % interval of its rounds, a capacity's range), a marker where
    something on record changed since the run it was compared with, and one on each run that
    raised an alert. watch_runs: finished WatchRuns (prefetch `alerts`)."""
    shown = sorted(
        (w for w in watch_runs if w.figure is not None), key=lambda w: (w.fired_at, w.pk)
    )
    times = [w.fired_at.strftime("%Y-%m-%d %H:%M:%S") for w in shown]
    traces = []
    banded = [(t, w.interval) for t, w in zip(times, shown, strict=True) if w.interval]
    if banded:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "95 % interval",
                "x": [t for t, _ in banded] + [t for t, _ in reversed(banded)],
                "y": [i[1] for _, i in banded] + [i[0] for _, i in reversed(banded)],
                "fill": "toself",
                "opacity": 0.2,
                "line": {"width": 0},
                "hoverinfo": "skip",
            }
        )
    if shown:
        traces.append(
            {
                **_line(name, list(zip(times, [w.figure for w in shown], strict=True))),
                "customdata": [w.get_verdict_display() for w in shown],
                "hovertemplate": "%{x}<br>%{y:,.0f} tok/s<br>%{customdata}<extra></extra>",
            }
        )
    for name, picked, symbol, color in (
        ("something changed", [w for w in shown if w.changes], "diamond-open", "#7a5af8"),
        ("alert sent", [w for w in shown if w.alerts.all()], "triangle-down", "#d92d20"),
    ):
        if picked:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "x": [w.fired_at.strftime("%Y-%m-%d %H:%M:%S") for w in picked],
                    "y": [w.figure for w in picked],
                    "text": ["; ".join(w.changes) or w.get_verdict_display() for w in picked],
                    "marker": {"symbol": symbol, "size": 13, "color": color},
                    "hovertemplate": "%{text}<extra></extra>",
                }
            )
    return figure(
        traces,
        "Watched figure: peak output throughput",
        {"type": "date"},
        {"title": {"text": "tok/s"}, "rangemode": "tozero"},
    )
