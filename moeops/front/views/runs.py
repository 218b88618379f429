"""Runs: the list with filters, a run's page, its live status, CSV and cancel; kernel tunes."""

import csv
import hashlib
import itertools
import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Exists, Max, OuterRef, Sum
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from domain import launch, request_log
from domain.engine_paths import EnginePaths, with_profile
from domain.intervals import INTERVAL_KEYS, ONE_ROUND
from domain.traces import keep_up_note
from domain.workloads import spec_label
from moeops.front import capacity, series
from moeops.front.charts import telemetry
from moeops.front.charts.figures import CompactJSONEncoder, mark_standin
from moeops.front.charts.kernels import kernel_speedups, kernel_timings
from moeops.front.charts.runs import engine_counters, run_latency, run_throughput
from moeops.front.charts.steps import profile_panel
from moeops.front.columns import (
    ABSENT,
    ATTEMPT_COLUMN,
    GPU_UTIL_COLUMN,
    KEY_COLUMNS,
    LEVEL_COLUMNS,
    TRACE_COLUMNS,
    absent_reasons,
    cost_columns,
    filled_columns,
    key_columns_first,
    level_rows,
)
from moeops.front.forms.runs import RunFilterForm, TraceUploadForm
from moeops.front.progress import sweep_progress, tuning_progress
from moeops.front.views.deployments import findings_with_figures
from moeops.insights.models import FINDING_STATES
from moeops.kernels import services as kernel_services
from moeops.kernels.models import TuningRun
from moeops.runs import exports, measurements
from moeops.runs import services as run_services
from moeops.runs.costs import GPUS_UNSTATED, level_costs
from moeops.runs.models import LevelProfile, RequestLog, SweepRun
from moeops.runs.telemetry import no_gpu_samples_text

RUNS_PER_PAGE = 50
CHART_NAMES = {
    "throughput": "throughput",
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "gpu-util": "GPU utilization",
    "gpu-power": "GPU power",
    "gpu-memory": "GPU memory",
    "gpu-clock": "SM clock",
    "engine": "engine running/queued requests",
    "kv-cache": "engine KV-cache use",
    "engine-counters": "engine counters (prefix cache, preemptions, speculative decoding)",
}
LEVEL_CHARTS = ("throughput", "ttft", "tpot", "itl", "engine-counters")
TIME_CHARTS = ("gpu-util", "gpu-power", "gpu-memory", "gpu-clock", "engine", "kv-cache")


def _run_or_404(uuid, profiled=False):
    """The run of that uuid; with `profiled`, its .profiled says whether it holds a profiled
    level (in the same query)."""
    # Every signed-in member of the team sees every run.
    runs = SweepRun.objects.select_related(
        "deployment__model", "deployment__host", "topology_snapshot", "kernel_config"
    )
    if profiled:
        runs = runs.annotate(profiled=Exists(LevelProfile.objects.filter(run=OuterRef("pk"))))
    return get_object_or_404(runs, uuid=uuid)


def _tuning_or_404(uuid):
    return get_object_or_404(
        TuningRun.objects.select_related("deployment", "host", "result"), uuid=uuid
    )


