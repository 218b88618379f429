"""What every chart shares: the layout, the palette, a figure, a line, a limit drawn across,
the linear/log switch, and how a stand-in run is named."""

import datetime as dt

from django.core.serializers.json import DjangoJSONEncoder

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
# Above this many points a line reads better without a marker on every point.
MARKER_LIMIT = 60


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


def marker_mode(points):
    return "lines" if len(points) > MARKER_LIMIT else "lines+markers"


def epoch_to_plotly(ts):
    """UTC epoch s → the date string plotly's date axis reads ("2026-11-29 15:01:42.123")."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def line_trace(name, points, **extra):
    return {
        "type": "scatter",
        "mode": marker_mode(points),
        "name": name,
        "x": [x for x, _ in points],
        "y": [y for _, y in points],
        **extra,
    }


def interval_band(name, ends):
    """A filled band of 95 % intervals, ends [(x, low, high)] in x order, as one trace: the upper
    ends left to right, then the lower ends back."""
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": [x for x, _, _ in ends] + [x for x, _, _ in reversed(ends)],
        "y": [high for _, _, high in ends] + [low for _, low, _ in reversed(ends)],
        "fill": "toself",
        "opacity": 0.2,
        "line": {"width": 0},
        "hoverinfo": "skip",
    }


def limit_line(value, label):
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


def log_axis_toggle(title):
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
