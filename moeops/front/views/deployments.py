"""Dashboard, deployments, and what a deployment's page lets a person do (check, sweep, tune,
plan)."""

import functools
from collections import Counter

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import (
    Count,
    Exists,
    OuterRef,
    Prefetch,
    Q,
    Subquery,
    prefetch_related_objects,
)
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from moeops.engines.models import EngineAction, LaunchRecipe
from moeops.fleet import services as fleet_services
from moeops.fleet.models import Deployment
from moeops.front import capacity
from moeops.front.capacity_estimate import capacity_estimate
from moeops.front.charts.capacity import capacity_over_time
from moeops.front.charts.deployments import peaks_per_run, throughput_vs_load
from moeops.front.charts.findings import evidence_figure
from moeops.front.charts.watches import watch_timeline
from moeops.front.forms.deployments import DeploymentForm, PlanItemForm
from moeops.front.forms.kernels import TuneForm
from moeops.front.forms.runs import ResultFileForm
from moeops.front.forms.sweeps import SWEEP_PRESETS, CapacityForm, SweepForm
from moeops.front.forms.watches import WatchCreateForm
from moeops.front.page_levels import set_levels
from moeops.front.progress import sweep_progress, tuning_progress
from moeops.front.templatetags.moeops_format import evidence_text
from moeops.front.views import engines
from moeops.front.views.watches import watch_runs_for_timeline
from moeops.insights.models import FINDING_STATES, Finding, PlanItem
from moeops.insights.services import (
    FOUND_UNDER,
)
from moeops.kernels import services as kernel_services
from moeops.kernels.models import KernelConfig, TuningRun, TuningTiming
from moeops.runs import capacity as run_capacity
from moeops.runs import services as run_services
from moeops.runs import snapshots
from moeops.runs.importers import ResultFileError, ResultFileMismatch
from moeops.runs.models import (
    ASIDE,
    LEVEL_LOAD_FIELDS,
    LevelResult,
    SweepRun,
    of_the_deployment,
    summarized,
)
from moeops.subqueries import column, counted, newest
from moeops.watches import services as watch_services
from moeops.watches.models import last_regressed

ACTIVE = ("queued", "running")
# Checks the deployment page lists, newest first.
RECENT_CHECKS = 10
RECENT_TUNES = 5
DASHBOARD_RUNS = 8
# The dashboard's open findings: this many, each said once, from the most important ones.
DASHBOARD_FINDINGS = 8
DASHBOARD_FINDINGS_SCANNED = 80


# The deployment page's levels of its runs, and what it reads of them (the list, the charts vs
# load, the sweep estimate's pace): a level has some 60 columns, and the page lists every run.
PAGE_LEVELS = LevelResult.objects.order_by("concurrency", "id")
PAGE_LEVEL_FIELDS = ("id", *LEVEL_LOAD_FIELDS)


def _deployment_or_404(pk):
    # Every signed-in member of the team sees every deployment.
    return get_object_or_404(
        Deployment.objects.select_related("model", "host", "default_slo_profile"), pk=pk
    )


@functools.cache
def _latest_run_annotations():
    """_with_latest_run_ids' subqueries, built once: a query copies them as it resolves them."""
    runs = SweepRun.objects.filter(
        deployment=OuterRef("pk"), levels__output_throughput__isnull=False
    )
    latest = of_the_deployment(runs).order_by("-created", "-id").values("pk")[:1]
    # the version names the recipe (unique for its deployment): a second subquery for its pk
    # cost each page that lists deployments
    return {
        "latest_run_id": Subquery(latest),
        "recipe_in_force_version": newest(
            LaunchRecipe,
            "deployment",
            column(Deployment, "id"),
            ("applied_at", "version"),
            "version",
        ),
    }


def _with_latest_run_ids(deployments):
    """The deployments (a queryset, read here) each with .latest_run_id: its newest run of its
    model that has throughput (an imported file of another model is no headline of this
    deployment), and the launch recipe in force."""
    return list(deployments.annotate(**_latest_run_annotations()))


