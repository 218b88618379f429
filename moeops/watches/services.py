"""Writes to watches: create and change them (their beat schedule with them), fire one (a sweep
through the runs service, or why not), judge a finished watch run against its baseline, mark a
baseline, and raise and deliver alerts.

`watch_run_finished(run)` is the one entry point a finished sweep calls."""

import json
import logging
import smtplib
from urllib.parse import urlencode

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q
from django.dispatch import Signal
from django.urls import reverse
from django.utils import timezone
from django_celery_beat import validators as cron_validators
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from domain.capacity import capacity_range
from domain.intervals import FALSE_ALARM, compare_rounds, with_interval
from moeops.engines.models import EngineAction
from moeops.fleet.endpoints import webhook_refusal
from moeops.jobs import ACTION_IN_FLIGHT
from moeops.kernels.models import TuningRun
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from moeops.runs.profiles import runs_step_growth
from moeops.watches import factors
from moeops.watches.models import (
    BISECTION_OPEN,
    DEFAULT_ROUNDS,
    Alert,
    AlertAttempt,
    AlertChannel,
    Bisection,
    Watch,
    WatchRun,
)

log = logging.getLogger(__name__)

FIRE_TASK = "moeops.watches.tasks.fire_watch"
# Sent once the transaction that made them commits: a firing that waits for its host (kwargs:
# the fire task's), and each alert raised (alert_id). The web side's tasks
# (moeops.watches.tasks, which call this module) enqueue on them.
watch_waiting = Signal()
alert_raised = Signal()
# The five fields of a cron expression, in order, with the validator of each.
CRON_FIELDS = (
    ("minute", cron_validators.minute_validator),
    ("hour", cron_validators.hour_validator),
    ("day_of_month", cron_validators.day_of_month_validator),
    ("month_of_year", cron_validators.month_of_year_validator),
    ("day_of_week", cron_validators.day_of_week_validator),
)
MAX_EVERY_HOURS = 24 * 31
# The most changes an alert names; the compare page has them all.
ALERT_CHANGES_SHOWN = 8
ALERT_ANSWER_CHARS = 500


# -- schedules -------------------------------------------------------------------------------


def cron_problem(expression):
    """Why `expression` is not a five-field cron expression ("0 3 * * 1-5"), or ""."""
    parts = expression.split()
    if len(parts) != 5:
        return (
            f"{expression!r} is not a cron expression: it needs five fields (minute hour "
            f"day-of-month month day-of-week), it has {len(parts)}"
        )
    for (field, validate), value in zip(CRON_FIELDS, parts, strict=True):
        try:
            validate(value)
        except ValidationError as exc:
            words = field.replace("_", " ")
            return f"{expression!r}: the {words} field {value!r} does not parse ({exc.messages[0]})"
    return ""


def _schedule(*, cron=None, every_hours=None):
    """{"crontab": …} or {"interval": …}: the beat schedule rows for one of the two (exactly
    one given); ValidationError naming schedule.cron or schedule.every_hours."""
    if (cron is None) == (every_hours is None):
        raise ValidationError({"schedule": "give either cron or every_hours"})
    if cron is not None:
        problem = cron_problem(cron)
        if problem:
            raise ValidationError({"schedule.cron": problem})
        fields = dict(zip((name for name, _ in CRON_FIELDS), cron.split(), strict=True))
        crontab, _ = CrontabSchedule.objects.get_or_create(**fields, timezone="UTC")
        return {"crontab": crontab, "interval": None}
    if isinstance(every_hours, bool) or not isinstance(every_hours, int):
        raise ValidationError({"schedule.every_hours": "a whole number of hours"})
    if not 1 <= every_hours <= MAX_EVERY_HOURS:
        raise ValidationError(
            {"schedule.every_hours": f"between 1 and {MAX_EVERY_HOURS} hours, got {every_hours}"}
        )
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_hours, period=IntervalSchedule.HOURS
    )
    return {"crontab": None, "interval": interval}


