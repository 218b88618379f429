"""Plotly figures as plain dicts (data + layout), rendered in the page by plotly.js."""

LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "legend": {"orientation": "h", "y": -0.25},
    "hovermode": "closest",
    "template": None,
}


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


def throughput_vs_concurrency(runs):
    """Output tok/s vs concurrency, one line per run (levels without a concurrency are left out)."""
    traces = []
    for run in runs:
        points = sorted(
            (level.concurrency, level.output_throughput)
            for level in run.levels.all()
            if level.concurrency is not None and level.output_throughput is not None
        )
        if not points:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": run.display_label(),
                "x": [c for c, _ in points],
                "y": [t for _, t in points],
                "hovertemplate": "concurrency %{x}<br>%{y:.0f} tok/s"
                "<extra>%{fullData.name}</extra>",
            }
        )
    return figure(
        traces,
        "Output throughput vs concurrency",
        {"title": {"text": "concurrency"}, "type": "log", "dtick": 0.30103},
        {"title": {"text": "output tok/s"}, "rangemode": "tozero"},
    )