def _latest_run_ids(deployments):
    return [d.latest_run_id for d in deployments if d.latest_run_id]


def _with_latest_runs(deployments, runs):
    """Each deployment of _with_latest_run_ids with .latest_run and .latest_peak (runs: {pk:
    run} with_summary, holding every .latest_run_id) and .latest_recipe_gone: (the launch
    recipe version the run measured or None, the version in force) where the managed engine
    runs another recipe than that run measured, else None."""
    for d in deployments:
        d.latest_run = runs.get(d.latest_run_id)
        d.latest_peak = d.latest_run.peak if d.latest_run else None
    _latest_recipe_gone(deployments)
    return deployments


def _with_latest_peak(deployments):
    """_with_latest_runs of the deployments queryset, their latest runs read here."""
    deployments = _with_latest_run_ids(deployments)
    runs = SweepRun.objects.filter(pk__in=_latest_run_ids(deployments)).with_summary()
    return _with_latest_runs(deployments, {run.pk: run for run in runs})


def _rows():
    """Every deployment with its open findings and run count (read by _with_latest_run_ids)."""
    return Deployment.objects.select_related("model", "host").annotate(
        open_findings=Count("findings", filter=Q(findings__state="open"), distinct=True),
        run_count=Count("runs", distinct=True),
    )


# What the dashboard reads of a deployment (its row, its runs' progress, its capacity's SLO
# profile): a deployment has two dozen columns, its model a large config.
DASHBOARD_DEPLOYMENT = (
    "name",
    "status",
    "status_detail",
    "status_checked_at",
    "default_slo_profile_id",
    "model__name",
    "host",
)


# What a dashboard card reads of a running tune (its name, progress and status): a tune has
# 31 columns.
DASHBOARD_TUNE = (
    "uuid",
    "deployment_id",
    "host",
    "device_name",
    "E",
    "N",
    "dtype",
    "status",
    "progress",
    "batch_sizes",
    "finished_at",
    "created",
)


@functools.cache
def _dashboard_rows():
    """Every deployment with what the dashboard shows of it (read by _with_latest_run_ids)."""
    return Deployment.objects.select_related("model", "host").only(*DASHBOARD_DEPLOYMENT)


def _with_open_findings(deployments, findings):
    """Each deployment with .open_findings, its open findings counted: from `findings` (the
    dashboard's most important open ones, read already) where they are all of them, else in
    one query."""
    if len(findings) < DASHBOARD_FINDINGS_SCANNED:
        counts = Counter(f.deployment_id for f in findings)
    else:
        opened = Finding.objects.filter(state="open").order_by().values_list("deployment")
        counts = dict(opened.annotate(n=Count("id")))
    for d in deployments:
        d.open_findings = counts.get(d.pk, 0)
    return deployments


def _with_capacity(deployments):
    """Each deployment with its newest capacity at its default SLO profile (.capacity_run,
    .capacity)."""
    latest = run_capacity.latest_capacities(deployments)
    for d in deployments:
        d.capacity_run = latest.get(d.pk)
        d.capacity = capacity.headline(d.capacity_run.capacity) if d.capacity_run else ""
    return deployments


def _latest_recipe_gone(deployments):
    """Set .latest_recipe_gone (see _with_latest_runs). The recipes in force are read only for
    the deployments whose latest run measured another version: a restore or a revert puts up a
    new version that runs what the run ran."""
    differ = {}
    for d in deployments:
        d.latest_recipe_gone = None
        if d.latest_run is None or d.recipe_in_force_version is None:
            continue
        measured = (d.latest_run.snapshot or {}).get("recipe") or {}
        if measured.get("version") != d.recipe_in_force_version:
            differ[d.pk, d.recipe_in_force_version] = (d, measured)
    if not differ:
        return
    in_force = functools.reduce(
        Q.__or__, (Q(deployment_id=pk, version=version) for pk, version in differ)
    )
    for recipe in LaunchRecipe.objects.filter(in_force).prefetch_related("kernel_configs"):
        d, measured = differ[recipe.deployment_id, recipe.version]
        running = snapshots.recipe_content(snapshots.recipe_record(recipe))
        if not measured or snapshots.recipe_content(measured) != running:
            d.latest_recipe_gone = (measured.get("version"), recipe.version)


