"""Compare runs side by side: the selection lives in the URL (?run=<uuid>&run=…&group=…)."""

import csv
import uuid as uuidlib
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max, Prefetch
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse

from moeops.front import charts
from moeops.front.columns import LEVEL_COLUMNS, level_rows
from moeops.front.forms import RunFilterForm
from moeops.runs import snapshots
from moeops.runs.models import LevelResult, SweepRun, kernel_state

MAX_SELECTED = 50
CANDIDATES = 60
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
    ).annotate(peak=Max("levels__output_throughput"))


def _selected_runs(uuids):
    runs = {
        run.uuid: run
        for run in _runs_qs()
        .filter(uuid__in=uuids)
        .annotate(gpu_count=Count("deployment__gpus", distinct=True))
        .prefetch_related(Prefetch("levels", LevelResult.objects.order_by("concurrency", "id")))
    }
    return [runs[u] for u in uuids if u in runs]


def _group_of(run, group):
    if group == "model":
        return run.deployment.model.name
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
        colors.setdefault(key, charts.PALETTE[len(colors) % len(charts.PALETTE)])
        n = counts[key] = counts.get(key, -1) + 1
        styles[run.pk] = {
            "name": f"{run.deployment.model.name} · {run.display_label()}",
            "group": key,
            "group_title": key if group != "run" else None,
            "color": colors[key],
            "dash": DASHES[n % len(DASHES)] if group != "run" else "solid",
        }
    return styles


def _gpus(run):
    return run.gpu_count or max(run.deployment.tp, run.deployment.ep)


def _compare_url(uuids, group):
    query = [("run", str(u)) for u in uuids] + [("group", group)]
    return f"{reverse('compare')}?{urlencode(query)}"


def _presets():
    """The three standing comparisons, each as the URL of its selection (None: no such runs)."""
    rows = list(
        SweepRun.objects.filter(status="succeeded", levels__output_throughput__isnull=False)
        .values(
            "uuid",
            "deployment_id",
            "deployment__model__name",
            "topology_snapshot__virtualization",
            "kernel_config_id",
            "parameters__moe_kernel",
            "snapshot__kernel_config",
        )
        .distinct()
        .order_by("-created", "-id")[:500]
    )
    before_after = None
    by_deployment = {}
    for row in rows:
        state = kernel_state(
            row["snapshot__kernel_config"], row["kernel_config_id"], row["parameters__moe_kernel"]
        )
        by_deployment.setdefault(row["deployment_id"], {}).setdefault(state, row["uuid"])
    for states in by_deployment.values():
        if len(states) == 2:
            before_after = [states["default"], states["tuned"]]
            break

    def latest_per(key):
        picked = {}
        for row in rows:
            if row[key] is not None:
                picked.setdefault(row[key], row["uuid"])
        return list(picked.values()) if len(picked) > 1 else None

    by_model = latest_per("deployment__model__name")
    by_topology = latest_per("topology_snapshot__virtualization")
    return [
        ("Before / after kernel tuning", before_after and _compare_url(before_after, "kernel")),
        ("By model", by_model and _compare_url(by_model, "model")),
        ("By topology (VM vs container)", by_topology and _compare_url(by_topology, "topology")),
    ]


def _summary(run):
    levels = list(run.levels.all())
    per_user = [level.interactivity for level in levels if level.interactivity is not None]
    gpus = _gpus(run)
    return {
        "run": run,
        "levels": [level.concurrency for level in levels],
        "peak": run.peak,
        "peak_per_gpu": run.peak / gpus if run.peak is not None and gpus else None,
        "best_per_user": max(per_user, default=None),
        "kernel": run.kernel_config_state(),
        "gpus": gpus,
    }


def _what_changed(runs):
    """Each run after the first against the first (the baseline), from their snapshots:
    [{"run", "sections": [(section title, [(key, a, b)])] in snapshots.SECTIONS order,
    "unknown": [what one of them did not record]}]; [] for fewer than two runs."""
    if len(runs) < 2:
        return []
    baseline, out = runs[0], []
    for run in runs[1:]:
        diff = snapshots.snapshot_diff(baseline.snapshot, run.snapshot)
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
        out.append({"run": run, "sections": sections, "unknown": diff["unknown"]})
    return out


@login_required
def compare(request):
    form = RunFilterForm(request.GET)
    uuids = _selected_uuids(request)
    group = request.GET.get("group", "run")
    if group not in dict(GROUPS):
        group = "run"
    selected = _selected_runs(uuids)
    styles = _styles(selected, group)
    gpus = {run.pk: _gpus(run) for run in selected}
    candidates = (
        form.filter(_runs_qs()).exclude(uuid__in=uuids).order_by("-created", "-id")[:CANDIDATES]
    )
    ctx = {
        "nav": "compare",
        "form": form,
        "group": group,
        "groups": GROUPS,
        "selected": [_summary(run) for run in selected],
        "what_changed": _what_changed(selected),
        "candidates": candidates,
        "presets": _presets(),
        "csv_query": request.GET.urlencode(),
    }
    figures = {
        "cmp-peaks": charts.peak_bars(selected, styles),
        "cmp-throughput": charts.compare_vs_concurrency(
            selected, styles, "output_throughput", "Output throughput vs concurrency", "tok/s"
        ),
        "cmp-pareto": charts.pareto(selected, styles, gpus),
        "cmp-tpot": charts.compare_vs_concurrency(
            selected, styles, "median_tpot_ms", "p50 TPOT vs concurrency", "ms", ",.1f"
        ),
        "cmp-ttft": charts.compare_vs_concurrency(
            selected, styles, "p99_ttft_ms", "p99 TTFT vs concurrency", "ms", ",.0f"
        ),
    }
    ctx["peaks"] = figures.pop("cmp-peaks")
    ctx["charts"] = [(key, fig) for key, fig in figures.items() if fig["data"]]
    ctx["missing_charts"] = [
        fig["layout"]["title"]["text"] for fig in figures.values() if not fig["data"]
    ]
    return render(request, "front/compare.html", ctx)


@login_required
def compare_csv(request):
    """Every level of the selected runs, one row each, with the run's facets in front."""
    selected = _selected_runs(_selected_uuids(request))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="moeops-compare.csv"'
    writer = csv.writer(response)
    facets = ["run_uuid", "run", "deployment", "model", "host", "virtualization", "engine"]
    facets += ["kernel_config", "created"]
    writer.writerow(facets + [c.csv_header for c in LEVEL_COLUMNS])
    for run in selected:
        snapshot = run.topology_snapshot
        front = [
            run.uuid,
            run.display_label(),
            run.deployment.name,
            run.deployment.model.name,
            run.deployment.host.name,
            snapshot.virtualization_label if snapshot else "",
            run.deployment.get_engine_display(),
            str(run.kernel_config) if run.kernel_config else run.kernel_config_state(),
            run.created.isoformat(),
        ]
        for _, values in level_rows(run.levels.all(), _gpus(run)):
            writer.writerow(front + ["" if v is None else v for v in values])
    return response
