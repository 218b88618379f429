"""A job's life, one for every kind: sweep runs (runs.SweepRun), kernel tunes
(kernels.TuningRun) and engine actions (engines.EngineAction) are each a job on a host's queue.

Here: the statuses and the moves between them, the one compare-and-set status move
(`transition`), sending a job's work once its row is committed (`enqueue`), the rule by which a
job's worker is lost (`worker_lost`), and what runs once a job finishes (`job_finished`, on the
web side's worker). Each app keeps what is its own: its conflict error, its reaper of lost jobs
(`<kind>_fail_stale`), what its worker reports.

This module imports no app: each app adds its finished handlers and its reapers here from its
AppConfig.ready() (`finished_handler_add`, `stale_reaper_add`), so that the apps import it and not
the other way round, and a handler renamed or removed fails as Django starts.
"""

import enum
import logging

from celery.utils.time import get_exponential_backoff_interval
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import OperationalError as DatabaseError
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from domain.jobs import FINISHED_STATUSES
from domain.progress import attempt_of
from domain.queues import BROKER_ANSWER_S
from moeops.celery import app

log = logging.getLogger(__name__)

# A job moves only along these edges; anything else is refused (transition returns False).
JOB_MOVES = {
    "queued": ("running", "failed", "cancelled"),
    "running": ("succeeded", "failed", "cancelled"),
}

# Engine actions: restarting the engine, then re-sweeping it; an action is never cancelled.
ACTION_STATUSES = (
    ("queued", "Queued"),
    ("running", "Restarting the engine"),
    ("sweeping", "Re-sweeping"),
    ("succeeded", "Succeeded"),
    ("failed", "Failed"),
)
ACTION_MOVES = {
    "queued": ("running", "failed"),
    "running": ("sweeping", "succeeded", "failed"),
    "sweeping": ("succeeded", "failed"),
}
ACTION_IN_FLIGHT = ("queued", "running", "sweeping")


class Step(enum.IntEnum):
    """When a finished job's handler runs: the steps in this order, why each comes where it does
    written beside it. Handlers of one step read nothing the others write and run in the order
    they were added (their apps' order in INSTALLED_APPS)."""

    # the job's own record completed: a capacity search ended other than by its worker's last
    # report gets its answer from its levels, which the analysis reads
    RECORD = 1
    # the work the job was part of moves on: a re-sweep ends its engine action and completes its
    # plan item, a plan item's tune starts its action; before the analysis, which proposes an
    # item only where none of its title is left unfinished
    FOLLOW_UP = 2
    # a sweep run is analyzed: findings and plan items
    ANALYZE = 3
    # a watch's sweep is judged against its baseline and alerts go out; it reads nothing the
    # analysis writes, but comes after it so that the runs an alert points at are analyzed
    JUDGE = 4
    # a bisection moves on (its action ended, its step measured again) or a regression starts
    # one: after the judgement, whose verdict it reads
    BISECT = 5


# {model label: [(step, name, handler)]}, filled by the apps' ready(), in the order of their steps
_finished = {}
# {name: reaper}, filled by the apps' ready(), called in the order they were added
_reapers = {}


def _name(function):
    return f"{function.__module__}.{function.__qualname__}"


def finished_handler_add(model, handler, *, step):
    """Call handler(job) with each finished job of model (a Job model) on the web side's worker,
    at step (Step). Called from the app's AppConfig.ready(); adding the same handler again does
    nothing. A handler is told only jobs of its model, may run again (job_finished retries a
    handler on a database error) and must do its work once; what it returns is part of
    job_finished's answer, so it is plain JSON."""
    if not (isinstance(model, type) and issubclass(model, Job)):
        raise ImproperlyConfigured(f"{model!r} is no job model: its handler would never run")
    handlers = _finished.setdefault(model._meta.label_lower, [])
    name = _name(handler)
    for added_step, added_name, added in handlers:
        if added_name == name:
            if added is handler and added_step == step:
                return
            raise ImproperlyConfigured(f"{name} is already a finished handler of {model}")
    handlers.append((Step(step), name, handler))
    handlers.sort(key=lambda entry: entry[0])