def _recent_and_active(jobs, count, *, also=()):
    """(the `count` newest of the jobs queryset, its queued and running ones oldest first,
    {pk: job} of those of its jobs whose pk is in `also`), in one query: an active job is most
    often among the newest."""
    newest = jobs.order_by("-created", "-id").values("pk")[:count]
    both = list(
        jobs.filter(Q(pk__in=newest) | Q(status__in=ACTIVE) | Q(pk__in=also)).order_by(
            "-created", "-id"
        )
    )
    # every one of the `count` newest is in `both`, so they are its first `count`
    also = set(also)
    return (
        both[:count],
        [job for job in reversed(both) if job.status in ACTIVE],
        {job.pk: job for job in both if job.pk in also},
    )


def _read_already(objects, field, rows):
    """The objects (read here: a list) with their foreign key `field` set to the row of `rows`
    ({pk: row}, read already by the page) that it names, rather than joined again in their
    query; one not in `rows` is read when asked for."""
    objects = list(objects)
    key = f"{field}_id"
    for obj in objects:
        row = rows.get(getattr(obj, key))
        if row is not None:
            setattr(obj, field, row)
    return objects


def _of_deployments(objects, deployments):
    """The objects (a list or queryset, read here) each with .deployment set from the
    deployments read already (every deployment, with its host), not joined again in their
    query: a list. One made after the deployments were read is read on its own."""
    return _read_already(objects, "deployment", {d.pk: d for d in deployments})


def _with_timing_count(tunings):
    """The TuningRun queryset with .timing_count: the batch sizes timed so far."""
    return tunings.annotate(timing_count=counted(TuningTiming, "run", column(TuningRun, "id")))


def _tunes_progress(tunings):
    return [(t, tuning_progress(t, t.timing_count)) for t in tunings]


@login_required
def dashboard(request):
    deployments = _with_latest_run_ids(_dashboard_rows())
    # the deployments' latest runs are read with the recent ones: often the same runs; the
    # dashboard shows no level counts
    recent_runs, active, latest = _recent_and_active(
        SweepRun.objects.with_peak(), DASHBOARD_RUNS, also=_latest_run_ids(deployments)
    )
    _of_deployments([*recent_runs, *active, *latest.values()], deployments)
    _with_capacity(_with_latest_runs(deployments, latest))
    tunings = TuningRun.objects.filter(status__in=ACTIVE).select_related("host")
    tunings = tunings.only(*DASHBOARD_TUNE)
    tunings = _of_deployments(_with_timing_count(tunings).order_by("created"), deployments)
    # what the list and said_once read (the list names each finding's deployment, not its
    # run): the text and the evidence (charts) are the deployment page's
    said = ("deployment_id", "kind", "key", "title", "state", "severity")
    findings = Finding.objects.only(*said).open_by_importance()
    findings = _of_deployments(findings[:DASHBOARD_FINDINGS_SCANNED], deployments)
    _with_open_findings(deployments, findings)
    regressed = list(last_regressed())
    _of_deployments([w.watch for w in regressed], deployments)
    ctx = {
        "nav": "dashboard",
        "deployments": deployments,
        "active": [(run, sweep_progress(run)) for run in active],
        "active_tunes": _tunes_progress(tunings),
        "findings": said_once(findings)[:DASHBOARD_FINDINGS],
        "regressed": regressed,
        "recent_runs": recent_runs,
    }
    return render(request, "front/dashboard.html", ctx)


@login_required
def deployments(request):
    rows = _with_capacity(_with_latest_peak(_rows()))
    return render(request, "front/deployments.html", {"nav": "deployments", "deployments": rows})


