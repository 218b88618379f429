"""Compare runs side by side: the selection lives in the URL (?run=<uuid>&run=…&group=…)."""

import csv
import json
import uuid as uuidlib
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.db.models.fields.json import KeyTextTransform
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse

from domain.capacity import capacities_compared, capacity_range
from domain.intervals import FALSE_ALARM, compare_rounds, with_interval
from domain.step_breakdown import breakdown_changes
from moeops.fleet.models import GPU, Deployment, gpu_count
from moeops.front import capacity
from moeops.front.charts import workloads as workload_charts
from moeops.front.charts.compare import compare_vs_load, pareto, peak_bars
from moeops.front.charts.figures import PALETTE, run_name
from moeops.front.columns import LEVEL_COLUMNS, NO_GPUS, level_rows
from moeops.front.forms.runs import RunFilterForm
from moeops.front.page_levels import set_levels
from moeops.insights.rules.kernels import retune_title
from moeops.runs import snapshots
from moeops.runs.keys import kernel_state
from moeops.runs.models import (
    LEVEL_LOAD_FIELDS,
    LevelProfile,
    LevelResult,
    LevelRound,
    SweepRun,
    Workload,
    of_the_deployment,
    summarized,
    without_standin,
)
from moeops.runs.workloads import workload_distributions
from moeops.subqueries import column, counted

