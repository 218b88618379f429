"""A watch's figure over its runs (watch and deployment pages)."""

from moeops.front.charts.figures import figure, interval_band, line_trace


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
    banded = [
        (t, w.interval[0], w.interval[1]) for t, w in zip(times, shown, strict=True) if w.interval
    ]
    if banded:
        traces.append(interval_band("95 % interval", banded))
    if shown:
        traces.append(
            {
                **line_trace(name, list(zip(times, [w.figure for w in shown], strict=True))),
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
