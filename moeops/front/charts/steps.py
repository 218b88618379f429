"""The run page's "Inside the step" panels: a profiled level's step breakdown
(domain.step_breakdown) as plotly figures (plain dicts, as the other charts) and the tables
beside them. Times in µs (a step's classes, its wall time), ms for a step's start in the window.

Every figure is of the profiled pass, a pass of its own after the level's rounds, and its title
says so: its throughput is not the level's."""

from domain.step_breakdown import CLASSES, STEP_KINDS
from moeops.front.charts.figures import figure

# One colour per class, the same on every page, in CLASSES order.
CLASS_COLOURS = {
    "moe": "#1f77b4",
    "attention": "#ff7f0e",
    "communication": "#d62728",
    "gemm": "#2ca02c",
    "norm": "#9467bd",
    "sampling": "#8c564b",
    "memory": "#e377c2",
    "other": "#7f7f7f",
    "idle": "#d9d9d9",
}
KIND_COLOURS = {"decode": "#1f77b4", "prefill": "#ff7f0e", "mixed": "#2ca02c"}
PROFILED = " (profiled pass)"


def step_bars(breakdown, kind, concurrency):
    """One horizontal bar per rank that saw `kind` steps: the mean step's time (µs) stacked by
    class in CLASSES order, each class's share in its hover."""
    ranks = [(rank.rank, k) for rank in breakdown.ranks if (k := rank.kind(kind))]
    labels = [f"rank {r}" for r, _ in ranks]
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "name": name,
            "y": labels,
            "x": [round(k.time_us(name), 1) for _, k in ranks],
            "customdata": [round(k.share(name) * 100, 1) for _, k in ranks],
            "marker": {"color": CLASS_COLOURS[name]},
            "hovertemplate": f"{name}: %{{x:,.0f}} µs (%{{customdata}} %)<extra>%{{y}}</extra>",
        }
        for name in CLASSES
    ]
    return figure(
        traces,
        f"A {kind} step at concurrency {concurrency}, per rank{PROFILED}",
        {"title": {"text": "mean time per step (µs)"}},
        {"autorange": "reversed", "type": "category"},
        barmode="stack",
        height=max(220, 60 + 36 * len(labels)),
    )


def steps_over_time(breakdown, concurrency):
    """Each step of the window: its wall time (µs) by its start (ms into the window), one
    colour per kind of step, every rank's steps (the rank in the hover)."""
    traces = []
    for kind in STEP_KINDS:
        points = [(rank.rank, s) for rank in breakdown.ranks for s in rank.steps if s.kind == kind]
        if not points:
            continue
        traces.append(
            {
                "type": "scattergl" if len(points) > 2000 else "scatter",
                "mode": "markers",
                "name": kind,
                "x": [round(s.start_ms, 3) for _, s in points],
                "y": [round(s.wall_us, 1) for _, s in points],
                "text": [f"rank {r}" for r, _ in points],
                "marker": {"color": KIND_COLOURS[kind], "size": 5},
                "hovertemplate": "%{y:,.0f} µs at %{x:,.1f} ms<extra>%{text}</extra>",
            }
        )
    return figure(
        traces,
        f"Steps over the window at concurrency {concurrency}{PROFILED}",
        {"title": {"text": "step start (ms into the window)"}},
        {"title": {"text": "step wall time (µs)"}, "rangemode": "tozero"},
    )


def _kind_rows(breakdown):
    """[(rank, kind, steps, median µs, p10 µs, p90 µs)] of every rank and kind it saw."""
    return [
        (rank.rank, k.kind, k.steps, k.step_us_median, k.step_us_p10, k.step_us_p90)
        for rank in breakdown.ranks
        for k in rank.kinds
    ]


def _top_rows(breakdown, kind):
    """(rank, [(class, share, µs, [(name, µs)])]): the top names of each class of a `kind`
    step, of the lowest rank that saw one; classes without a name left out."""
    for rank in breakdown.ranks:
        k = rank.kind(kind)
        if k is not None:
            by_name = {c.name: c for c in k.classes}
            rows = [
                (name, by_name[name].share, by_name[name].time_us, by_name[name].top)
                for name in CLASSES
                if name in by_name and by_name[name].top
            ]
            return rank.rank, rows
    return None, []


def cost_sentence(cost):
    """ "the profiled pass ran at 820 tok/s, the level's rounds at 1,150: ×1.4", or None."""
    if not cost:
        return None
    profiled, unprofiled = cost.get("profiled_tok_s"), cost.get("unprofiled_tok_s")
    if profiled is None or unprofiled is None:
        return None
    ratio = cost.get("ratio")
    if ratio is None and profiled:
        ratio = unprofiled / profiled
    times = f": ×{ratio:.2g}" if ratio is not None else ""
    return (
        f"the profiled pass ran at {profiled:,.0f} tok/s, the level's rounds at "
        f"{unprofiled:,.0f}{times}"
    )


def profile_panel(profile):
    """What the run page shows of one profiled level: {"profile", "title", "figures": [(element
    id, figure)], "kinds": _kind_rows, "top_kind", "top_rank", "top": _top_rows, "cost": a
    sentence, "notes", "traces"}; a profile without a breakdown shows its reason only."""
    panel = {
        "profile": profile,
        "title": f"Inside the step at concurrency {profile.concurrency}"
        + (f", {profile.request_rate:g} req/s" if profile.request_rate is not None else ""),
        "cost": cost_sentence(profile.cost),
        "traces": profile.traces or [],
        "figures": [],
    }
    breakdown = profile.step_breakdown()
    if breakdown is None:
        return panel
    kinds = breakdown.kinds()
    top_kind = "decode" if "decode" in kinds else kinds[0]
    top_rank, top = _top_rows(breakdown, top_kind)
    panel.update(
        kinds=_kind_rows(breakdown),
        top_kind=top_kind,
        top_rank=top_rank,
        top=top,
        notes=breakdown.notes,
        device=breakdown.ranks[0].device,
        engine=" ".join(p for p in (breakdown.engine, breakdown.engine_version) if p),
        figures=[
            (f"step-{profile.pk}-{kind}", step_bars(breakdown, kind, profile.concurrency))
            for kind in kinds
        ]
        + [(f"step-{profile.pk}-time", steps_over_time(breakdown, profile.concurrency))],
    )
    return panel
