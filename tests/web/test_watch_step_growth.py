"""A watch's regression alert names the class of a decode step that grew the most, where the run
and its baseline both profiled the same level (moeops.runs.profiles.runs_step_growth)."""

import pytest

from moeops.runs import measurements
from moeops.runs.profiles import STEP_GROWTH_POINTS, runs_step_growth
from moeops.watches import services
from moeops.watches.models import Alert, AlertChannel, WatchRun
from tests import page_base
from tests import step_breakdowns as sb

LOAD = {"levels": [4, 8], "input_len": 16, "output_len": 32, "prompts_per_level": 8}


@pytest.fixture
def watch(db):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    return services.watch_create(
        deployment=page_base.deployment(), name="nightly", parameters=LOAD, cron="0 3 * * *"
    )


def _finished(watch, peak, interval, communication=None):
    """A watch run whose sweep succeeded at `peak` tok/s, four rounds spanning `interval`, its
    level 8 profiled with
    this communication share of a decode step (None: not profiled)."""
    run = page_base.run(watch.deployment, levels=[{"concurrency": 8, "output_throughput": peak}])
    page_base.rounds_spanning(run.levels.get(), peak, interval)
    if communication is not None:
        body = sb.captured(8, shares={"communication": communication, "moe": 0.3})
        measurements.profile_record(run=run, body=body, source="upload")
    WatchRun.objects.create(watch=watch, run=run, status="running")
    return services.watch_run_finished(run)


def test_the_regression_alert_names_the_class_that_grew(watch, django_capture_on_commit_callbacks):
    _finished(watch, 1000.0, [950.0, 1050.0], communication=0.12)
    with django_capture_on_commit_callbacks():
        regressed = _finished(watch, 600.0, [560.0, 640.0], communication=0.31)

    assert regressed.verdict == "regressed"
    (alert,) = Alert.objects.filter(kind="regression")
    assert (
        "(−40 % [−47 %, −33 %] of the rounds' geometric means; a permutation test at 5 % false "
        "alarms, p = 0.029); inside the step, communication "
        "grew 12 % → 31 % of a decode step at concurrency 8." in alert.text
    )


def test_without_the_baselines_profile_the_alert_says_nothing_of_the_step(
    watch, django_capture_on_commit_callbacks
):
    _finished(watch, 1000.0, [950.0, 1050.0])
    with django_capture_on_commit_callbacks():
        _finished(watch, 600.0, [560.0, 640.0], communication=0.31)

    (alert,) = Alert.objects.filter(kind="regression")
    assert "inside the step" not in alert.text


def test_a_growth_below_the_noise_of_two_windows_is_not_named(watch):
    small = (STEP_GROWTH_POINTS - 1) / 100
    before = _finished(watch, 1000.0, [950.0, 1050.0], communication=0.12).run
    after = _finished(watch, 990.0, [950.0, 1050.0], communication=0.12 + small).run

    assert runs_step_growth(before, after) is None
