"""The run page of a sweep whose worker was lost says what becomes of it (issue 40, item 7;
decision 54): sent again and resumed once the host's worker is back, or failed and not resumed,
by the same rule the reaper follows (SweepRun.worker_loss)."""

import html
import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from moeops.runs import services as run_services
from moeops.runs.models import LevelResult
from tests import page_base as pb
from tests import queues
from tests.api_base import make_world

QUEUE = "host.rtx-pro-6000"


@pytest.fixture
def world(db):
    return make_world()


def _lost_sweep(world, silent_s):
    run = world.run(
        status="running",
        source="worker",
        parameters={"levels": [8, 16], "input_len": 128, "output_len": 64},
        progress={"heartbeat": time.time() - silent_s, "level_index": 1, "levels_total": 2},
    )
    LevelResult.objects.create(run=run, key="c=8,r=inf", concurrency=8, completed=32)
    return run


def _page(client, run):
    return html.unescape(client.get(f"/runs/{run.uuid}/").content.decode())


def test_a_lost_sweep_says_it_resumes_if_its_worker_comes_back_in_time_and_is_sent_again(
    world, client, broker, settings, django_capture_on_commit_callbacks
):
    settings.MOEOPS_RUN_STALE_S = 300
    pb.sign_in(client)
    run = _lost_sweep(world, 60)
    # the host's worker went silent with the sweep's
    world.host.worker_seen_at = timezone.now() - timedelta(seconds=60)
    world.host.save()

    page = _page(client, run)
    assert re.search(r"Its worker stopped sending heartbeats 6\d s ago\. If the host's", page)
    assert "comes back within 4 min, the sweep is sent to it again and resumes from its " in page
    assert "finished levels; after that it is failed, not resumed." in page

    # the host's worker is back (a restarted one): the reaper sends the sweep to it again
    world.host.worker_seen_at = timezone.now()
    world.host.save()
    assert "the host's worker is back: the sweep is sent to it again within a minute" in (
        _page(client, run)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert run_services.run_resend_orphaned() == 1
    assert [q.task for q in queues.queued(broker, QUEUE)] == ["workers.run_sweep"]
    page = _page(client, run)
    assert re.search(r"the sweep was sent again \d s ago and resumes from its finished", page)
    assert "once the host's worker takes it (it is failed in 5 min if none does)." in page


def test_a_lost_sweep_whose_worker_stays_away_says_it_will_not_be_resumed(world, client, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    pb.sign_in(client)
    run = _lost_sweep(world, 400)

    assert "it is failed within a minute, its finished levels kept, not resumed." in (
        _page(client, run)
    )
    assert run_services.run_fail_stale() == 1
    page = _page(client, run)
    assert "Finished levels are kept. It will not be resumed: no worker of the host took it " in (
        page
    )
    assert "back within 5 min; start a new sweep for the levels left." in page


def test_a_sweep_whose_worker_beats_says_nothing_of_a_loss(world, client):
    pb.sign_in(client)
    run = _lost_sweep(world, 2)
    assert "Its worker stopped" not in _page(client, run)
    assert run.worker_loss() is None