def finished_handlers(model):
    """The handlers of model's finished jobs, in the order they run."""
    return [handler for _, _, handler in _finished.get(model._meta.label_lower, ())]


def stale_reaper_add(name, reaper):
    """Call reaper(now=) every minute (fail_stale_jobs), after the reapers added before it; it
    fails the jobs of its kind whose worker is lost and returns how many. name: its kind in
    fail_stale_jobs's answer ("runs", "tunes")."""
    if _reapers.get(name, reaper) is not reaper:
        raise ImproperlyConfigured(f"a reaper named {name!r} is already added")
    _reapers[name] = reaper


def stale_reapers():
    """{name: reaper}, in the order they run."""
    return dict(_reapers)


class Job:
    """What a job's model shares (mixed into it): its `status`, `started_at`, `finished_at`,
    `error` fields and the moves its status makes."""

    MOVES = JOB_MOVES

    @property
    def is_finished(self):
        return self.status in FINISHED_STATUSES

    def can_move_to(self, status):
        return status in self.MOVES.get(self.status, ())


def transition(job, status, **fields):
    """Move job to status, fields written in the same UPDATE, by compare-and-set: the row moves
    only from a status its MOVES lead to status from, so of two writers that move a job from the
    same status one wins. running sets started_at; a finished status sets finished_at and runs
    job_finished once the transaction commits.

    Returns whether it moved. False: the row was in no status that leads there (already there,
    finished, an illegal move, or moved meanwhile by another writer); job.status is then the
    row's as it is now.
    """
    sources = [source for source, targets in job.MOVES.items() if status in targets]
    now = timezone.now()
    changes = {"status": status, **fields}
    if status == "running":
        changes["started_at"] = now
    if status in FINISHED_STATUSES:
        changes["finished_at"] = now
    if type(job).objects.filter(pk=job.pk, status__in=sources).update(**changes) != 1:
        job.refresh_from_db(fields=["status"])
        return False
    for name, value in changes.items():
        setattr(job, name, value)
    if status in FINISHED_STATUSES:
        job_finished_enqueue(job)
    return True


def take_over(job, *, attempt, progress, conflict, what):
    """A new delivery of a running job whose worker is gone takes it over as `attempt`, by
    compare-and-set on the attempt it follows: of two deliveries that found the same worker
    gone, one takes the job and the other gets `conflict` (and then finds the job busy).
    progress: what the job's progress becomes (its heartbeat at least), its attempt set to
    `attempt`; what: the job's name in the messages ("run", "tuning run"). Raises
    ValidationError naming progress without a heartbeat: a job taken over with none would look
    abandoned to the next delivery at once."""
    if not isinstance((progress or {}).get("heartbeat"), int | float):
        raise ValidationError({"progress": "a takeover carries the new worker's heartbeat"})
    with transaction.atomic():
        locked = type(job).objects.select_for_update().get(pk=job.pk)
        follows = attempt_of(locked.progress)
        if locked.status != "running" or follows != attempt - 1:
            job.refresh_from_db()
            raise conflict(
                f"{what} {job.pk} cannot be taken over as attempt {attempt}: it is "
                f"{locked.status}, attempt {follows}"
            )
        progress = {**progress, "attempt": attempt}
        type(job).objects.filter(pk=job.pk).update(progress=progress)
    job.progress = progress
    return job


def progress_update(job, progress, *, conflict, what):
    """Store a job's progress unless it is of an attempt older than the job's: the pushes of a
    delivery that was taken over (a slow worker's, or one left waiting in a spool) raise
    `conflict` instead of moving the job back to their attempt."""
    attempt = (progress or {}).get("attempt")
    # JSON's true equals 1 in Python: refused like any other attempt that is no integer
    if attempt is not None and (isinstance(attempt, bool) or attempt_of(progress) != attempt):
        raise ValidationError({"progress": "attempt must be a positive integer"})
    with transaction.atomic():
        locked = type(job).objects.select_for_update().get(pk=job.pk)
        current = attempt_of(locked.progress)
        if attempt is not None and attempt < current:
            raise conflict(
                f"{what} {job.pk} was taken over as attempt {current}; the progress of attempt "
                f"{attempt} is refused"
            )
        type(job).objects.filter(pk=job.pk).update(progress=progress)
    job.progress = progress