@login_required
def runs(request):
    form = RunFilterForm(request.GET or None)
    qs = form.filter(
        SweepRun.objects.select_related(
            "deployment__model", "deployment__host", "topology_snapshot", "kernel_config"
        ).with_summary()
    ).order_by("-created", "-id")
    page = Paginator(qs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    ctx = {"nav": "runs", "form": form, "page": page, "query": query.urlencode()}
    return render(request, "front/runs.html", ctx)


def run_figures(run, levels, gpu, bands):
    """Every chart of the run page, by element id; gpu: series.gpu_series(run), bands:
    series.level_bands(run, levels)."""
    engine = series.engine_series(run, levels=levels)
    figures = {
        "throughput": run_throughput(levels),
        "ttft": run_latency(levels, "ttft", "TTFT (time to first token)"),
        "tpot": run_latency(levels, "tpot", "TPOT (time per output token)"),
        "itl": run_latency(levels, "itl", "ITL (inter-token latency)"),
        "gpu-util": telemetry.gpu_utilization(gpu, bands),
        "gpu-power": telemetry.gpu_power(gpu, bands),
        "gpu-memory": telemetry.gpu_memory(gpu, bands),
        "gpu-clock": telemetry.gpu_clock(gpu, bands),
        "engine": telemetry.engine_queue(engine, bands, _running_cap(run)),
        "kv-cache": telemetry.kv_cache_use(engine, bands),
        "engine-counters": engine_counters(
            [(_level_name(level), level.engine_figures()) for level in levels]
        ),
    }
    if run.is_capacity_search:
        figures.update(capacity.figures(run, levels))
    if run.is_standin:
        for fig in figures.values():
            mark_standin(fig)
    return figures


def _running_cap(run):
    """The running-request cap the run ran under: as the engine reported it, else as the run
    recorded its deployment (what the analysis's findings name too)."""
    return run.reported_running_cap() or run.recorded_running_cap()


def _shown(value):
    """A reported argument's value as text: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _passed(recipe, observed):
    """[(flag or NAME, value passed, value the engine reported or None, whether they agree)] of
    the launch recipe a managed engine was started with: its flags, then its environment."""
    args, env = observed.get("args") or {}, observed.get("env") or {}
    rows = []
    for flag, value in (recipe.get("flags") or {}).items():
        if flag.startswith("--"):
            reported = launch.reported(args, flag)
            agree = reported is None or launch.same_value(reported, value)
            rows.append((flag, value, None if reported is None else _shown(reported), agree))
    for name, value in sorted((recipe.get("env") or {}).items()):
        reported = env.get(name)
        agree = reported is None or _shown(reported) == value
        rows.append((name, value, None if reported is None else _shown(reported), agree))
    return rows


def _not_defaults(observed):
    """([(key, value, default or None)] of the arguments, then the environment, the engine
    reported that are not its defaults, as the worker read them of the engine
    (workers.engine_defaults); None where it did not; the sentence why it could not)."""
    defaults = observed.get("defaults")
    if not isinstance(defaults, dict):
        return None, ""
    if defaults.get("error"):
        return None, str(defaults["error"])
    rows = []
    for section in ("args", "env"):
        reported, differing = observed.get(section) or {}, defaults.get(section) or {}
        for key in sorted(differing):
            if key in reported:
                default = differing[key]
                rows.append(
                    (key, _shown(reported[key]), None if default is None else _shown(default))
                )
    return rows, ""


def _measured(run):
    """What the run's snapshot says it measured, for the run page's cards; {} for a run that
    predates snapshots. The engine, version and cap are as the engine answered when it did."""
    if not run.snapshot:
        return {}
    snapshot = run.recorded()
    observed = snapshot.engine
    not_defaults, defaults_error = _not_defaults(observed)
    return {
        "engine": run.engine_label(),
        "answered": run.engine_answered,
        "recorded": snapshot.deployment,
        "cap": run.reported_running_cap(),
        "cap_source": observed.get("max_running_requests_source"),
        "allreduce_fusion": observed.get("allreduce_fusion"),
        "kernel": snapshot.kernel_config,
        "client": snapshot.client,
        "moeops_version": snapshot.moeops_version,
        "file": snapshot.file,
        "recipe": snapshot.recipe,
        "passed": _passed(snapshot.recipe, observed) if snapshot.recipe else [],
        "args": [(k, _shown(v)) for k, v in sorted((observed.get("args") or {}).items())],
        "args_source": observed.get("args_source"),
        "env": [(k, _shown(v)) for k, v in sorted((observed.get("env") or {}).items())],
        "notes": observed.get("notes") or [],
        "not_defaults": not_defaults,
        "defaults_error": defaults_error,
    }


def _levels(run):
    # rounds: each level's engine figures read its rounds' counters
    return list(run.levels.order_by("concurrency", "request_rate", "id").prefetch_related("rounds"))


def _level_name(level):
    if level.concurrency is not None and level.request_rate is not None:
        return f"{level.request_rate:g} req/s, c={level.concurrency}"
    if level.concurrency is not None:
        return str(level.concurrency)
    return f"{level.request_rate:g} req/s" if level.request_rate is not None else level.key


def _and(names):
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _resumed(run, levels, attempts):
    """ "Resumed: 2 attempts (…); levels 8 and 16 ran in attempt 1, level 32 in attempt 2."
    for a run swept in more than one delivery, else ""."""
    if attempts < 2:
        return ""
    parts, ran = [], "ran "
    for attempt in range(1, attempts + 1):
        names = [_level_name(level) for level in levels if level.attempt == attempt]
        if names:
            parts.append(f"level{pluralize(names)} {_and(names)} {ran}in attempt {attempt}")
            ran = ""
        else:
            # an attempt cut short before it stored a level, or the one sweeping now
            yet = " yet" if attempt == attempts and not run.is_finished else ""
            parts.append(f"none{yet} in attempt {attempt}")
    resumes = {2: "", 3: "twice "}.get(attempts, f"{attempts - 1} times ")
    return (
        f"Resumed: {attempts} attempts ({resumes}its worker stopped and another delivery took "
        f"over); {', '.join(parts)}."
    )


def _level_table(run, levels, gpu, bands):
    """The per-level table's context (front/_run_levels.html); gpu: series.gpu_series(run,
    levels=levels), whose buckets give each level's mean GPU utilization and power; bands:
    series.level_bands(run, levels)."""
    num_gpus = run.measured_gpu_count()
    attempts = run.attempts(levels)
    gpu_util = series.level_means(gpu, bands, "util")
    costs = level_costs(run, levels, num_gpus, power=gpu.extra.get("level_power"))
    columns = (*LEVEL_COLUMNS, GPU_UTIL_COLUMN, *cost_columns(run.deployment.host.currency))
    if attempts > 1:
        # after the level's concurrency and rate, which say which level it is
        columns = (*columns[:2], ATTEMPT_COLUMN, *columns[2:])
    columns = key_columns_first(columns)
    rows = level_rows(levels, num_gpus, columns, gpu_util, costs)
    shown = filled_columns(rows, columns)
    return {
        "run": run,
        "num_gpus": num_gpus,
        "resumed": _resumed(run, levels, attempts),
        "columns": [columns[i] for i in shown],
        # key_columns_first put them first
        "key_columns": sum(columns[i].key in KEY_COLUMNS for i in shown),
        "more_columns": any(columns[i].key not in KEY_COLUMNS for i in shown),
        "rows": [
            (level, [(values[i], columns[i].digits, level.interval(columns[i].key)) for i in shown])
            for level, values in rows
        ],
        "rounds": max((level.round_count for level in levels), default=1),
        "one_round": ONE_ROUND,
        "hidden_columns": [
            c.label for i, c in enumerate(columns) if i not in shown and c.key not in TRACE_COLUMNS
        ],
        "trace_notes": [
            (level, note)
            for level in levels
            if (
                note := keep_up_note(
                    level.p99_lateness_ms,
                    level.max_lateness_ms,
                    (level.raw or {}).get("late_requests"),
                )
            )
        ],
        "partial_levels": [level for level in levels if level.is_partial],
        "absent_figures": (
            [("output per GPU", GPUS_UNSTATED)] if run.source == "import" and not num_gpus else []
        )
        + absent_reasons(costs),
        "failures": [(level, level.errors) for level in levels if level.errors],
    }


def _figures_key(run, levels):
    """What the run's charts and level table are drawn from, as a short text that changes
    whenever they would: its status, each level's window, rounds and attempt, and the sample
    batches stored (every sample arrives in one, runs.services). Two small queries' worth."""
    batches = run.telemetry_batches.aggregate(n=Count("id"), last=Max("id"))
    drawn_from = (
        run.status,
        [(lv.pk, lv.round_count, lv.attempt, lv.started_at, lv.finished_at) for lv in levels],
        batches["n"],
        batches["last"],
    )
    return hashlib.sha256(repr(drawn_from).encode()).hexdigest()[:16]


