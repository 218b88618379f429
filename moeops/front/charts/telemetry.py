"""A run's samples over time (run and tuning pages): each GPU's utilization, memory, clock and
power, the engine's queue and KV-cache use, the levels as shaded bands behind them."""

import datetime as dt

from moeops.front.charts.figures import epoch_to_plotly, figure, limit_line, marker_mode


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
                "mode": marker_mode(group[key]),
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
        shape, annotation = limit_line(limit, f"power limit {limit:.0f} W")
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
                    "mode": marker_mode(group[f"{key}_mean"]),
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
        shape, annotation = limit_line(
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
                "mode": marker_mode(y),
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
