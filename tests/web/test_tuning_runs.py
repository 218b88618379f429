"""A tune's life on the web side: started when it runs, failed when its host's worker is lost
(kernels.services.tuning_run_fail_stale), and what follows its end run once committed."""

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
