"""A watch's page: its schedule, timeline, runs with their verdicts, and the alerts it raised
(an undelivered one with its error); a person marks a run the baseline here."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from moeops.front.charts.watches import watch_timeline
from moeops.watches import bisection, services
from moeops.watches.models import Alert, Bisection, Watch, WatchRun

# The watch page lists this many of its newest runs; the timeline draws them too.
WATCH_RUNS_SHOWN = 100


def watch_runs_for_timeline(watches):
    """The newest runs of these watches (newest first; WATCH_RUNS_SHOWN per watch on
    average) with their alerts and attempts prefetched; no query without watches."""
    if not watches:
        return []
    alerts = Alert.objects.select_related("channel").prefetch_related("attempts")
    return list(
        WatchRun.objects.filter(watch__in=watches)
        .select_related("run", "compared_with")
        .prefetch_related(Prefetch("alerts", alerts), "bisections")
        .order_by("-fired_at", "-id")[: WATCH_RUNS_SHOWN * len(watches)]
    )


@login_required
def watch_detail(request, pk):
    watch = get_object_or_404(
        Watch.objects.select_related(
            "deployment", "slo_profile", "periodic_task__crontab", "periodic_task__interval"
        ),
        pk=pk,
    )
    watch_runs = watch_runs_for_timeline([watch])
    for w in watch_runs:
        w.compare_path = w.compared_with and w.run and services.compare_path(w.compared_with, w.run)
    alerts = [alert for w in watch_runs for alert in w.alerts.all()]
    ctx = {
        "nav": "deployments",
        "watch": watch,
        "next_run_at": watch.next_run_at(timezone.now()),
        "watch_runs": watch_runs,
        "alerts": alerts,
        "undelivered": [alert for alert in alerts if alert.status == "failed"],
        "timeline": watch_timeline(
            [w for w in watch_runs if w.status == "finished"], watch.figure_name()
        ),
    }
    return render(request, "front/watch_detail.html", ctx)


@login_required
@require_POST
def watch_run_now(request, pk):
    """ "Run now": the watch fired at once, back to its page with what became of the firing."""
    watch = get_object_or_404(Watch.objects.select_related("deployment__host"), pk=pk)
    watch_run = services.watch_run_now(watch=watch)
    if watch_run.status == "running":
        messages.success(request, f"Watch {watch.name} fired: its run is queued.")
    elif watch_run.status == "waiting":
        messages.info(request, f"Watch {watch.name} fired; it {watch_run.reason}.")
    else:
        messages.error(request, f"Watch {watch.name} did not run: {watch_run.reason}.")
    return redirect(watch.get_absolute_url())


@login_required
@require_POST
def watch_run_baseline(request, pk):
    watch_run = get_object_or_404(WatchRun.objects.select_related("watch"), pk=pk)
    try:
        services.watch_mark_baseline(watch_run=watch_run, user=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    return redirect(watch_run.watch.get_absolute_url())


@login_required
@require_POST
def watch_run_bisect(request, pk):
    """ "Find the cause" of a regressed watch run: to the bisection's page, or back to the
    watch's with the sentence saying why it cannot start."""
    watch_run = get_object_or_404(
        WatchRun.objects.select_related("watch__deployment__host", "run", "compared_with"), pk=pk
    )
    try:
        found = bisection.bisection_start(watch_run=watch_run, user=request.user, source="page")
    except (ValidationError, PermissionDenied) as exc:
        words = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, f"Cannot find the cause: {words}")
        return redirect(watch_run.watch.get_absolute_url())
    return redirect(found.get_absolute_url())


@login_required
def bisection_detail(request, pk):
    found = get_object_or_404(
        Bisection.objects.select_related(
            "watch_run__watch", "watch_run__run", "watch_run__compared_with", "deployment",
            "start_recipe", "baseline_recipe", "restore_action",
        ),
        pk=pk,
    )  # fmt: skip
    steps = list(found.steps.select_related("action__after_run", "action__before_run", "run"))
    for step in steps:
        step.tried = found.phrases(step.keys)
    ctx = {
        "nav": "deployments",
        "bisection": found,
        "watch_run": found.watch_run,
        "steps": steps,
        "cause": found.phrases(found.cause),
        # a flag found to be the cause alone is put back by the engine panel's restart with
        # arguments (a cause of several factors together is put back by a person's recipe)
        "fix": next(
            (
                f
                for f in found.factors
                if [f["key"]] == found.cause and f["kind"] == "flag" and f["a"] not in (None, "")
            ),
            None,
        ),
        "compare_path": services.compare_path(found.watch_run.compared_with, found.watch_run.run)
        if found.watch_run.compared_with_id and found.watch_run.run_id
        else "",
    }
    return render(request, "front/bisection_detail.html", ctx)
