"""A finding's evidence as a chart (deployment and run pages)."""

from domain.numbers import is_number
from moeops.front.charts.figures import figure
from moeops.front.charts.hosts import topology_heatmap


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
