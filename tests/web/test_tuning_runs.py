"""A tune's life on the web side: started when it runs, failed when its host's worker is lost
(kernels.services.tuning_run_fail_stale), and what follows its end run once committed."""

import json
import time

import pytest
from django.utils import timezone

from moeops import jobs
from moeops.kernels import services
from moeops.kernels.models import TuningRun
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def _tune(host, **fields):
    return TuningRun.objects.create(host=host, E=8, N=64, hidden_size=64, topk=2, **fields)


def test_a_tune_whose_hosts_worker_is_lost_is_failed_and_the_rest_left_alone(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    world.host.worker_seen_at = timezone.now() - timezone.timedelta(seconds=400)
    world.host.save()
    lost = _tune(world.host, status="running")
    waiting = _tune(world.host, status="queued")
    # a host never heard from has no heartbeat to go stale
    unseen = _tune(world.other_host, status="running")

    assert services.tuning_run_fail_stale() == 1

    for tune in (lost, waiting, unseen):
        tune.refresh_from_db()
    assert lost.status == "failed" and lost.finished_at is not None
    assert lost.error == (
        "The worker of host rtx-pro-6000 stopped sending heartbeats 7 min ago: the tune was lost."
    )
    assert (waiting.status, unseen.status) == ("queued", "running")
    world.host.worker_seen_at = timezone.now()
    world.host.save()
    _tune(world.host, status="running")
    assert services.tuning_run_fail_stale() == 0


def test_a_tune_records_when_it_started_and_its_end_runs_the_hook_once_committed(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(jobs.job_finished, "delay", lambda *args: sent.append(args))
    tune = _tune(world.host)

    services.tuning_run_update(tuning_run=tune, status="running", progress={"done": 0})
    assert TuningRun.objects.get(pk=tune.pk).started_at is not None
    with django_capture_on_commit_callbacks(execute=True):
        services.tuning_run_cancel(tuning_run=tune)
        assert sent == []

    assert sent == [("kernels.tuningrun", tune.pk)]
    with pytest.raises(services.TuningConflict, match="is cancelled; it cannot become running"):
        services.tuning_run_update(tuning_run=tune, status="running")


def _beat(attempt, age_s=0.0):
    """A tune's progress as its delivery `attempt` stamps it, age_s seconds ago."""
    return {"heartbeat": time.time() - age_s, "attempt": attempt, "done": 1, "total": 4}


def test_of_two_deliveries_taking_a_silent_tune_over_one_wins(world):
    tune = _tune(world.host, status="running", progress=_beat(1, age_s=60))
    path = f"/api/v1/tuning-runs/{tune.uuid}"
    first = world.host_worker.patch(path, {"takeover": 2, "progress": _beat(2)})
    assert first.status_code == 200 and first.json()["progress"]["attempt"] == 2
    second = world.host_worker.patch(path, {"takeover": 2, "progress": _beat(2)})
    assert second.status_code == 409
    assert "cannot be taken over as attempt 2" in json.dumps(second.json())
    # the delivery that was taken over may no longer move the tune, nor end it
    late = world.host_worker.patch(path, {"status": "succeeded", "progress": _beat(1)})
    assert late.status_code == 409
    tune.refresh_from_db()
    assert tune.status == "running" and tune.progress["attempt"] == 2


def test_a_takeover_without_a_heartbeat_is_refused_naming_progress(world):
    tune = _tune(world.host, status="running", progress=_beat(1, age_s=60))
    answer = world.host_worker.patch(
        f"/api/v1/tuning-runs/{tune.uuid}", {"takeover": 2, "progress": {"done": 1}}
    )
    assert answer.status_code == 400 and "progress" in json.dumps(answer.json())
    tune.refresh_from_db()
    assert tune.progress["attempt"] == 1