def _figures_and_table(run, levels):
    """The run's charts and its per-level table's context: the page and its live poll show the
    same, from one read of the GPU samples."""
    gpu, bands = series.gpu_series(run, levels=levels), series.level_bands(run, levels)
    figures = run_figures(run, levels, gpu, bands)
    return figures, _level_table(run, levels, gpu, bands)


@login_required
def run_detail(request, uuid):
    return _run_page(request, _run_or_404(uuid, profiled=True))


def _run_page(request, run, upload_form=None, status=200):
    levels = _levels(run)
    figures, table = _figures_and_table(run, levels)
    # a running sweep's empty charts fill in (hidden until they do); a finished one's stay
    # empty, so they are named
    drawn = {k for k, fig in figures.items() if fig["data"] or not run.is_finished}
    # read only where the run's row says there are some: a run without costs no query
    profiles = list(run.profiles.shown()) if run.profiled else []
    ctx = {
        **table,
        "nav": "runs",
        "deployment": run.deployment,
        "measured": _measured(run),
        "progress": sweep_progress(run),
        # the live poll sends the charts again only once they are drawn from something else
        "figures_key": "" if run.is_finished else _figures_key(run, levels),
        "level_charts": [(k, figures[k]) for k in LEVEL_CHARTS if k in drawn],
        "capacity": capacity.card(run),
        "capacity_charts": [(k, fig) for k, fig in figures.items() if k.startswith("slo-")],
        "time_charts": [(k, figures[k]) for k in TIME_CHARTS if k in drawn],
        "missing_charts": [CHART_NAMES[k] for k in CHART_NAMES if k not in drawn],
        "waiting": not run.is_finished and not any(fig["data"] for fig in figures.values()),
        "findings": findings_with_figures(run.findings.select_related("note").by_importance()),
        "finding_states": FINDING_STATES,
        # the engine's own words first: a level where nothing succeeded has no numbers to show
        "all_failed": [(level, why) for level in levels if (why := level.all_failed_with())],
        "requests_logged": RequestLog.objects.filter(level__run=run).aggregate(n=Sum("count"))["n"],
        "workload": _workload_sent(run),
        "engine_paths": _engine_paths(run, profiles),
        # the concurrencies "Look inside the step" may sweep again
        "concurrencies": sorted({level.concurrency for level in levels}),
        "profile_panels": [profile_panel(p) for p in profiles],
        "upload_form": upload_form or TraceUploadForm(),
        "turns": [
            (level, level.raw["ttft_by_turn"])
            for level in levels
            if isinstance(level.raw, dict) and level.raw.get("ttft_by_turn")
        ],
    }
    return render(request, "front/run_detail.html", ctx, status=status)