def check_window(window_start, window_end):
    if (window_start is None) != (window_end is None):
        raise ValidationError({"window_end": "a quiet window needs both its start and its end"})
    if window_start is not None and window_start == window_end:
        raise ValidationError({"window_end": "a quiet window's end must differ from its start"})


def watch_load(deployment, kind, parameters, slo_profile=None):
    """The watch's load checked as the runs service checks a sweep's or a capacity search's
    (ValidationError naming the parameter), rounds DEFAULT_ROUNDS unless given; no seed
    (each run draws its own, moeops.runs.services.RUN_OWN_PARAMETERS)."""
    if not isinstance(parameters, dict):
        raise ValidationError({"parameters": "an object of load parameters"})
    if "seed" in parameters:
        raise ValidationError(
            {
                "parameters.seed": "a watch's runs each draw prompts of their own: one seed "
                "would send the same prompts every time, and the engine's prefix cache would "
                "serve them warm"
            }
        )
    load = {"rounds": DEFAULT_ROUNDS, **parameters}
    run_services.sweep_parameters(
        deployment=deployment,
        load=run_load(kind, load, slo_profile or deployment.default_slo_profile),
    )
    return load


def run_load(kind, load, slo_profile):
    """What a firing asks the runs service for: the watch's load, as a capacity search against
    its SLO profile for a capacity watch."""
    # a seed stored before watches refused one is dropped: each firing draws prompts of its own
    load = run_services.repeated_load(load)
    if kind != "capacity":
        return load
    profile = {"slo_profile": str(slo_profile.pk)} if slo_profile is not None else {}
    return {**load, "kind": "capacity", **profile}


@transaction.atomic
def watch_create(
    *,
    deployment,
    name,
    parameters,
    kind="sweep",
    slo_profile=None,
    cron=None,
    every_hours=None,
    window_start=None,
    window_end=None,
    enabled=True,
    bisect_on_regression=False,
    channels=(),
):
    """A watch and its beat schedule (cron, UTC, or every N hours). ValidationError naming the
    field for a load the runs service refuses, a cron that does not parse, a half window or a
    name the deployment already has. bisect_on_regression: a regression of a managed deployment
    starts finding its cause (moeops.watches.bisection). channels: the AlertChannels its alerts
    go to (none: the deployment's, watch_channels)."""
    channels = check_watch_channels(deployment, channels)
    if not name or not name.strip():
        raise ValidationError({"name": "a watch needs a name"})
    if Watch.objects.filter(deployment=deployment, name=name).exists():
        raise ValidationError({"name": f"deployment {deployment.name!r} has a watch {name!r}"})
    if kind == "capacity" and slo_profile is None:
        raise ValidationError({"slo_profile": "a capacity watch needs an SLO profile"})
    load = watch_load(deployment, kind, parameters, slo_profile)
    check_window(window_start, window_end)
    schedule = _schedule(cron=cron, every_hours=every_hours)
    watch = Watch.objects.create(
        deployment=deployment,
        name=name,
        kind=kind,
        parameters=load,
        slo_profile=slo_profile or deployment.default_slo_profile,
        window_start=window_start,
        window_end=window_end,
        enabled=enabled,
        bisect_on_regression=bisect_on_regression,
    )
    watch.periodic_task = PeriodicTask.objects.create(
        name=f"watch {watch.pk}: {deployment.name} / {name}"[:200],
        task=FIRE_TASK,
        kwargs=json.dumps({"watch_id": watch.pk}),
        queue="web",
        enabled=enabled,
        **schedule,
    )
    watch.save(update_fields=["periodic_task"])
    watch.channels.set(channels)
    return watch


def check_watch_channels(deployment, channels):
    """The channels as a list; ValidationError on "channels" for one that takes another
    deployment's alerts only."""
    channels = list(channels)
    for channel in channels:
        if channel.deployment_id is not None and channel.deployment_id != deployment.pk:
            only = f"{channel.deployment.name}'s alerts only"
            raise ValidationError({"channels": f"channel {channel.name!r} takes {only}"})
    return channels