MAX_SELECTED = 50
CANDIDATES = 60
# The newest runs the presets look for a pair in (every pair's snapshots are compared).
PRESET_RUNS = 60
# Each preset: its name, the one factor its pair may differ in, and the grouping it opens with.
PRESETS = (
    ("Before / after kernel tuning", "kernel config", "kernel"),
    ("By model", "model", "model"),
    ("By topology (VM vs container)", "topology", "topology"),
)
GROUPS = (
    ("run", "each run"),
    ("model", "model"),
    ("deployment", "deployment"),
    ("topology", "topology (VM vs container)"),
    ("kernel", "kernel config (default vs tuned)"),
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def _selected_uuids(request):
    """The run uuids of ?run=a&run=b (or ?run=a,b), in order, invalid ones dropped."""
    seen = []
    for value in request.GET.getlist("run"):
        for part in value.split(","):
            try:
                parsed = uuidlib.UUID(part.strip())
            except ValueError:
                continue
            if parsed not in seen:
                seen.append(parsed)
    return seen[:MAX_SELECTED]


def _runs_qs():
    return SweepRun.objects.select_related(
        "deployment__model", "deployment__host", "topology_snapshot", "kernel_config"
    ).defer(*UNREAD)


def _page_runs_qs():
    """_runs_qs with the columns the page reads alone (PAGE_RUN_FIELDS): each column more is
    compiled into the query and read into every row."""
    return _runs_qs().only(*PAGE_RUN_FIELDS)


# JSON columns of the runs and of what is read with them that neither the page nor the CSV
# reads (a sweep's progress, the model's config.json, a kernel config's tuned entries): each
# would be decoded per row, and 20 runs and 60 candidates may read one model's config.json.
UNREAD = (
    "progress",
    "deployment__launch_args",
    "deployment__host__worker_status",
    "deployment__model__config_json",
    "deployment__model__quant_config_json",
    "kernel_config__entries",
    "kernel_config__down_entries",
    "kernel_config__compile_checked",
)

# The columns of the runs and what is read with them that the page reads: compare_cells (name,
# deployment, model, host, topology, engine, kernel config), the summaries (GPUs, peak,
# capacity), what changed (snapshots, parameters) and the candidates' status and date; the
# topology snapshot whole, as its virtualization_label reads it whole (as_snapshot).
PAGE_RUN_FIELDS = (
    "uuid",
    "label",
    "parameters",
    "status",
    "source",
    "snapshot",
    "capacity",
    "created",
    "deployment__name",
    "deployment__engine",
    "deployment__tp",
    "deployment__ep",
    "deployment__model__name",
    "deployment__host__name",
    "kernel_config__dtype",
    "kernel_config__version",
    "topology_snapshot",
)

# The level columns the page reads (its table, charts and what changed); the CSV reads them all.
PAGE_LEVEL_FIELDS = ("id", *LEVEL_LOAD_FIELDS, "p99_ttft_ms")


def _read_page_levels(runs):
    """Each run's levels as the page reads them, set as its prefetched levels (run.levels.all()),
    in concurrency order: PAGE_LEVEL_FIELDS and, of their intervals (a JSON object of every
    figure), the output tok/s's alone as .throughput_interval, JSON text (_noise reads the peak
    levels' alone), built from one values_list (moeops.front.page_levels)."""
    levels = LevelResult.objects.annotate(
        throughput_interval=KeyTextTransform("output_throughput", "intervals")
    ).order_by("concurrency", "id")
    return set_levels(runs, levels, (*PAGE_LEVEL_FIELDS, "throughput_interval"))


def _throughput_interval(level):
    """level.interval("output_throughput") of a level of _read_page_levels."""
    interval = level.throughput_interval and json.loads(level.throughput_interval)
    return tuple(interval) if interval else None


def _selected_runs(uuids, page=False):
    """The runs of `uuids` with their levels, .peak and .level_count counted from those levels
    (summarized), oldest first; for the page (page=True) of the runs and levels the columns it
    reads alone (PAGE_RUN_FIELDS, _read_page_levels), else whole."""
    runs = (_page_runs_qs() if page else _runs_qs()).filter(uuid__in=uuids)
    # counted in correlated subqueries, not a join and COUNT(DISTINCT), which would group every
    # selected column (PostgreSQL then estimates the query dear enough to JIT-compile it: 0.3 s
    # for 20 runs)
    deployment_gpus = Deployment.gpus.through
    runs = runs.annotate(
        gpu_count=counted(deployment_gpus, "deployment", column(SweepRun, "deployment")),
        host_gpu_count=counted(GPU, "host", column(Deployment, "host")),
    )
    if page:
        runs = _read_page_levels(list(runs))
    else:
        levels = LevelResult.objects.order_by("concurrency", "id")
        runs = runs.prefetch_related(Prefetch("levels", levels))
    runs = {run.uuid: run for run in summarized(runs)}
    # the older run is the baseline whatever order the runs were ticked in
    return sorted((runs[u] for u in uuids if u in runs), key=lambda run: (run.created, run.id))


def _peak_rounds(runs):
    """{peak level id: its rounds' output tok/s, in order} of each run's peak level (what
    _noise weighs); one query that reads that one figure of each round, not the whole
    figures. A level without stored rounds is its own one round (LevelResult.stored_rounds)."""
    peaks = [level for run in runs if (level := run.peak_level()) is not None]
    rounds = {level.pk: [] for level in peaks}
    if peaks:
        for level_id, value in (
            LevelRound.objects.filter(level__in=peaks)
            .order_by("level_id", "round")
            .values_list("level_id", "figures__output_throughput")
        ):
            rounds[level_id].append(value)
    return {level.pk: rounds[level.pk] or [level.output_throughput] for level in peaks}


def _with_standin(request):
    """Whether stand-in runs are compared: only when asked (?standin=1), as their numbers come
    from a test double."""
    return request.GET.get("standin") == "1"


def _compared_runs(request, page=False):
    """(runs compared, stand-in runs of the selection left out): oldest first, the run marked
    ?before= (a preset's baseline) first of all; the first is the baseline. page: read as the
    page reads them (_selected_runs), not whole."""
    selected = _selected_runs(_selected_uuids(request), page)
    before = request.GET.get("before", "")
    selected.sort(key=lambda run: str(run.uuid) != before)
    if _with_standin(request):
        return selected, []
    return [r for r in selected if not r.is_standin], [r for r in selected if r.is_standin]


def _group_of(run, group):
    if group == "model":
        return run.model_name()
    if group == "deployment":
        return run.deployment.name
    if group == "topology":
        snapshot = run.topology_snapshot
        return snapshot.virtualization_label if snapshot else "topology unknown"
    if group == "kernel":
        state = run.kernel_config_state()
        return "tuned kernel config" if state == "tuned" else "default kernel config"
    return str(run.uuid)


def _styles(runs, group):
    """Per run: legend name, group (titled in the legend), a color shared by the group, and
    dashes that tell the runs of one group apart."""
    colors, counts, styles = {}, {}, {}
    for run in runs:
        key = _group_of(run, group)
        colors.setdefault(key, PALETTE[len(colors) % len(PALETTE)])
        n = counts[key] = counts.get(key, -1) + 1
        styles[run.pk] = {
            "name": f"{run.model_name()} · {run_name(run)}",
            "group": key,
            "group_title": key if group != "run" else None,
            "color": colors[key],
            "dash": DASHES[n % len(DASHES)] if group != "run" else "solid",
        }
    return styles


def _gpus(run):
    """The run's GPUs: an imported file's as it states them (None where it does not), else
    its deployment's (num_gpus), as SweepRun.measured_gpu_count without its queries."""
    deployment = run.deployment
    if run.source == "import":
        return run.stated_gpu_count
    return gpu_count(run.gpu_count, run.host_gpu_count, deployment.tp, deployment.ep)


def _compare_url(uuids, group, standin=False):
    """The compare page of `uuids`, the first marked the baseline (?before=)."""
    query = [("run", str(u)) for u in uuids] + [("group", group), ("before", str(uuids[0]))]
    if standin:
        query.append(("standin", "1"))
    return f"{reverse('compare')}?{urlencode(query)}"


def _varied(older, newer):
    """What the two rows' snapshots differ in, less the factors of how they were taken; nothing
    where one has none (snapshot_diff then finds no changes), without the diff: the presets walk
    up to 1770 pairs."""
    if not older["snapshot"] or not newer["snapshot"]:
        return []
    diff = snapshots.snapshot_diff(older["snapshot"], newer["snapshot"])
    return [f for f in snapshots.differing_factors(diff) if f not in snapshots.INCIDENTAL_FACTORS]


def _pair_for(rows, factor, varied=None):
    """The newest pair of rows (older first) whose snapshots differ in `factor` alone, or None.

    Before/after kernel tuning takes a pair of one deployment whose kernel states differ,
    default first, and whose snapshots differ in nothing else (also where they record no
    kernel config: runs before snapshots, imports marked moe_kernel). varied: {(i, j): _varied
    of rows i and j} kept between the presets, which walk the same pairs.
    """
    varied = {} if varied is None else varied
    for i, newer in enumerate(rows):
        for j in range(i + 1, len(rows)):
            older = rows[j]
            if (i, j) not in varied:
                varied[i, j] = _varied(older, newer)
            if factor != "kernel config":
                if varied[i, j] == [factor]:
                    return [older["uuid"], newer["uuid"]]
                continue
            states = {older["kernel"], newer["kernel"]}
            same = older["deployment_id"] == newer["deployment_id"]
            if same and states == {"default", "tuned"} and set(varied[i, j]) <= {factor}:
                pair = sorted((older, newer), key=lambda row: row["kernel"] != "default")
                return [row["uuid"] for row in pair]
    return None


def _presets():
    """The standing comparisons: (name, URL of its pair or None, why there is none).

    Each pair differs in its preset's factor alone, as the runs' snapshots recorded them; runs
    of the stand-in, and imported files of another model than their deployment's, are left out."""
    runs = SweepRun.objects.filter(status="succeeded", levels__output_throughput__isnull=False)
    rows = list(
        of_the_deployment(without_standin(runs))
        .values("uuid", "deployment_id", "kernel_config_id", "parameters__moe_kernel", "snapshot")
        .distinct()
        .order_by("-created", "-id")[:PRESET_RUNS]
    )
    for row in rows:
        row["kernel"] = kernel_state(
            (row["snapshot"] or {}).get("kernel_config"),
            row["kernel_config_id"],
            row["parameters__moe_kernel"],
        )
    presets, varied = [], {}
    for name, factor, group in PRESETS:
        pair = _pair_for(rows, factor, varied)
        missing = "" if pair else f"No two runs differ in the {factor} alone."
        presets.append((name, pair and _compare_url(pair, group), missing))
    return presets


def _summary(run):
    levels = list(run.levels.all())
    per_user = [level.interactivity for level in levels if level.interactivity is not None]
    gpus = _gpus(run)
    per_gpu = run.peak / gpus if run.peak is not None and gpus else None
    return {
        "run": run,
        "peak": run.peak,
        "peak_per_gpu": NO_GPUS if gpus is None and run.peak is not None else per_gpu,
        "best_per_user": max(per_user, default=None),
        "kernel": run.kernel_config_state(),
        "gpus": gpus,
        "capacity": capacity.headline(run.capacity),
        "capacity_range": capacity_range(run.capacity),
    }


def _headline(baseline, run):
    """ "7.25× peak output throughput" of run against the baseline, or None without peaks."""
    if not baseline.peak or run.peak is None:
        return None
    return f"{run.peak / baseline.peak:.3g}× peak output throughput"


def _noise(baseline, run, rounds):
    """Whether the two runs' peak output throughputs differ beyond their rounds' noise, in a
    sentence (domain.intervals.compare_rounds: the change with its interval, or why the rounds
    cannot tell); None without peaks. rounds: _peak_rounds of the runs."""
    before, after = baseline.peak_level(), run.peak_level()
    if before is None or after is None:
        return None
    figures = (
        f"peak {with_interval(after.output_throughput, _throughput_interval(after))} "
        f"against {with_interval(before.output_throughput, _throughput_interval(before))}"
        " tok/s"
    )
    judged = compare_rounds(rounds[after.pk], rounds[before.pk])
    if judged.verdict == "unknown":
        return f"{judged.why} ({figures})"
    test = (
        f"a permutation test of the rounds at {FALSE_ALARM * 100:.0f} % false alarms, "
        f"p = {judged.p_value:.2f}"
    )
    where = "within noise" if judged.verdict == "within" else "beyond the noise"
    return f"{where}: {judged.change()} ({figures}; {test})"


def _latency(baseline, run):
    """ "p50 TPOT at concurrency 64: 40.1 → 55.3 ms": latency compared at the baseline's peak
    concurrency (unlimited rate), which both runs swept; None where the other did not."""
    before = baseline.peak_level()
    if before is None:
        return None
    same = [
        level
        for level in run.levels.all()
        if level.concurrency == before.concurrency and level.request_rate is None
    ]
    if before.request_rate is not None or not same or same[0].median_tpot_ms is None:
        return None
    if before.median_tpot_ms is None:
        return None
    return (
        f"p50 TPOT at concurrency {before.concurrency}: {before.median_tpot_ms:,.1f} → "
        f"{same[0].median_tpot_ms:,.1f} ms"
    )


def _what_changed(runs):
    """Each run after the first against the first (the baseline), from their snapshots:
    [{"run", "factors": [what differs], "incidental": [factors of how it was taken],
    "headline": the peak ratio, "noise": whether it is beyond the noise, "sections": [(section
    title, [(key, a, b)])] in snapshots.SECTIONS order, "unknown": [what one of them did not
    record]}]; [] for fewer than two runs."""
    if len(runs) < 2:
        return []
    baseline, out = runs[0], []
    steps = _step_changes(runs)
    rounds = _peak_rounds(runs)
    for run in runs[1:]:
        diff = snapshots.snapshot_diff(baseline.snapshot, run.snapshot)
        factors = snapshots.differing_factors(diff)
        by_section = {}
        for change in diff["changes"]:
            by_section.setdefault(change["section"], []).append(
                (
                    change["key"],
                    snapshots.show_value(change["a"]),
                    snapshots.show_value(change["b"]),
                )
            )
        sections = [
            (title, by_section[key]) for key, title in snapshots.SECTIONS if key in by_section
        ]
        out.append(
            {
                "run": run,
                "factors": [f for f in factors if f not in snapshots.INCIDENTAL_FACTORS],
                "incidental": [f for f in factors if f in snapshots.INCIDENTAL_FACTORS],
                "headline": _headline(baseline, run),
                "noise": _noise(baseline, run, rounds),
                "latency": _latency(baseline, run),
                "capacity": capacities_compared(baseline.capacity, run.capacity),
                "sections": sections,
                "unknown": diff["unknown"],
                "engine_moved": _engine_moved(baseline, run),
                "steps": steps.get(run.pk, []),
            }
        )
    return out


def _step_changes(runs):
    """{run id: [(concurrency, [(class, share in the first run, share in this one, change in
    points)])]} of the levels each run after the first profiled as the first did, a decode
    step's classes side by side (domain.step_breakdown.breakdown_changes); one query."""
    profiles = {}
    captured = LevelProfile.objects.filter(run__in=runs, status="captured")
    # the columns shown() and the breakdowns read, not the traces, window or cost
    captured = captured.only("run_id", "key", "concurrency", "request_rate", "created", "breakdown")
    for profile in captured.shown():
        profiles.setdefault(profile.run_id, {})[profile.key] = profile
    baseline = profiles.get(runs[0].pk, {})
    out = {}
    for run in runs[1:]:
        for key, profile in profiles.get(run.pk, {}).items():
            if key not in baseline:
                continue
            rows = breakdown_changes(baseline[key].step_breakdown(), profile.step_breakdown())
            if rows:
                out.setdefault(run.pk, []).append((profile.concurrency, rows))
    return out


def _engine_moved(baseline, run):
    """snapshots.engine_moved of the pair with the plan item it raises ("retune"), or None."""
    moved = snapshots.engine_moved(baseline.snapshot, run.snapshot)
    if moved is None:
        return None
    return {**moved, "retune": retune_title(moved["engine"], moved["to"])}


def _workload_charts(runs):
    """[(element id, figure)]: where the runs sent two or more workloads, each measure's
    histograms of those workloads overlaid (one figure per unit where their units differ: a
    file's lengths in characters and another's in tokens do not share an axis); else []."""
    ids = []
    for run in runs:
        named = (run.parameters or {}).get("workload")
        if isinstance(named, dict) and named.get("id") not in ids:
            ids.append(named.get("id"))
    workloads = Workload.objects.in_bulk([i for i in ids if isinstance(i, int)])
    if len(workloads) < 2:
        return []
    by_measure = {}
    for pk in ids:
        if pk not in workloads:
            continue
        distributions = workload_distributions(workloads[pk])
        for key, _ in workload_charts.MEASURES:
            if distributions[key]:
                histogram, unit = distributions[key]
                by_measure.setdefault((key, unit), []).append((str(workloads[pk]), histogram))
    return [
        (f"cmp-workload-{key}-{unit}", workload_charts.length_figure(title, unit, named))
        for key, title in workload_charts.MEASURES
        for (measure, unit), named in by_measure.items()
        if measure == key
    ]


@login_required
def compare(request):
    form = RunFilterForm(request.GET)
    uuids = _selected_uuids(request)
    group = request.GET.get("group", "run")
    if group not in dict(GROUPS):
        group = "run"
    with_standin = _with_standin(request)
    selected, left_out = _compared_runs(request, page=True)
    styles = _styles(selected, group)
    gpus = {run.pk: _gpus(run) for run in selected}
    candidates = form.filter(_page_runs_qs().with_peak()).exclude(uuid__in=uuids)
    if not with_standin:
        candidates = without_standin(candidates)
    query = request.GET.copy()
    query["standin"] = "0" if with_standin else "1"
    ctx = {
        "nav": "compare",
        "form": form,
        "group": group,
        "groups": GROUPS,
        "selected": [_summary(run) for run in selected],
        "what_changed": _what_changed(selected),
        "left_out": left_out,
        "with_standin": with_standin,
        "standin_toggle": f"{reverse('compare')}?{query.urlencode()}",
        "candidates": candidates.order_by("-created", "-id")[:CANDIDATES],
        "presets": _presets(),
        "csv_query": request.GET.urlencode(),
        # per-GPU figures divide by GPUs; a host with none recorded has none to divide by
        "no_gpus": [run for run in selected if gpus[run.pk] is None],
    }
    per_gpu = [run for run in selected if gpus[run.pk] is not None]
    figures = {
        "cmp-peaks": peak_bars(selected, styles),
        "cmp-throughput": compare_vs_load(
            selected, styles, "output_throughput", "Output throughput", "tok/s"
        ),
        "cmp-pareto": pareto(per_gpu, styles, gpus),
        "cmp-tpot": compare_vs_load(selected, styles, "median_tpot_ms", "p50 TPOT", "ms", ",.1f"),
        "cmp-ttft": compare_vs_load(
            selected, styles, "p99_ttft_ms", "p99 TTFT", "ms", ",.0f", True
        ),
    }
    ctx["workload_charts"] = _workload_charts(selected)
    ctx["peaks"] = figures.pop("cmp-peaks")
    ctx["charts"] = [(key, fig) for key, fig in figures.items() if fig["data"]]
    ctx["missing_charts"] = [
        fig["layout"]["title"]["text"] for fig in figures.values() if not fig["data"]
    ]
    return render(request, "front/compare.html", ctx)


@login_required
def compare_csv(request):
    """Every level of the selected runs, one row each, with the run's facets in front."""
    selected, _ = _compared_runs(request)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="moeops-compare.csv"'
    writer = csv.writer(response)
    facets = ["run_uuid", "run", "stand_in", "deployment", "model", "host", "virtualization"]
    facets += ["engine", "kernel_config", "created"]
    writer.writerow(facets + [c.csv_header for c in LEVEL_COLUMNS])
    for run in selected:
        snapshot = run.topology_snapshot
        front = [
            run.uuid,
            run.display_label(),
            "yes" if run.is_standin else "no",
            run.deployment.name,
            run.model_name(),
            run.deployment.host.name,
            snapshot.virtualization_label if snapshot else "",
            run.deployment.get_engine_display(),
            str(run.kernel_config) if run.kernel_config else run.kernel_config_state(),
            run.created.isoformat(),
        ]
        for _, values in level_rows(run.levels.all(), _gpus(run)):
            writer.writerow(front + ["" if v is None else v for v in values])
    return response
