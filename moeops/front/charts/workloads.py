"""A workload's length distributions as plotly figures (plain dicts, as the other charts):
the workload page's prompt, turn and output histograms, and compare's overlay of two workloads.
Each histogram is domain.workloads.length_histogram's; the bars show each bin's share (%) so that
workloads of different sizes compare."""

from moeops.front.charts.figures import PALETTE, figure

# Below this many lengths from the shortest to the longest, every whole length gets its tick.
SMALL_SPAN = 12
MEASURES = (
    ("prompt", "Prompt lengths"),
    ("turns", "Turns per conversation"),
    ("output", "Output lengths"),
)


def _bars(name, histogram, color, opacity=1.0):
    edges, counts = histogram["edges"], histogram["counts"]
    total = sum(counts) or 1
    lows, highs = edges[:-1], [e - 1 for e in edges[1:]]
    return {
        "type": "bar",
        "name": name,
        # a bar centred on the lengths it holds: length L spans L − ½ to L + ½
        "x": [(low + high) / 2 for low, high in zip(lows, highs, strict=True)],
        "width": [high + 1 - low for low, high in zip(lows, highs, strict=True)],
        "y": [round(100 * c / total, 2) for c in counts],
        "customdata": [
            [low if low == high else f"{low}–{high}", c]
            for low, high, c in zip(lows, highs, counts, strict=True)
        ],
        "hovertemplate": f"{name}<br>%{{customdata[0]}}: %{{customdata[1]}} (%{{y}} %)"
        "<extra></extra>",
        "marker": {"color": color},
        "opacity": opacity,
    }


def length_figure(title, unit, named_histograms):
    """One histogram figure: a trace per (name, histogram) overlaid, x the length in `unit`
    ("tokens", "characters", "turns"), y the share of the bin (%)."""
    overlaid = len(named_histograms) > 1
    traces = [
        _bars(name, histogram, PALETTE[i % len(PALETTE)], 0.55 if overlaid else 1.0)
        for i, (name, histogram) in enumerate(named_histograms)
    ]
    low = min(h["edges"][0] for _, h in named_histograms)
    high = max(h["edges"][-1] for _, h in named_histograms) - 1
    xaxis = {"title": {"text": unit}, "range": [low - 1, high + 1]}
    if high - low < SMALL_SPAN:
        # a few lengths: a tick on each whole length, none between
        xaxis["dtick"] = 1
    return figure(
        traces,
        f"{title} ({unit})",
        xaxis,
        {"title": {"text": "share (%)"}, "rangemode": "tozero"},
        barmode="overlay",
        bargap=0.05,
        showlegend=overlaid,
    )