@transaction.atomic
def watch_update(*, watch, cron=None, every_hours=None, channels=None, **fields):
    """Change a watch: its name, load, profile, window, enabled, channels, and (one of cron and
    every_hours) its schedule. Same refusals as watch_create."""
    if channels is not None:
        watch.channels.set(check_watch_channels(watch.deployment, channels))
    if "parameters" in fields:
        profile = fields.get("slo_profile", watch.slo_profile)
        fields["parameters"] = watch_load(
            watch.deployment, watch.kind, fields["parameters"], profile
        )
    name = fields.get("name")
    if name is not None:
        taken = Watch.objects.filter(deployment=watch.deployment, name=name)
        if not name.strip() or taken.exclude(pk=watch.pk).exists():
            raise ValidationError({"name": f"{name!r} is empty or taken on this deployment"})
    check_window(
        fields.get("window_start", watch.window_start), fields.get("window_end", watch.window_end)
    )
    for key, value in fields.items():
        setattr(watch, key, value)
    watch.save()
    task = watch.periodic_task
    if task is not None:
        if cron is not None or every_hours is not None:
            for key, value in _schedule(cron=cron, every_hours=every_hours).items():
                setattr(task, key, value)
        task.enabled = watch.enabled
        task.save()
    return watch


@transaction.atomic
def watch_delete(*, watch):
    if watch.periodic_task is not None:
        watch.periodic_task.delete()
    watch.delete()


# -- firing ----------------------------------------------------------------------------------


def host_holder(deployment):
    """What holds the deployment's host now, in words ("sweep run 1a2b3c4d is running on host
    h200"), or "": a sweep, tune or engine action of any deployment on the host."""
    host = deployment.host
    sweep = (
        SweepRun.objects.filter(deployment__host=host, status__in=("queued", "running"))
        .order_by("created")
        .first()
    )
    if sweep is not None:
        return f"sweep {sweep.display_label()} is {sweep.status} on host {host.name}"
    action = EngineAction.objects.filter(deployment__host=host, status__in=ACTION_IN_FLIGHT).first()
    if action is not None:
        what = f"engine action {action.pk} ({action.get_kind_display()})"
        return f"{what} is {action.status} on host {host.name}"
    tune = TuningRun.objects.filter(host=host, status__in=("queued", "running")).first()
    if tune is not None:
        return f"kernel tune {tune.pk} is {tune.status} on host {host.name}"
    # between its steps no action is in flight, yet the engine is not the watch's to measure
    bisection = Bisection.objects.filter(deployment__host=host, status__in=BISECTION_OPEN).first()
    if bisection is not None:
        what = bisection.get_status_display().lower()
        name = bisection.deployment.name
        return f"bisection {bisection.pk} of {name} is {what} on host {host.name}"
    return ""


def engine_down(deployment):
    """Why the deployment's engine is down by its latest health check, or "" when that check
    found it up (or there is none: the sweep itself will say)."""
    check = deployment.health_checks.order_by("-checked_at", "-id").first()
    if check is None or check.up:
        return ""
    detail = f": {check.detail}" if check.detail else ""
    at = f"{check.checked_at:%Y-%m-%d %H:%M} UTC"
    return f"the engine was down at its latest health check ({at}{detail})"


def watch_run_end(watch_run, status, reason):
    """End a watch run that did not get to measure: skipped or failed, with its reason."""
    watch_run.status = status
    watch_run.reason = reason
    watch_run.finished_at = timezone.now()
    watch_run.save(update_fields=["status", "reason", "finished_at"])
    return watch_run


