"""The deployment page's charts of its runs: throughput against load, and each run's peak."""

from moeops.front.charts.figures import STANDIN_MARK, figure, run_name
from moeops.front.charts.load import LOAD_AXES, LOAD_WORDS, common_axis, load_line, load_lines


def throughput_vs_load(runs):
    """Output tok/s vs load, one line per run (and cap): the rate asked when every run's levels
    sent at rates, else concurrency (levels without a concurrency are left out)."""
    runs = list(runs)
    levels = {run.pk: list(run.levels.all()) for run in runs}
    axis = common_axis(levels.values())
    traces = []
    for run in runs:
        lines = load_lines(levels[run.pk], "output_throughput", axis)
        for cap, _, points in lines:
            hover = "%{y:.0f} tok/s<extra>%{fullData.name}</extra>"
            traces.append(load_line(run_name(run), points, cap, len(lines), hover))
    return figure(
        traces,
        f"Output throughput vs {LOAD_WORDS[axis]}",
        LOAD_AXES[axis],
        {"title": {"text": "output tok/s"}, "rangemode": "tozero"},
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