def _fail(job, error):
    transition(job, "failed", error=error)


# How the error of a job whose work never reached the broker begins (never_sent).
UNSENT = "Could not reach the broker to enqueue"


def enqueue(job, send, *, what, fail=_fail):
    """Call send() (which puts the job's work on the broker) once the current transaction
    commits, so that the worker always finds the job's row. A broker that cannot be reached
    ends the job failed with the reason, through fail(job, error), instead of leaving it queued
    forever. what: the work sent, in words ("workers.run_sweep")."""
    model, pk = type(job), job.pk

    def send_committed():
        try:
            send()
        except BrokerError as exc:
            log.warning("could not enqueue %s for %s %s: %s", what, model.__name__, pk, exc)
            reason = str(exc)
            if "timeout" in reason.lower():
                reason = f"it did not answer within {BROKER_ANSWER_S} s ({reason})"
            fail(model.objects.get(pk=pk), f"{UNSENT} {what}: {reason}")

    transaction.on_commit(send_committed)


def never_sent(job):
    """Whether job failed because its work never reached the broker (enqueue), as read from
    the database now."""
    job.refresh_from_db(fields=["status", "error"])
    return job.status == "failed" and job.error.startswith(UNSENT)


def worker_lost(host, now=None):
    """Whether the host's worker has been silent (Host.silent_for) for longer than
    MOEOPS_RUN_STALE_S: the work it was running is lost. A host never heard from has no
    heartbeat to go stale."""
    silent = host.silent_for(now)
    return silent is not None and silent > settings.MOEOPS_RUN_STALE_S


def ago(seconds):
    """ "40 s ago", "7 min ago" (seconds: s, or None when unknown)."""
    if seconds is None:
        return "long ago"
    minutes = seconds / 60
    return f"{seconds:.0f} s ago" if minutes < 2 else f"{minutes:.0f} min ago"


def job_finished_enqueue(job):
    """Run job_finished for a finished job on the web side's worker once the current transaction
    commits."""
    label, pk = job._meta.label_lower, job.pk
    # robust: a broker that is down must not fail the request that finished the job
    transaction.on_commit(lambda: job_finished.delay(label, pk), robust=True)


# Retried up to this many times, each handler that met a database error from where it failed
FINISHED_RETRIES = 5


@app.task(bind=True, max_retries=FINISHED_RETRIES)
def job_finished(self, model_label, pk, answered=None):
    """Call each finished handler of the job's model (finished_handler_add), in their steps'
    order, with the finished job (model_label: "runs.sweeprun", …); returns {handler's dotted
    name: what it returned}, {} for a job that is gone.

    A database briefly locked or unreachable is worth a retry: the task is sent again from the
    handler that failed, with the answers of those before it (answered), which are not called
    again; those after it wait for it, since they may read what it writes."""
    answers = dict(answered or {})
    try:
        job = apps.get_model(model_label).objects.filter(pk=pk).first()
        if job is None:
            return {}
        for _, name, handler in _finished.get(model_label, ()):
            if name not in answers:
                answers[name] = handler(job)
    except DatabaseError as exc:
        done = list(answers)
        log.warning("the finished hook of %s %s, retried after %s: %s", model_label, pk, done, exc)
        # Celery's retry_backoff: 1, 2, 4 … s, at most 10 min, with full jitter
        countdown = get_exponential_backoff_interval(
            factor=1, retries=self.request.retries, maximum=600, full_jitter=True
        )
        raise self.retry(args=(model_label, pk, answers), exc=exc, countdown=countdown) from exc
    return answers


@app.task
def fail_stale_jobs():
    """Fail the jobs of every kind whose worker is lost (stale_reaper_add); returns how many of
    each kind."""
    now = timezone.now()
    return {name: reaper(now=now) for name, reaper in _reapers.items()}