@login_required
def deployment_create(request):
    form = DeploymentForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        fields = dict(form.cleaned_data)
        gpus = fields.pop("gpus")
        for name in DeploymentForm.NEW_MODEL_FIELDS:
            fields.pop(name)
        deployment, _ = fleet_services.deployment_create(
            new_model=form.new_model,
            gpu_indexes=[gpu.index for gpu in gpus],
            user=request.user,
            **fields,
        )
        if form.reused_model is not None:
            messages.info(
                request,
                f"That config.json is the one of “{form.reused_model}”, on record already: "
                "the deployment uses it.",
            )
        messages.success(request, f"Deployment “{deployment.name}” created.")
        return redirect(deployment)
    return render(
        request, "front/deployment_form.html", {"nav": "deployments", "form": form, "new": True}
    )


@login_required
def deployment_edit(request, pk):
    deployment = _deployment_or_404(pk)
    form = DeploymentForm(request.POST or None, instance=deployment, user=request.user)
    if request.method == "POST" and form.is_valid():
        # through the service, as the API's PATCH: a status set here is a check in the history
        changed = {k: form.cleaned_data[k] for k in form.changed_data if k in form.Meta.fields}
        gpus = changed.pop("gpus", None)
        # the form has set its cleaned values on `deployment`: the service gets the row as stored
        stored = Deployment.objects.select_related("host").get(pk=deployment.pk)
        fleet_services.deployment_update(
            deployment=stored, user=request.user, trigger="edit", gpus=gpus, **changed
        )
        messages.success(request, "Deployment saved.")
        return redirect(stored)
    ctx = {"nav": "deployments", "form": form, "deployment": deployment, "new": False}
    return render(request, "front/deployment_form.html", ctx)


@functools.cache
def _aside():
    """Whether a run is ASIDE, as the deployment page annotates its runs: built once, as a
    query copies an expression as it resolves it."""
    return Exists(SweepRun.objects.filter(ASIDE, pk=OuterRef("pk")))


def findings_with_figures(findings):
    """Findings with .figure (their evidence charted, or None) and .numbers (evidence as
    (key, text)) for the findings panel."""
    findings = list(findings)
    for finding in findings:
        finding.figure = evidence_figure(finding.evidence, finding.get_kind_display())
        finding.chart_id = f"evidence-{finding.pk}"
        finding.numbers = [
            (k, evidence_text(v, k))
            for k, v in (finding.evidence or {}).items()
            # the recipe a deployment-wide finding was made under: for superseding, not reading
            if k not in ("chart", FOUND_UNDER)
        ]
    return findings


def said_once(findings):
    """Findings (in their order) with those that say the same thing (kind, key, title, state)
    as one before them folded into it: the first keeps .also, the others' runs."""
    first, shown = {}, []
    for finding in findings:
        said = (finding.kind, finding.key, finding.title, finding.state)
        if said in first:
            first[said].also.append(finding)
            continue
        finding.also = []
        first[said] = finding
        shown.append(finding)
    return shown


def _edited_since(deployment, runs):
    """{"run", "edits": [(field, then, now)]}: the deployment's recorded fields that changed
    since the newest of `runs` (newest first) whose snapshot recorded it; None when none did
    or nothing changed."""
    # an import's snapshot holds what its file states, not what the deployment recorded
    run = next((r for r in runs if r.recorded().deployment and r.source != "import"), None)
    edits = snapshots.deployment_edits(run.snapshot, deployment) if run else []
    if not edits:
        return None
    show = snapshots.show_value
    return {"run": run, "edits": [(e["key"], show(e["a"]), show(e["b"])) for e in edits]}


