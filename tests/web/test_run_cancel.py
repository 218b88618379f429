"""Cancel of a running sweep: at once when its worker is gone, else through the flag its worker
reads; a run whose worker stopped sending heartbeats is failed (runs.services.run_fail_stale)."""

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from domain.progress import HEARTBEAT_STALE_S
from moeops.runs import services as run_services
from moeops.runs.models import LevelResult
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def test_cancel_ends_at_once_a_run_whose_worker_stopped_sending_progress(world, settings):
    # the reaper's limit is minutes away: the cancel does not wait for it
    settings.MOEOPS_RUN_STALE_S = 300
    beat = time.time() - HEARTBEAT_STALE_S - 20
    run = world.run(status="running", progress={"heartbeat": beat, "levels_done": 1})
    LevelResult.objects.create(run=run, key="c=8,r=inf", concurrency=8, completed=32)

    answer = world.owner.post(f"/api/v1/runs/{run.uuid}/cancel")

    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["cancel_requested"]) == ("cancelled", False)
    # the silence the run really had, not the threshold that called it gone
    said = re.fullmatch(
        r"Cancelled while its worker was gone \(its last heartbeat (\d+) s ago\); "
        r"finished levels kept\.",
        answer.json()["error"],
    )
    assert said and HEARTBEAT_STALE_S + 20 <= int(said[1]) <= HEARTBEAT_STALE_S + 30
    assert answer.json()["level_count"] == 1


def test_cancel_of_a_run_whose_worker_beats_goes_through_the_flag(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    run = world.run(status="running", progress={"heartbeat": time.time() - 2})

    answer = world.owner.post(f"/api/v1/runs/{run.uuid}/cancel").json()

    assert (answer["status"], answer["cancel_requested"]) == ("running", True)


def test_a_running_run_whose_worker_went_quiet_is_failed_with_its_levels_kept(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    now = time.time()
    lost = world.run(status="running", progress={"heartbeat": now - 400, "levels_done": 1})
    LevelResult.objects.create(run=lost, key="c=8,r=inf", concurrency=8, completed=32)
    busy = world.run(status="running", progress={"heartbeat": now - 5})
    # a run that never sent one counts from its start
    silent = world.run(status="running", started_at=timezone.now() - timedelta(seconds=400))
    queued = world.run(status="queued")

    assert run_services.run_fail_stale() == 2

    for run in (lost, busy, silent, queued):
        run.refresh_from_db()
    assert lost.status == "failed" and lost.levels.count() == 1
    assert lost.error == (
        "The worker stopped sending heartbeats 7 min ago: it was lost mid-sweep. "
        "Finished levels are kept. It will not be resumed: no worker of the host took it back "
        "within 5 min; start a new sweep for the levels left."
    )
    assert silent.status == "failed"
    assert (busy.status, queued.status) == ("running", "queued")