def watch_fire(*, watch, watch_run=None, now=None, asked=False):
    """Fire the watch once: a WatchRun that started a sweep through the runs service (running),
    waits for the host (waiting, with what holds it: fire again later with it), or was skipped
    (outside the quiet window, the engine down, the host busy past MOEOPS_WATCH_WAIT_LIMIT_S) or
    failed (the runs service refused the sweep), each with its reason. asked: a person fired it
    ("Run now"), who chose the moment: the quiet window does not hold it back."""
    now = now or timezone.now()
    if watch_run is None:
        watch_run = WatchRun.objects.create(watch=watch, status="waiting")
    deployment = watch.deployment
    if not asked and not watch.in_window(now):
        return watch_run_end(
            watch_run, "skipped", f"outside its quiet window ({watch.window_label()})"
        )
    down = engine_down(deployment)
    if down:
        return watch_run_end(watch_run, "skipped", down)
    with transaction.atomic():
        # one firing at a time per host: two watches must not both find it free
        type(deployment.host).objects.select_for_update().get(pk=deployment.host_id)
        holder = host_holder(deployment)
        if holder:
            waited = (now - watch_run.fired_at).total_seconds()
            if waited >= settings.MOEOPS_WATCH_WAIT_LIMIT_S:
                return watch_run_end(
                    watch_run,
                    "skipped",
                    f"the host stayed busy for {waited / 3600:.1f} h: {holder}",
                )
            watch_run.reason = f"waits: {holder}"
            watch_run.save(update_fields=["reason"])
            return watch_run
        try:
            run, _ = run_services.run_start(
                deployment=deployment,
                parameters=run_load(watch.kind, watch.parameters, watch.slo_profile),
                label=f"watch {watch.name} {now:%Y-%m-%d %H:%M}",
            )
        except ValidationError as exc:
            reason = "; ".join(exc.messages)
            watch_run_end(watch_run, "failed", f"the sweep could not start: {reason}")
            _after_failure(watch_run)
            return watch_run
        watch_run.run = run
        watch_run.status = "running"
        watch_run.reason = ""
        watch_run.save(update_fields=["run", "status", "reason"])
    return watch_run


def watch_run_now(*, watch):
    """ "Run now": fire the watch at once, whatever its schedule, window or enabled flag; a
    firing that waits for its host is fired again by the beat task's retry (every
    MOEOPS_WATCH_WAIT_S). Returns the WatchRun."""
    watch_run = watch_fire(watch=watch, asked=True)
    if watch_run.status == "waiting":
        kwargs = {"watch_id": watch.pk, "watch_run_id": watch_run.pk, "asked": True}
        transaction.on_commit(lambda: watch_waiting.send(sender=Watch, kwargs=kwargs), robust=True)
    return watch_run


# -- judging ---------------------------------------------------------------------------------


def watched_figure(run):
    """(figure, [low, high] or None, why there is none): a sweep's peak output tok/s with the
    95 % interval of its rounds; a capacity search's capacity with the range it lies in
    (domain.capacity.capacity_range: conservative answer to the medians' bracket top)."""
    if run.is_capacity_search:
        answer = run.capacity or {}
        if answer.get("load") is None:
            return None, None, "the capacity search found no load within the SLO"
        return answer["load"], list(capacity_range(answer)), ""
    peak = run.peak_level()
    if peak is None:
        return None, None, "the sweep measured no level"
    return peak.output_throughput, list(peak.interval("output_throughput") or []) or None, ""


def _baseline_for(watch_run):
    """The finished WatchRun this one is compared with: the watch's marked baseline, else its
    previous finished run; None for the first."""
    watch = watch_run.watch
    if watch.baseline_id and watch.baseline_id != watch_run.pk and watch.baseline.run_id:
        return watch.baseline
    return (
        watch.watch_runs.filter(
            status="finished", run__isnull=False, fired_at__lte=watch_run.fired_at
        )
        .exclude(pk=watch_run.pk)
        .order_by("-fired_at", "-id")
        .first()
    )


def watched_rounds(run):
    """The watched figure's rounds: the peak level's output tok/s in each of its rounds; None
    for a capacity search, whose answer is a range, not rounds (prefetch levels__rounds to
    read them without a query per level)."""
    if run is None or run.is_capacity_search:
        return None
    peak = run.peak_level()
    if peak is None:
        return None
    return [r.figures.get("output_throughput") for r in peak.stored_rounds()]