def _deployment_page(
    request,
    deployment,
    *,
    sweep_form=None,
    tune_form=None,
    upload_form=None,
    capacity_form=None,
    watch_form=None,
    status=200,
):
    """The deployment page; a form given (refused, with its errors) is drawn open in it. The
    sweep, capacity and watch forms read lists of their own (workloads, SLO profiles, alert
    channels) and are otherwise asked for when their section is opened (sweep_form and the
    others below): the page itself reads none of those lists."""
    runs = list(
        deployment.runs.select_related("topology_snapshot")
        .annotate(aside=_aside())
        .order_by("-created", "-id")
    )
    runs = summarized(set_levels(runs, PAGE_LEVELS, PAGE_LEVEL_FIELDS))
    # every run of the deployment: the findings' and the plan's runs are among them
    runs_by_pk = {run.pk: run for run in runs}
    # the charts draw what this deployment serves; the runs ASIDE are listed, not drawn
    own_runs = [run for run in runs if not run.aside]
    shape = deployment.moe_shape()
    # prefetched: snapshots.deployment_record reads them again for the edit notice
    prefetch_related_objects([deployment], "gpus")
    gpus = sorted(deployment.gpus.all(), key=lambda gpu: gpu.index)
    gpus = gpus or list(deployment.host.gpus.all())
    # every dtype on record for its shape, not only the one its weights load
    kernel_configs = (
        KernelConfig.objects.for_shape(deployment.kernel_shape(), every_dtype=True)
        .order_by("dtype", "-version")
        # the page links them by dtype and version: their entries are large JSON
        .only("dtype", "version", "down_moe")
    )
    # the active sweeps are among the runs read above; one query for recent and active tunes
    running = sorted((run for run in runs if run.status in ACTIVE), key=lambda r: (r.created, r.id))
    active = [(run, sweep_progress(run)) for run in running]
    tunings, active_tunes, _ = _recent_and_active(
        _with_timing_count(deployment.tuning_runs.all()), RECENT_TUNES
    )
    _read_already(tunings + active_tunes, "host", {deployment.host_id: deployment.host})
    topology = deployment.host.current_topology()
    checks = list(deployment.health_checks.all()[:RECENT_CHECKS])
    with_actions = Prefetch(
        "engine_actions",
        EngineAction.objects.select_related("before_run", "after_run", "recipe", "kernel_config"),
    )
    plan_items = list(
        deployment.plan_items.select_related("note", "finding", "done_by__recipe").prefetch_related(
            with_actions, "tuning_runs"
        )
    )
    done_by = [item.done_by for item in plan_items if item.done_by is not None]
    _read_already(done_by, "before_run", runs_by_pk)
    _read_already(done_by, "after_run", runs_by_pk)
    for item in plan_items:
        item.retune = item.retunes()
    ctx = {
        "nav": "deployments",
        "deployment": deployment,
        "health_checks": checks,
        "runs": runs,
        "edited_since": _edited_since(deployment, runs),
        "shape": shape,
        "gpus": gpus,
        "topology": topology,
        "kernel_configs": kernel_configs,
        "tunings": tunings,
        "active": active,
        "active_tunes": _tunes_progress(active_tunes),
        "findings": findings_with_figures(
            said_once(
                _read_already(
                    deployment.findings.select_related("note").by_importance(), "run", runs_by_pk
                )
            )
        ),
        "finding_states": FINDING_STATES,
        "plan_items": plan_items,
        "plan_form": PlanItemForm(),
        "plan_statuses": PlanItem._meta.get_field("status").choices,
        **_sweep_form_context(deployment, sweep_form),
        "capacity_form": capacity_form,
        "watch_form": watch_form,
        "upload_form": upload_form or ResultFileForm(),
        "tune_form": tune_form or TuneForm(deployment=deployment),
        # the GPUs shown are the host's: the deployment's own, else all of the host's
        "tune_refusal": deployment.tune_refusal(has_gpus=bool(gpus), topology=topology),
        "throughput_chart": throughput_vs_load(reversed(own_runs)),
        **_capacity_over_time(deployment, runs),
        "peaks_chart": peaks_per_run(own_runs),
    }
    ctx.update(engines.panel_context(deployment, plan_items))
    ctx["engine_summary"] = deployment.launch_summary(running_cap=ctx.get("current_cap"))
    ctx.update(_watches_context(deployment))
    return render(request, "front/deployment_detail.html", ctx, status=status)


def _capacity_over_time(deployment, runs):
    """The deployment's capacity searches at its default SLO profile, oldest first, as a chart
    and rows (run, headline, binding sentence); runs: all of the deployment's, newest first."""
    runs = [
        run
        for run in runs
        if run_capacity.is_answered(run) and run_capacity.at_default_profile(run, deployment)
    ][::-1]
    return {
        "capacity_runs": [
            (
                run,
                capacity.headline(run.capacity),
                (run.capacity.get("binding") or {}).get("sentence"),
            )
            for run in reversed(runs)
        ],
        "capacity_chart": capacity_over_time(runs) if runs else None,
    }


