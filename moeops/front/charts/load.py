"""Charts against load: the axis a run's levels are plotted on (concurrency, or the request
rate asked), their lines (one per cap on the rate axis) and the bands of their 95 % intervals."""

from moeops.front.charts.figures import interval_band, line_trace

CONCURRENCY_AXIS = {"title": {"text": "concurrency"}, "type": "log", "dtick": 0.30103}
RATE_AXIS = {"title": {"text": "request rate asked (req/s)"}, "type": "log"}
LOAD_AXES = {"concurrency": CONCURRENCY_AXIS, "request_rate": RATE_AXIS}
LOAD_WORDS = {"concurrency": "concurrency", "request_rate": "request rate"}


def _level_points(levels, key):
    return sorted(
        (level.concurrency, getattr(level, key))
        for level in levels
        if level.concurrency is not None and getattr(level, key) is not None
    )


def level_concurrency(level):
    return level.concurrency


def level_rate(level):
    return level.request_rate


def load_axis(levels):
    """What a chart vs load plots the levels against: "request_rate" when every level sent at
    a rate (a rate sweep, a request-rate capacity search: at one cap its levels differ in
    rate alone), else "concurrency"."""
    placed = [level for level in levels if level.concurrency is not None]
    rated = placed and all(level.request_rate is not None for level in placed)
    return "request_rate" if rated else "concurrency"


def common_axis(level_lists):
    """The load axis of a chart of several runs: the rate when each run's is, else concurrency."""
    axes = {load_axis(levels) for levels in level_lists}
    return "request_rate" if axes == {"request_rate"} else "concurrency"


def load_lines(levels, key, axis):
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


def load_line(name, points, cap, caps, unit_hover, **extra):
    """One line of load_lines: named for its cap when the chart has several; the hover says
    the level's load (its concurrency, or the rate asked and achieved) and unit_hover."""
    if cap is None:
        return line_trace(name, points, hovertemplate="c=%{x}<br>" + unit_hover, **extra)
    named = f"{name} (cap {cap})" if caps > 1 else name
    hover = "%{x:g} req/s asked, %{customdata:.3g} achieved<br>" + unit_hover
    line = line_trace(named, [(x, y) for x, y, _ in points], hovertemplate=hover, **extra)
    line["customdata"] = [achieved for _, _, achieved in points]
    return line


def band_trace(name, levels, key, x_of=level_concurrency):
    """The 95 % interval over the rounds of `key` as a filled band around its line
    (interval_band), or None without intervals; x_of: a level's x (its concurrency)."""
    ends = sorted(
        (x_of(level), *level.interval(key))
        for level in levels
        if x_of(level) is not None and level.interval(key) is not None
    )
    if not ends:
        return None
    return interval_band(f"{name} 95 % interval", ends)


def add_band(traces, name, levels, key, x_of=level_concurrency):
    band = band_trace(name, levels, key, x_of)
    if band is not None:
        traces.append(band)
