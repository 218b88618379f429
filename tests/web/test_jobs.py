"""One job lifecycle (moeops.jobs): moves by compare-and-set, work sent once committed, the
job-finished hook, the staleness rule (Host.silent_for) and the reaper task over every kind."""

import json
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from moeops import jobs
from moeops.engines import services as engines_services
from moeops.engines.models import EngineAction, LaunchRecipe
from moeops.insights import services as insights_services
from moeops.kernels import services as kernels_services
from moeops.kernels.models import TuningRun
from moeops.runs import services as runs_services
from moeops.runs.models import SweepRun
from moeops.watches import bisection
from moeops.watches import services as watches_services
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def _tune(world, **fields):
    return TuningRun.objects.create(host=world.host, E=8, N=64, hidden_size=64, topk=2, **fields)


# -- transition -----------------------------------------------------------------------------------


def test_a_move_along_an_edge_stamps_its_start_and_its_end(world):
    tune = _tune(world)

    assert jobs.transition(tune, "running") is True
    started = TuningRun.objects.get(pk=tune.pk)
    assert (started.status, started.finished_at) == ("running", None)
    assert started.started_at is not None and started.started_at == tune.started_at

    assert jobs.transition(tune, "failed", error="OOM") is True
    tune.refresh_from_db()
    assert (tune.status, tune.error) == ("failed", "OOM")
    assert tune.finished_at >= tune.started_at


@pytest.mark.parametrize(
    ("status", "to"),
    [("succeeded", "running"), ("queued", "succeeded"), ("failed", "cancelled")],
)
def test_an_illegal_move_is_refused_and_changes_nothing(world, status, to):
    run = world.run(status=status)

    assert jobs.transition(run, to, error="written with the move") is False

    stored = SweepRun.objects.get(pk=run.pk)
    assert (stored.status, stored.error, stored.finished_at) == (status, "", None)
    assert run.status == status


def test_of_two_moves_from_the_same_status_only_one_wins(world):
    run = world.run(status="queued")
    first, second = SweepRun.objects.get(pk=run.pk), SweepRun.objects.get(pk=run.pk)

    assert jobs.transition(first, "running") is True
    # the second still reads queued: the row no longer is, and the move is refused
    assert jobs.transition(second, "running") is False
    assert second.status == "running"
    assert SweepRun.objects.filter(pk=run.pk, status="running").count() == 1


def test_an_engine_action_moves_along_its_own_edges(world):
    recipe = LaunchRecipe.objects.create(deployment=world.deployment, version=1, argv=["vllm"])
    action = EngineAction.objects.create(deployment=world.deployment, kind="restart", recipe=recipe)

    # a sweep run's edge, not an action's: an action is never cancelled
    assert jobs.transition(action, "cancelled") is False
    assert jobs.transition(action, "running") is True
    assert jobs.transition(action, "sweeping") is True
    assert action.can_move_to("succeeded") and not action.can_move_to("queued")


# -- enqueue --------------------------------------------------------------------------------------


def test_work_is_sent_once_committed_and_a_broker_out_of_reach_fails_the_job(
    world, django_capture_on_commit_callbacks
):
    tune = _tune(world)
    sent = []

    def send():
        sent.append(tune.pk)
        raise BrokerError("Error 111 connecting to 127.0.0.1:6399")

    with django_capture_on_commit_callbacks(execute=True):
        jobs.enqueue(tune, send, what="workers.tune_kernel")
        assert sent == []

    tune.refresh_from_db()
    assert sent == [tune.pk] and tune.status == "failed"
    assert tune.error == (
        "Could not reach the broker to enqueue workers.tune_kernel: "
        "Error 111 connecting to 127.0.0.1:6399"
    )


# -- the job-finished hook ------------------------------------------------------------------------