def verdict(now, now_interval, before, before_interval, rounds=None):
    """How a figure stands against its baseline's: "regressed" or "improved" beyond the
    noise, "within" it, "unknown" (single rounds, or too few for the test).

    rounds: (now's, before's) rounds of a sweep's figure (watched_rounds), judged by
    domain.intervals.compare_rounds at its stated false-alarm rate; without them (a capacity
    search's range), the ranges decide: apart is a change, overlapping within."""
    if rounds is not None and None not in rounds:
        judged = compare_rounds(*rounds).verdict
        return {"lower": "regressed", "higher": "improved"}.get(judged, judged)
    if now_interval is None or before_interval is None:
        return "unknown"
    if now_interval[0] <= before_interval[1] and before_interval[0] <= now_interval[1]:
        return "within"
    return "regressed" if now < before else "improved"


def factor_changes(a, b):
    """What changed between snapshots a and b, one phrase per factor of the measurement (a
    launch argument with what the engine reported of it, engine version, kernel config,
    topology, driver, load …); how the run was taken (moeops version, client host) left out."""
    return factors.phrases(a, b)


def on_run_finished(run):
    """A finished sweep run that a watch started is judged (a finished handler, jobs.Step.JUDGE,
    after the analysis); returns the WatchRun's id, None for a run no watch started."""
    watch_run = watch_run_finished(run)
    return watch_run.pk if watch_run is not None else None


@transaction.atomic
def watch_run_finished(run):
    """The entry point for a finished sweep: when `run` is a watch's, judge it against the
    watch's baseline and raise the alerts it calls for. Returns the WatchRun or None; a run
    judged already (the analysis delivered twice) is not judged again."""
    watch_run = (
        # locked: two deliveries of the same analysis must not both alert
        WatchRun.objects.select_for_update(of=("self",))
        .filter(run=run, status="running")
        .select_related("watch__deployment")
        .first()
    )
    if watch_run is None:
        return None
    if run.status != "succeeded":
        watch_run_end(
            watch_run, "failed", f"the sweep {run.status}" + (f": {run.error}" if run.error else "")
        )
        _after_failure(watch_run)
        return watch_run
    figure, interval, missing = watched_figure(run)
    if figure is None:
        watch_run_end(watch_run, "failed", missing)
        _after_failure(watch_run)
        return watch_run
    watch_run.figure, watch_run.interval = figure, interval
    baseline = _baseline_for(watch_run)
    previous = previous_finished(watch_run)
    if baseline is None:
        watch_run.verdict = "first"
    else:
        watch_run.compared_with = baseline.run
        watch_run.baseline_figure = baseline.figure
        watch_run.baseline_interval = baseline.interval
        watch_run.verdict = verdict(
            watch_run.figure,
            watch_run.interval,
            baseline.figure,
            baseline.interval,
            rounds=(watched_rounds(run), watched_rounds(baseline.run)),
        )
        watch_run.changes = factor_changes(baseline.run.snapshot, run.snapshot)
    watch_run.status = "finished"
    watch_run.finished_at = timezone.now()
    watch_run.save()
    was_regressed = previous is not None and previous.verdict == "regressed"
    if watch_run.verdict == "regressed" and not was_regressed:
        alerts_raise(watch_run=watch_run, kind="regression")
    elif was_regressed and watch_run.verdict in ("within", "improved"):
        alerts_raise(watch_run=watch_run, kind="recovery")
    return watch_run


def previous_finished(watch_run):
    return (
        watch_run.watch.watch_runs.filter(status="finished", fired_at__lte=watch_run.fired_at)
        .exclude(pk=watch_run.pk)
        .order_by("-fired_at", "-id")
        .first()
    )


def _after_failure(watch_run):
    """A failing alert when this failure is the watch's second in a row (skips not counted)."""
    concluded = list(
        watch_run.watch.watch_runs.filter(status__in=("finished", "failed"))
        .order_by("-fired_at", "-id")
        .values_list("status", flat=True)[:3]
    )
    if concluded[:2] == ["failed", "failed"] and concluded[2:3] != ["failed"]:
        alerts_raise(watch_run=watch_run, kind="failing")