@login_required
@require_POST
def run_profile_upload(request, uuid):
    """Traces captured by hand for a level of the run (runs.measurements.profile_upload), to the
    run's panel; the run page again with the reader's sentence on the file when refused."""
    run = _run_or_404(uuid, profiled=True)
    form = TraceUploadForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            profile, created = measurements.profile_upload(
                run=run,
                concurrency=form.cleaned_data["concurrency"],
                request_rate=form.cleaned_data["request_rate"],
                name=upload.name,
                chunks=upload.chunks(),
                size=upload.size,
            )
        except ValidationError as exc:
            for problem in exc.message_dict.get("file", exc.messages):
                form.add_error("file", problem)
        else:
            said = "Read" if created else "Already stored:"
            messages.success(request, f"{said} {upload.name} at concurrency {profile.concurrency}.")
            return redirect(f"{reverse('run-detail', args=[run.uuid])}#profile-{profile.pk}")
    return _run_page(request, run, upload_form=form, status=400)


def _engine_paths(run, profiles):
    """The run's engine paths (domain.engine_paths), each with the word of its first captured
    profile where it bears on the path (the kernels it ran confirm or contradict it)."""
    paths = EnginePaths.read(run.recorded().engine_paths) if run.snapshot else None
    captured = next((p for p in profiles if p.status == "captured"), None)
    if paths is None or captured is None:
        return paths
    where = f"profile at concurrency {captured.concurrency}"
    return with_profile(paths, captured.step_breakdown(), where)


def _workload_sent(run):
    """(the snapshot's workload record, its spec in words, its id for its page) of a sweep that
    named a workload; None for one that sent random ids of its lengths, and for imports."""
    named = (run.parameters or {}).get("workload")
    if not isinstance(named, dict) or not isinstance(named.get("spec"), dict):
        return None
    try:
        described = spec_label(named["spec"])
    except (KeyError, TypeError):
        described = ""
    pk = named.get("id") if isinstance(named.get("id"), int) else None
    return run.recorded().workload or named, described, pk


