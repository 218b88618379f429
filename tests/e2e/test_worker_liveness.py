"""Worker liveness through the whole stack: a real GPU-host worker's heartbeat marks its host
alive, and a sweep whose worker is killed ends failed within the heartbeat timeout (minutes in
production, seconds here) instead of waiting hours for the broker to hand its task out again."""

import time

import pytest

from moeops import jobs
from moeops.fleet.models import Host
from moeops.runs.models import LevelResult, SweepRun

pytest_plugins = ["tests.stack"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

STALE_S = 4


def test_a_killed_worker_ends_its_sweep_within_the_heartbeat_timeout(make_sweep_stack, settings):
    settings.MOEOPS_RUN_STALE_S = STALE_S
    settings.MOEOPS_WORKER_STALE_S = STALE_S
    stack = make_sweep_stack(MOEOPS_HEARTBEAT_S="0.5")
    seen = Host.objects.filter(pk=stack.host.pk, worker_seen_at__isnull=False)
    host = stack.wait_until(seen.first, 30)
    assert host.worker_alive() and host.worker_status["worker"]["queue"] == host.queue_name

    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(
        run, until=lambda r: LevelResult.objects.filter(run=r).exists() and r.status == "running"
    )
    stack.worker.kill()
    killed_at = time.monotonic()
    # the beat task's body, as Celery beat runs it every minute on the web side
    assert jobs.fail_stale_jobs() == {"runs resent": 0, "runs": 0, "tunes": 0, "actions": 0}

    def failed():
        jobs.fail_stale_jobs()
        return SweepRun.objects.filter(pk=run.pk, status="failed").first()

    ended = stack.wait_until(failed, STALE_S + 20)

    assert time.monotonic() - killed_at < STALE_S + 20
    assert "The worker stopped sending heartbeats" in ended.error
    assert "Finished levels are kept" in ended.error
    assert ended.levels.count() >= 1
    # the host's worker is gone too, once its own heartbeat is as old
    gone = stack.wait_until(
        lambda: None if Host.objects.get(pk=host.pk).worker_alive() else True, 10
    )
    assert gone and "was last seen" in Host.objects.get(pk=host.pk).worker_absence()