def watch_mark_baseline(*, watch_run, user):
    """Mark a finished watch run the watch's baseline; ValidationError when it has no figure."""
    if watch_run.status != "finished" or watch_run.run_id is None or watch_run.figure is None:
        raise ValidationError(
            {"watch_run": "only a finished watch run with a figure can be the baseline"}
        )
    watch = watch_run.watch
    watch.baseline = watch_run
    watch.baseline_marked_by = getattr(user, "username", "") or "API"
    watch.baseline_marked_at = timezone.now()
    watch.save(update_fields=["baseline", "baseline_marked_by", "baseline_marked_at", "updated"])
    return watch


# -- alerts ----------------------------------------------------------------------------------


def compare_path(a, b):
    """The compare page of runs a and b (SweepRuns), a path."""
    query = urlencode([("run", str(a.uuid)), ("run", str(b.uuid)), ("group", "run")])
    return f"{reverse('compare')}?{query}"


def compare_link(a, b):
    """The compare page of runs a and b as a full URL (SITE_ROOT), for messages."""
    return settings.SITE_ROOT.rstrip("/") + compare_path(a, b)


def alert_message(watch_run, kind):
    """(subject, text) of an alert: the deployment, the figure and how far it moved with both
    intervals, what changed between the two runs' snapshots, and the compare page."""
    watch = watch_run.watch
    where = f"{watch.deployment.name} (watch {watch.name})"
    if kind == "failing":
        subject = f"Watch failing: {where}"
        return subject, f"{subject}: failed twice in a row. Last: {watch_run.reason}"
    now = with_interval(watch_run.figure, watch_run.interval)
    before = with_interval(watch_run.baseline_figure, watch_run.baseline_interval)
    if kind == "regression":
        subject = f"Regression: {where}"
        moved = f"{watch.figure_name()} fell {watch_run.drop:.0%}, from {before} to {now}"
        rounds = (watched_rounds(watch_run.run), watched_rounds(watch_run.compared_with))
        if None in rounds:
            moved += " (their ranges do not overlap)"
        else:
            judged = compare_rounds(*rounds)
            moved += (
                f" ({judged.change()} of the rounds' geometric means; a permutation test at "
                f"{FALSE_ALARM * 100:.0f} % false alarms, p = {judged.p_value:.3f})"
            )
        inside = watch_run.compared_with and runs_step_growth(
            watch_run.compared_with, watch_run.run
        )
        if inside:
            moved += f"; inside the step, {inside}"
    else:
        subject = f"Recovered: {where}"
        moved = (
            f"{watch.figure_name()} is {now} against {before} before: no longer below it beyond "
            "the noise"
        )
    if watch_run.changes:
        shown = watch_run.changes[:ALERT_CHANGES_SHOWN]
        more = len(watch_run.changes) - len(shown)
        changed = "What changed: " + "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")
    else:
        changed = "Nothing on record changed between the two runs' snapshots"
    link = compare_link(watch_run.compared_with, watch_run.run)
    return subject, f"{subject}: {moved}. {changed}. Compare: {link}"


def channels_for(deployment):
    """The enabled channels that take the deployment's alerts: its own and the global ones."""
    return AlertChannel.objects.filter(enabled=True).filter(
        Q(deployment=deployment) | Q(deployment__isnull=True)
    )


def watch_channels(watch):
    """The enabled channels that take the watch's alerts: those chosen on it, else (none
    chosen) its deployment's (channels_for)."""
    chosen = watch.channels.all()
    if chosen.exists():
        return chosen.filter(enabled=True)
    return channels_for(watch.deployment)


def alerts_raise(*, watch_run, kind):
    """One Alert per channel of the deployment, each delivered by its own task once the
    current transaction commits. Returns the alerts."""
    subject, text = alert_message(watch_run, kind)
    alerts = [
        Alert.objects.create(
            watch_run=watch_run, channel=channel, kind=kind, subject=subject, text=text
        )
        for channel in watch_channels(watch_run.watch)
    ]
    for alert in alerts:
        alert_id = alert.pk
        # robust: a broker that is down leaves the alert pending on the page, not a failed request
        transaction.on_commit(
            lambda alert_id=alert_id: alert_raised.send(sender=Alert, alert_id=alert_id),
            robust=True,
        )
    return alerts