def _watches_context(deployment):
    """The deployment's watches with their next run and last run, and each one's timeline:
    the same few queries for any number of watches."""
    now = timezone.now()
    watches = list(
        deployment.watches.select_related("periodic_task__crontab", "periodic_task__interval")
    )
    by_watch = {watch.pk: [] for watch in watches}
    for watch_run in watch_runs_for_timeline(watches):
        by_watch[watch_run.watch_id].append(watch_run)
    timelines = []
    for watch in watches:
        watch_runs = by_watch[watch.pk]
        watch.next_run = watch.next_run_at(now)
        watch.last_run = watch_runs[0] if watch_runs else None
        finished = [w for w in watch_runs if w.status == "finished"]
        figure = watch_timeline(finished, watch.figure_name())
        timelines.append((f"watch-timeline-{watch.pk}", figure))
    return {"watches": watches, "watch_timelines": timelines}


@login_required
def deployment_detail(request, pk):
    return _deployment_page(request, _deployment_or_404(pk))


def _sweep_form_context(deployment, form):
    """What the sweep form shows beside its fields; {} without a form."""
    if form is None:
        return {}
    return {
        "sweep_form": form,
        "sweep_presets": SWEEP_PRESETS,
        "sweep_estimate": form.estimate(),
        # a sweep may wait for its worker in the queue, but the person starting it is told
        "sweep_waits": deployment.host.worker_absence(),
    }


@login_required
def sweep_form(request, pk):
    """The deployment page's sweep form, asked for when its section is opened."""
    deployment = _deployment_or_404(pk)
    ctx = {
        "deployment": deployment,
        **_sweep_form_context(deployment, SweepForm(deployment=deployment)),
    }
    return render(request, "front/_form_sweep.html", ctx)


@login_required
def capacity_form(request, pk):
    """The deployment page's capacity search form, asked for when its section is opened."""
    deployment = _deployment_or_404(pk)
    ctx = {"deployment": deployment, "capacity_form": CapacityForm(deployment=deployment)}
    return render(request, "front/_form_capacity.html", ctx)


@login_required
def watch_form(request, pk):
    """The deployment page's watch form, asked for when its section is opened."""
    deployment = _deployment_or_404(pk)
    ctx = {"deployment": deployment, "watch_form": WatchCreateForm(deployment=deployment)}
    return render(request, "front/_form_watch.html", ctx)


@login_required
@require_POST
def deployment_check(request, pk):
    """Send a health check of the deployment to its host's worker."""
    deployment = _deployment_or_404(pk)
    try:
        fleet_services.deployment_check_enqueue(deployment=deployment, trigger="manual")
    except ValidationError:
        messages.error(request, "This deployment has no endpoint URL to check; edit it first.")
    except OperationalError as exc:
        messages.error(request, f"Could not reach the broker to enqueue the health check: {exc}")
    else:
        messages.success(request, f"Health check queued on {deployment.host.queue_name}.")
    return redirect(f"{deployment.get_absolute_url()}#health")


def _run_start(request, pk, form_class, page_form, what):
    """Start a run of the deployment from the form of class form_class (run_start), to its
    page; the deployment page again, the form as `page_form`, with the refusal on its field."""
    deployment = _deployment_or_404(pk)
    form = form_class(request.POST, deployment=deployment)
    if not form.is_valid():
        return _deployment_page(request, deployment, status=400, **{page_form: form})
    try:
        run, _ = run_services.run_start(
            deployment=deployment, parameters=form.parameters(), label=form.cleaned_data["label"]
        )
    except ValidationError as exc:
        # what the service checks beyond the form: the endpoint against the allow-list
        form.add_parameter_errors(exc)
        return _deployment_page(request, deployment, status=400, **{page_form: form})
    messages.success(request, f"{what} queued on {deployment.host.queue_name}.")
    return redirect("run-detail", uuid=run.uuid)


