"""The periodic health check: beat's schedule from the settings, and the web-side task that
sends one check per deployment with an endpoint to its host's queue."""

import json
import os
import subprocess
import sys

import pytest

from moeops.fleet.tasks import check_deployments
from tests import page_base as pb
from tests import queues
from tests.fakes import ROOT


@pytest.mark.django_db
def test_it_sends_one_check_per_deployment_with_an_endpoint(
    redis_url, monkeypatch, settings, django_capture_on_commit_callbacks
):
    settings.MOEOPS_HEALTH_CHECK_INTERVAL_S = 120
    settings.MOEOPS_ENDPOINT_ALLOWLIST = ["127.0.0.1", "10.0.0.0/8"]
    queues.send_to(monkeypatch, redis_url)
    h200, b200 = pb.host("h200-x8"), pb.host("b200-x8", gpu_name="NVIDIA B200")
    queues.clear(redis_url, h200.queue_name, b200.queue_name)
    glm = pb.deployment("GLM-5 on h200", host_row=h200)
    kimi = pb.deployment(
        "Kimi K2 on b200",
        model_row=pb.model("Kimi K2", pb.KIMI_CONFIG),
        host_row=b200,
        engine="vllm",
        endpoint_url="http://10.0.0.8:8000",
        served_model_name="",
    )
    pb.deployment("planned on h200", model_row=glm.model, host_row=h200, endpoint_url="")

    with django_capture_on_commit_callbacks(execute=True):
        result = check_deployments.delay()
    assert sorted(result.get()) == sorted([glm.pk, kimi.pk])

    [on_h200] = queues.queued(redis_url, h200.queue_name)
    [on_b200] = queues.queued(redis_url, b200.queue_name)
    assert on_h200.task == on_b200.task == "workers.check_deployment"
    assert on_h200.kwargs == {
        "deployment": glm.pk,
        "base_url": "http://127.0.0.1:30000",
        "model": "glm-5",
        "engine": "sglang",
        "trigger": "periodic",
    }
    # no served name: requests carry the model's own name, as a sweep's do
    assert (on_b200.kwargs["model"], on_b200.kwargs["engine"]) == ("Kimi K2", "vllm")
    assert on_b200.kwargs["trigger"] == "periodic"
    # a check that no worker started within one interval is dropped
    assert on_h200.headers["expires"] is not None
    queues.clear(redis_url, h200.queue_name, b200.queue_name)


def _beat_config(**env):
    """The web-side app's beat settings in a fresh interpreter (settings read the environment)."""
    code = (
        "import json; from moeops.celery import app; c = app.conf; "
        "print(json.dumps({'schedule': c.beat_schedule, 'scheduler': c.beat_scheduler}))"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MOEOPS_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**environ, "DJANGO_SETTINGS_MODULE": "moeops.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# beat also fails the jobs whose worker is lost, every minute, whatever the checks' interval
STALE_JOBS = {"task": "moeops.jobs.fail_stale_jobs", "schedule": 60.0}


def test_beat_checks_every_five_minutes_by_default_from_the_database_scheduler(tmp_path):
    proc = _beat_config(MOEOPS_VAR_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    conf = json.loads(proc.stdout)
    assert conf["schedule"] == {
        "check-deployments": {"task": "moeops.fleet.tasks.check_deployments", "schedule": 300.0},
        "fail-stale-jobs": STALE_JOBS,
    }
    # the database scheduler writes these entries beside the watches' schedules when it starts
    assert conf["scheduler"] == "django_celery_beat.schedulers:DatabaseScheduler"


def test_the_interval_comes_from_the_environment_and_zero_turns_the_checks_off(tmp_path):
    every_minute = json.loads(
        _beat_config(MOEOPS_VAR_DIR=str(tmp_path), MOEOPS_HEALTH_CHECK_INTERVAL_S="60").stdout
    )
    assert every_minute["schedule"]["check-deployments"]["schedule"] == 60.0
    off = json.loads(
        _beat_config(MOEOPS_VAR_DIR=str(tmp_path), MOEOPS_HEALTH_CHECK_INTERVAL_S="0").stdout
    )
    assert off["schedule"] == {"fail-stale-jobs": STALE_JOBS}


@pytest.mark.parametrize("value", ["-5", "5m"])
def test_an_interval_that_is_no_count_of_seconds_is_refused(tmp_path, value):
    proc = _beat_config(MOEOPS_VAR_DIR=str(tmp_path), MOEOPS_HEALTH_CHECK_INTERVAL_S=value)
    assert proc.returncode != 0
    assert "ImproperlyConfigured: MOEOPS_HEALTH_CHECK_INTERVAL_S must be" in proc.stderr


def test_checks_turned_off_leave_beats_database_when_beat_starts(db, monkeypatch):
    """The database scheduler adds the settings' entries and never removes one."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from moeops.celery import _drop_schedules_taken_out_of_settings, app

    every, _ = IntervalSchedule.objects.get_or_create(every=300, period="seconds")
    for name in ("check-deployments", "fail-stale-jobs"):
        PeriodicTask.objects.create(name=name, task=f"moeops.{name}", interval=every)
    monkeypatch.setitem(app.conf, "beat_schedule", {"fail-stale-jobs": STALE_JOBS})
    _drop_schedules_taken_out_of_settings(sender=None)
    assert list(PeriodicTask.objects.values_list("name", flat=True)) == ["fail-stale-jobs"]
