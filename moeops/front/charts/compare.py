"""The compare page's charts: each run's metric against load, throughput per GPU against
interactivity with its Pareto front, and the runs' peaks."""

from moeops.front.charts.figures import figure, log_axis_toggle
from moeops.front.charts.load import LOAD_AXES, LOAD_WORDS, common_axis, load_line, load_lines

# Pareto labels closer than this to one already placed (fraction of each axis's span, about
# a "c=128" label's size on a half-width chart) are left to the hover.
LABEL_GAP = (0.08, 0.06)


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
    axis = common_axis(levels.values())
    traces = []
    for run in runs:
        style = styles[run.pk]
        lines = load_lines(levels[run.pk], key, axis)
        for cap, _, points in lines:
            hover = "%{y:" + fmt + "}<extra>%{fullData.name}</extra>"
            traces.append(
                load_line(
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
        fig["layout"].update(log_axis_toggle(title))
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
    gap_x, gap_y = LABEL_GAP
    for trace in traces:
        trace["text"] = []
        for x, y, label in zip(trace["x"], trace["y"], trace["customdata"], strict=True):
            near = False
            # a loop, not any() over a generator: 20 runs' points against those placed
            for px, py in placed:
                if abs(x - px) / span_x < gap_x and abs(y - py) / span_y < gap_y:
                    near = True
                    break
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