@login_required
@require_POST
def sweep_start(request, pk):
    return _run_start(request, pk, SweepForm, "sweep_form", "Sweep")


@login_required
@require_POST
def capacity_start(request, pk):
    """Start a capacity search of the deployment (kind "capacity" through run_start)."""
    return _run_start(request, pk, CapacityForm, "capacity_form", "Capacity search")


@login_required
@require_POST
def watch_create(request, pk):
    """A sweep watch of the deployment (watches.services.watch_create), to its page; the
    deployment page again with the refusal on its field."""
    deployment = _deployment_or_404(pk)
    form = WatchCreateForm(request.POST, deployment=deployment)
    if not form.is_valid():
        return _deployment_page(request, deployment, watch_form=form, status=400)
    try:
        watch = watch_services.watch_create(
            deployment=deployment,
            name=form.cleaned_data["name"],
            parameters=form.parameters(),
            bisect_on_regression=form.cleaned_data["bisect_on_regression"],
            channels=form.cleaned_data["channels"],
            **form.schedule_kwargs(),
        )
    except ValidationError as exc:
        form.add_service_errors(exc)
        return _deployment_page(request, deployment, watch_form=form, status=400)
    messages.success(request, f"Watch {watch.name} created: {watch.schedule_label()}.")
    return redirect(watch.get_absolute_url())


@login_required
@require_POST
def result_upload(request, pk):
    """Import a benchmark result file as a finished run of the deployment (the API's service)."""
    deployment = _deployment_or_404(pk)
    form = ResultFileForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            run, created = run_services.run_import(
                deployment=deployment,
                fmt=form.cleaned_data["format"],
                text=form.text,
                label=form.cleaned_data["label"],
                file_name=upload.name,
                provenance=f"uploaded {upload.name} on the deployment page",
                accept_mismatch=form.cleaned_data["accept_mismatch"],
                requests_text=form.requests_text,
            )
        except ResultFileError as exc:
            for problem in exc.problems:
                form.add_error("file", problem)
        except ResultFileMismatch as exc:
            form.add_error(
                "accept_mismatch",
                f"Not imported: {exc}. Choose the file again and tick this box to import it "
                "all the same.",
            )
        else:
            if created:
                messages.success(request, f"Imported {upload.name}: {run.levels.count()} levels.")
            else:
                messages.info(request, f"{upload.name} was imported before: here is that run.")
            return redirect("run-detail", uuid=run.uuid)
    return _deployment_page(request, deployment, upload_form=form, status=400)


@login_required
def sweep_estimate(request, pk):
    """The sweep form's estimated duration for the load in the query, as JSON {"text"}."""
    deployment = _deployment_or_404(pk)
    return JsonResponse({"text": SweepForm(request.GET, deployment=deployment).estimate()})


@login_required
def capacity_estimate_json(request, pk):
    """The capacity form's estimated duration for the search in the query, as JSON {"text"}."""
    deployment = _deployment_or_404(pk)
    form = CapacityForm(request.GET, deployment=deployment)
    return JsonResponse({"text": capacity_estimate(form)})


@login_required
@require_POST
def tune_start(request, pk):
    deployment = _deployment_or_404(pk)
    form = TuneForm(request.POST, deployment=deployment)
    if not form.is_valid():
        return _deployment_page(request, deployment, tune_form=form, status=400)
    try:
        tuning, _ = kernel_services.tuning_start(
            deployment=deployment,
            dtype=form.cleaned_data["dtype"],
            batch_sizes=form.cleaned_data["batch_sizes"],
            engine=form.cleaned_data["kernel"],
            force=form.cleaned_data.get("tune_anyway", False),
            routing=form.cleaned_data["routing"],
            also_under=form.cleaned_data["also_under"],
        )
    except ValidationError as exc:
        form.add_refusal(exc)
        return _deployment_page(request, deployment, tune_form=form, status=400)
    messages.success(request, f"Kernel tune queued on {deployment.host.queue_name}.")
    return redirect("tuning-detail", uuid=tuning.uuid)