@login_required
def run_status(request, uuid):
    """The run's status and progress as JSON, polled by the page; ?figures=1 adds the charts
    and the per-level table (HTML), so that the two never tell different stories, with the
    figures_key they were drawn from: given back as ?since=, it leaves them out until it
    changes."""
    run = _run_or_404(uuid)
    payload = {
        "status": run.status,
        "status_display": run.get_status_display(),
        "finished": run.is_finished,
        "cancel_requested": run.cancel_requested,
        "error": run.error,
        "progress": sweep_progress(run),
    }
    if request.GET.get("figures"):
        levels = _levels(run)
        payload["levels"] = len(levels)
        payload["figures_key"] = _figures_key(run, levels)
        if request.GET.get("since") != payload["figures_key"]:
            payload["figures"], table = _figures_and_table(run, levels)
            payload["levels_html"] = render_to_string("front/_run_levels.html", table, request)
    return JsonResponse(payload, encoder=CompactJSONEncoder)


@login_required
def run_levels_csv(request, uuid):
    """Every round of every level (a level run once is its round 1), and for a level of several
    rounds a "median" row of the level's figures with their 95 % intervals."""
    run = _run_or_404(uuid)
    name = slugify(run.display_label()) or str(run.uuid)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}-levels.csv"'
    writer = csv.writer(response)
    columns = (*LEVEL_COLUMNS, *cost_columns(run.deployment.host.currency))
    writer.writerow(
        ["round"]
        + [c.csv_header for c in columns]
        + ["cost_absent_because", "energy_absent_because", "errors", "partial", "stand_in"]
        + [f"{key} 95% {end}" for key in INTERVAL_KEYS for end in ("low", "high")]
    )
    standin = "yes" if run.is_standin else "no"
    num_gpus = run.measured_gpu_count()
    levels = list(
        run.levels.order_by("concurrency", "request_rate", "id").prefetch_related("rounds")
    )
    costs = level_costs(run, levels, num_gpus)
    for level in levels:
        rounds = level.stored_rounds()
        rows = [(str(r.round), r.as_level()) for r in rounds]
        if len(rounds) > 1:
            rows.append(("median", level))
        for round_name, row in rows:
            # cost and energy are the level's (its power over all its rounds): on its median
            # row, or on its one round
            cost = costs[level.key] if row is level or len(rounds) == 1 else None
            _, values = level_rows([row], num_gpus, columns, costs={level.key: cost})[0]
            intervals = [row.interval(key) if row is level else None for key in INTERVAL_KEYS]
            writer.writerow(
                [round_name]
                + ["" if v is None or v == ABSENT else v for v in values]
                + ([cost.cost.reason, cost.energy.reason] if cost else ["", ""])
                + [json.dumps(row.errors) if row.errors else ""]
                + ["yes" if row.is_partial else "no", standin]
                + [v for i in intervals for v in (i or ("", ""))]
            )
    return response


@login_required
def run_vllm_results(request, uuid):
    """The run's levels as `vllm bench serve --save-result` objects, a JSON array (a summary.json
    that `vllm bench sweep plot` reads, and moeops' vLLM import takes back)."""
    run = _run_or_404(uuid)
    levels = exports.levels_in_order(run)
    name = slugify(run.display_label()) or str(run.uuid)
    body = exports.vllm_results_json(run, levels)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}-vllm.json"'
    return response


@login_required
def run_requests_export(request, uuid, fmt):
    """Every request of the run, one JSON line or CSV row each (domain.request_log keys, after
    the level's concurrency, request_rate and round); streamed, one level's log at a time."""
    run = _run_or_404(uuid)
    name = slugify(run.display_label()) or str(run.uuid)
    if fmt == "jsonl":
        lines = (request_log.export_line(lv, rq) + "\n" for lv, rq in run.logged_requests())
        content_type = "application/jsonl; charset=utf-8"
    else:
        buffer = _Echo()
        writer = csv.writer(buffer)
        header = (writer.writerow(request_log.CSV_HEADER),)
        rows = (writer.writerow(request_log.csv_cells(lv, rq)) for lv, rq in run.logged_requests())
        lines = itertools.chain(header, rows)
        content_type = "text/csv; charset=utf-8"
    response = StreamingHttpResponse(lines, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}-requests.{fmt}"'
    return response