def _webhook_body(alert):
    watch_run = alert.watch_run
    return {
        "text": alert.text,
        "kind": alert.kind,
        "deployment": watch_run.watch.deployment.name,
        "watch": watch_run.watch.name,
        "figure": watch_run.figure,
        "interval": watch_run.interval,
        "baseline_figure": watch_run.baseline_figure,
        "baseline_interval": watch_run.baseline_interval,
        "changes": watch_run.changes,
    }


def alert_attempt(*, alert):
    """Try to deliver the alert once and record the attempt with the answer; returns it. A
    webhook off the allow-list is not sent."""
    channel = alert.channel
    number = alert.attempts.count() + 1
    answer = {"ok": False, "status_code": None, "answer": "", "error": ""}
    if channel.kind == "webhook":
        refusal = webhook_refusal(channel.url)
        if refusal:
            answer["error"] = f"not sent: {refusal}"
        else:
            try:
                response = httpx.post(channel.url, json=_webhook_body(alert), timeout=10)
            except httpx.HTTPError as exc:
                answer["error"] = f"the webhook's host did not answer: {exc}"
            else:
                answer["status_code"] = response.status_code
                answer["answer"] = response.text[:ALERT_ANSWER_CHARS]
                answer["ok"] = response.is_success
                if not response.is_success:
                    answer["error"] = f"the webhook answered HTTP {response.status_code}"
    else:
        try:
            send_mail(alert.subject, alert.text, settings.DEFAULT_FROM_EMAIL, channel.recipients)
            answer["ok"] = True
        except Exception as exc:  # smtplib's and the socket's errors alike: recorded, not raised
            answer["error"] = (
                f"the SMTP server at {settings.EMAIL_HOST}:{settings.EMAIL_PORT} did not take "
                f"the mail: {_smtp_words(exc)}"
            )
    attempt = AlertAttempt.objects.create(alert=alert, number=number, **answer)
    if attempt.ok:
        alert.status, alert.error, alert.delivered_at = "delivered", "", timezone.now()
    else:
        alert.error = attempt.error
    alert.save(update_fields=["status", "error", "delivered_at"])
    return attempt


def _smtp_words(exc):
    """An SMTP failure in words: "it refused ops@example.com (550 5.1.1 mailbox unavailable)"."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        refused = ", ".join(
            f"{address} ({code} {message.decode(errors='replace')})"
            for address, (code, message) in exc.recipients.items()
        )
        return f"it refused {refused}"
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"it answered {exc.smtp_code} {exc.smtp_error.decode(errors='replace')}"
    return str(exc) or type(exc).__name__


def alert_give_up(*, alert):
    """The alert stays undelivered, with its last error, on the pages."""
    alert.status = "failed"
    alert.save(update_fields=["status"])


# -- channels --------------------------------------------------------------------------------


def check_channel(kind, url, recipients):
    if kind == "webhook":
        refusal = webhook_refusal(url or "")
        if refusal:
            raise ValidationError({"url": refusal})
    elif kind == "email":
        if not recipients:
            raise ValidationError({"recipients": "an email channel needs at least one address"})
        for address in recipients:
            try:
                validate_email(address)
            except ValidationError:
                raise ValidationError(
                    {"recipients": f"{address!r} is not an email address"}
                ) from None
    else:
        raise ValidationError({"kind": "webhook or email"})


def channel_create(*, name, kind, url="", recipients=(), deployment=None, enabled=True):
    """An alert channel; ValidationError naming the field for a webhook off
    MOEOPS_WEBHOOK_ALLOWLIST or an address that is none."""
    if AlertChannel.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a channel {name!r} exists"})
    recipients = list(recipients)
    check_channel(kind, url, recipients)
    return AlertChannel.objects.create(
        name=name,
        kind=kind,
        url=url if kind == "webhook" else "",
        recipients=recipients if kind == "email" else [],
        deployment=deployment,
        enabled=enabled,
    )


def channel_update(*, channel, **fields):
    url = fields.get("url", channel.url)
    recipients = list(fields.get("recipients", channel.recipients))
    check_channel(channel.kind, url, recipients)
    for key, value in fields.items():
        setattr(channel, key, value)
    channel.save()
    return channel