def test_the_finished_hook_is_enqueued_once_the_end_is_committed(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(jobs.job_finished, "delay", lambda *args: sent.append(args))
    tune = _tune(world, status="running")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        jobs.transition(tune, "succeeded")
        assert sent == []

    assert len(callbacks) == 1 and sent == [("kernels.tuningrun", tune.pk)]


def test_the_finished_hook_is_not_enqueued_for_an_end_rolled_back_or_a_move_short_of_one(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(jobs.job_finished, "delay", lambda *args: sent.append(args))
    run = world.run(status="queued")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            jobs.transition(run, "failed", error="the request failed after")
            raise RuntimeError("the request failed after")
        jobs.transition(run, "running")

    assert callbacks == [] and sent == []
    assert SweepRun.objects.get(pk=run.pk).status == "running"


HANDLED = []


def _record(job):
    HANDLED.append((type(job).__name__, job.status, "first"))
    return job.status


def _record_later(job):
    HANDLED.append((type(job).__name__, job.status, "later"))
    return job.status


def _record_run(run):
    HANDLED.append((type(run).__name__, run.status, "run"))
    return run.status


@pytest.fixture
def no_handlers(monkeypatch):
    """The hook's handlers and reapers emptied for the test (the apps' put back after)."""
    monkeypatch.setattr(jobs, "_finished", {})
    monkeypatch.setattr(jobs, "_reapers", {})
    HANDLED.clear()


def test_the_hook_calls_each_finished_handler_with_the_job(world, no_handlers):
    # added out of order: they run in their steps' order
    jobs.finished_handler_add(TuningRun, _record_later, step=jobs.Step.BISECT)
    jobs.finished_handler_add(TuningRun, _record, step=jobs.Step.RECORD)
    jobs.finished_handler_add(SweepRun, _record_run, step=jobs.Step.RECORD)
    # the app's ready() run again adds nothing
    jobs.finished_handler_add(TuningRun, _record, step=jobs.Step.RECORD)
    tune = _tune(world, status="cancelled")

    answer = jobs.job_finished.apply(args=["kernels.tuningrun", tune.pk]).get()

    assert answer == {
        "tests.web.test_jobs._record": "cancelled",
        "tests.web.test_jobs._record_later": "cancelled",
    }
    assert list(answer) == ["tests.web.test_jobs._record", "tests.web.test_jobs._record_later"]
    assert HANDLED == [("TuningRun", "cancelled", "first"), ("TuningRun", "cancelled", "later")]
    assert jobs.job_finished("runs.sweeprun", world.run(status="failed").pk) == {
        "tests.web.test_jobs._record_run": "failed"
    }


def test_a_handler_is_added_for_a_job_model_once(no_handlers):
    with pytest.raises(ImproperlyConfigured, match="no job model"):
        jobs.finished_handler_add(LaunchRecipe, _record, step=jobs.Step.RECORD)
    jobs.finished_handler_add(SweepRun, _record, step=jobs.Step.RECORD)
    with pytest.raises(ImproperlyConfigured, match="already a finished handler"):
        jobs.finished_handler_add(SweepRun, _record, step=jobs.Step.JUDGE)
    jobs.stale_reaper_add("runs", _record)
    with pytest.raises(ImproperlyConfigured, match="already added"):
        jobs.stale_reaper_add("runs", _record_later)
    assert jobs.finished_handlers(SweepRun) == [_record]
    assert jobs.stale_reapers() == {"runs": _record}


def test_a_database_error_retries_the_handler_that_failed_and_those_after_it_only(
    world, no_handlers
):
    failures = [OperationalError("database is locked")]
    called = []

    def first(job):
        called.append("first")
        return 1

    def flaky(job):
        called.append("flaky")
        if failures:
            raise failures.pop()
        return 2

    def after(job):
        called.append("after")
        return 3

    for step, handler in enumerate((first, flaky, after), start=1):
        jobs.finished_handler_add(TuningRun, handler, step=step)
    tune = _tune(world, status="succeeded")

    answer = jobs.job_finished.apply(args=["kernels.tuningrun", tune.pk]).get()

    # the one before it is not run again; the one after it waits for it
    assert called == ["first", "flaky", "flaky", "after"]
    assert list(answer.values()) == [1, 2, 3]

    failures.extend(OperationalError("database is locked") for _ in range(10))
    called.clear()
    with pytest.raises(OperationalError):
        jobs.job_finished.apply(args=["kernels.tuningrun", tune.pk]).get()
    assert called == ["first"] + ["flaky"] * (1 + jobs.FINISHED_RETRIES)


# -- the apps' handlers and reapers ---------------------------------------------------------------


def test_each_app_adds_its_handlers_and_reapers_in_their_order():
    assert jobs.finished_handlers(SweepRun) == [
        runs_services.on_run_finished,
        engines_services.on_run_finished,
        insights_services.on_run_finished,
        watches_services.on_run_finished,
        bisection.on_run_finished,
    ]
    assert jobs.finished_handlers(TuningRun) == [engines_services.on_tune_finished]
    assert jobs.finished_handlers(EngineAction) == [bisection.on_action_finished]
    assert list(jobs.stale_reapers().items()) == [
        ("runs resent", runs_services.run_resend_orphaned),
        ("runs", runs_services.run_fail_stale),
        ("tunes", kernels_services.tuning_run_fail_stale),
        ("actions", engines_services.engine_action_fail_stale),
    ]


def _finished_jobs(world):
    recipe = LaunchRecipe.objects.create(deployment=world.deployment, version=1, argv=["vllm"])
    return {
        SweepRun: world.run(status="succeeded"),
        TuningRun: _tune(world, status="succeeded"),
        EngineAction: EngineAction.objects.create(
            deployment=world.deployment, kind="restart", recipe=recipe, status="failed"
        ),
    }


def test_every_handler_and_reaper_the_apps_add_runs_on_a_finished_job_of_its_kind(world):
    finished = _finished_jobs(world)
    for model, job in finished.items():
        handlers = jobs.finished_handlers(model)
        assert handlers
        for handler in handlers:
            # what it returns is the task's answer: plain JSON
            json.dumps(handler(job))
    now = timezone.now()
    assert {name: reaper(now=now) for name, reaper in jobs.stale_reapers().items()} == {
        "runs resent": 0,
        "runs": 0,
        "tunes": 0,
        "actions": 0,
    }


def test_a_handler_of_one_kind_is_never_called_for_another(world, monkeypatch):
    told = []

    def telling(model, handler):
        def tell(job):
            told.append((handler, model, type(job)))

        return tell

    registered = {
        label: [(step, name, telling(label, handler)) for step, name, handler in entries]
        for label, entries in jobs._finished.items()
    }
    monkeypatch.setattr(jobs, "_finished", registered)

    for job in _finished_jobs(world).values():
        jobs.job_finished(job._meta.label_lower, job.pk)

    called = {(handler, model) for handler, model, _ in told}
    assert len(called) == len(told) == 7
    assert {(model, kind._meta.label_lower) for _, model, kind in told} == {
        ("runs.sweeprun", "runs.sweeprun"),
        ("kernels.tuningrun", "kernels.tuningrun"),
        ("engines.engineaction", "engines.engineaction"),
    }


# -- the staleness rule and the reaper ------------------------------------------------------------


def test_silent_for_is_the_time_since_the_hosts_last_heartbeat(world, settings):
    now = timezone.now()
    host = world.host
    assert host.silent_for(now) is None and not host.worker_alive(now)

    host.worker_seen_at = now - timezone.timedelta(seconds=90)

    assert host.silent_for(now) == 90.0
    settings.MOEOPS_WORKER_STALE_S, settings.MOEOPS_RUN_STALE_S = 120, 60
    assert host.worker_alive(now) and jobs.worker_lost(host, now)
    settings.MOEOPS_WORKER_STALE_S, settings.MOEOPS_RUN_STALE_S = 60, 120
    assert not host.worker_alive(now) and not jobs.worker_lost(host, now)


def test_a_host_never_heard_from_has_lost_no_work(world, settings):
    settings.MOEOPS_RUN_STALE_S = 1

    assert not jobs.worker_lost(world.host)


def test_the_reaper_task_fails_the_lost_jobs_of_every_kind(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    world.host.worker_seen_at = timezone.now() - timezone.timedelta(seconds=400)
    world.host.save()
    world.run(status="running", progress={"heartbeat": time.time() - 400})
    _tune(world, status="running")

    assert jobs.fail_stale_jobs.apply().get() == {
        "runs resent": 0,
        "runs": 1,
        "tunes": 1,
        "actions": 0,
    }
    assert jobs.fail_stale_jobs.apply().get() == {
        "runs resent": 0,
        "runs": 0,
        "tunes": 0,
        "actions": 0,
    }