class _Echo:
    """A file for csv.writer whose write hands back the row it was given."""

    def write(self, value):
        return value


@login_required
@require_POST
def run_cancel(request, uuid):
    run = _run_or_404(uuid)
    try:
        run_services.run_cancel(run=run)
    except run_services.RunConflict as exc:
        messages.error(request, f"Nothing to cancel: {exc}.")
    else:
        if run.status == "cancelled":
            messages.success(request, "Cancelled before the worker started it.")
        else:
            messages.success(
                request,
                "Cancel requested: the sweep stops at the next request; every request and "
                "level finished by then is kept.",
            )
    return redirect("run-detail", uuid=run.uuid)


@login_required
@require_POST
def run_profile_again(request, uuid):
    """Sweep one level of the run's load again with a profiled pass (its peak level unless
    the form names a concurrency); the new run's page follows it."""
    run = _run_or_404(uuid)
    concurrency = request.POST.get("concurrency", "")
    try:
        again, _ = run_services.run_profile_again(
            run=run, concurrency=int(concurrency) if concurrency.isdigit() else None
        )
    except ValidationError as exc:
        for errors in exc.message_dict.values():
            for error in errors:
                messages.error(request, error[:1].upper() + error[1:])
        return redirect("run-detail", uuid=run.uuid)
    messages.success(request, f"{again.display_label()}: queued.")
    return redirect("run-detail", uuid=again.uuid)


def tuning_figures(tuning, timings):
    """Every chart of the tuning-run page, by element id; the status endpoint sends the same."""
    gpu = series.gpu_series(tuning)
    return {
        "timings": kernel_timings(timings),
        "speedups": kernel_speedups(timings),
        "gpu-util": telemetry.gpu_utilization(gpu, []),
        "gpu-power": telemetry.gpu_power(gpu, []),
    }


@login_required
def tuning_detail(request, uuid):
    tuning = _tuning_or_404(uuid)
    timings = list(tuning.timings.all())
    figures = tuning_figures(tuning, timings)
    unfinished = tuning.status in ("queued", "running")
    ctx = {
        "nav": "kernels",
        "tuning": tuning,
        "timings": timings,
        "progress": tuning_progress(tuning, len(timings)),
        "figures": figures,
        # a running tune's empty charts fill in; a finished one without samples says so
        "time_charts": [
            (k, figures[k]) for k in ("gpu-util", "gpu-power") if figures[k]["data"] or unfinished
        ],
        "no_telemetry": no_gpu_samples_text(
            "tune", tuning.telemetry_status, tuning.telemetry_detail
        ),
        # whether the deployment's engine, at its version and launch, runs the path tuned
        "path_use": (
            tuning.path_for(tuning.deployment) if tuning.deployment and tuning.kernel_path else ""
        ),
    }
    return render(request, "front/tuning_detail.html", ctx)


@login_required
def tuning_status(request, uuid):
    tuning = _tuning_or_404(uuid)
    timings = list(tuning.timings.all())
    payload = {
        "status": tuning.status,
        "status_display": tuning.get_status_display(),
        "finished": tuning.status in ("succeeded", "failed", "cancelled"),
        "error": tuning.error,
        "progress": tuning_progress(tuning, len(timings)),
    }
    if request.GET.get("figures"):
        payload["figures"] = tuning_figures(tuning, timings)
    return JsonResponse(payload)


@login_required
@require_POST
def tuning_cancel(request, uuid):
    tuning = _tuning_or_404(uuid)
    was = tuning.status
    try:
        kernel_services.tuning_run_cancel(tuning_run=tuning)
    except kernel_services.TuningConflict:
        messages.error(request, f"Nothing to cancel: the tune is {tuning.get_status_display()}.")
    else:
        if was == "queued":
            messages.success(request, "Cancelled before the worker started it.")
        else:
            messages.success(
                request,
                "Cancelled: the worker stops the tune's GPU processes at its next progress "
                "report; what it tuned so far stays in its log on the host.",
            )
    return redirect("tuning-detail", uuid=tuning.uuid)
