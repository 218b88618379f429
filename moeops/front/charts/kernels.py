"""The kernel and tuning pages' charts: one MoE layer's time per batch size M, and the written
config's speed-up over the engine's own."""

from moeops.front.charts.figures import figure, line_trace

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
                line_trace(
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
                line_trace(
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
