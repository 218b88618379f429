"""Cancel of a running sweep: at once when its worker is gone, else through the flag its worker
reads."""

import time

import pytest

from moeops.runs.models import LevelResult
from reports.progress import HEARTBEAT_STALE_S
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
    assert answer.json()["error"] == (
        "Cancelled while its worker was gone (no heartbeat for 10 s); finished levels kept."
    )
    assert answer.json()["level_count"] == 1


def test_cancel_of_a_run_whose_worker_beats_goes_through_the_flag(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    run = world.run(status="running", progress={"heartbeat": time.time() - 2})

    answer = world.owner.post(f"/api/v1/runs/{run.uuid}/cancel").json()

    assert (answer["status"], answer["cancel_requested"]) == ("running", True)
