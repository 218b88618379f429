"""The fault suite, a paused broker: a Redis that takes connections and answers nothing (SIGSTOP)
neither hangs the request that starts a sweep nor the heartbeat of the worker that uses it."""

import signal
import subprocess
import time

import pytest
from django.utils.html import escape

from domain.queues import BROKER_ANSWER_S
from moeops import celery as web_celery
from moeops.fleet.models import Host
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests.api_base import make_world
from tests.stack import FAULT_SUITE

pytest_plugins = ["tests.stack"]
LOAD = {"levels": [8], "input_len": 16, "output_len": 32}
pytestmark = FAULT_SUITE


@pytest.fixture
def own_redis(free_port, tmp_path):
    """A Redis of the test's own, to pause: (its URL, its process)."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout != (
        b"PONG\n"
    ):
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0", server
    server.send_signal(signal.SIGCONT)
    server.kill()
    server.wait(10)


def test_a_start_on_a_paused_broker_answers_503_within_its_bound(
    own_redis, transactional_db, monkeypatch
):
    url, server = own_redis
    world = make_world()
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save()
    # the web tier's own app, its settings as shipped, sending to the paused Redis
    app = web_celery.app
    monkeypatch.setattr(app.conf, "broker_url", url)
    monkeypatch.setattr(app, "_pool", None)
    monkeypatch.setattr(app.amqp, "_producer_pool", None)
    server.send_signal(signal.SIGSTOP)

    started = time.monotonic()
    response = world.owner.post(
        "/api/v1/runs",
        {"deployment": "glm-5-sglang", "parameters": LOAD, "start": True},
    )
    took = time.monotonic() - started

    assert response.status_code == 503
    run = SweepRun.objects.get()
    detail = response.json()["detail"]
    assert detail == f"{run.error}. Run {run.uuid} was stored as failed; start a new one."
    assert run.status == "failed"
    assert run.error.startswith(
        "Could not reach the broker to enqueue workers.run_sweep: it did not answer within "
        f"{BROKER_ANSWER_S} s"
    )
    # the send tries twice, and telling the web worker the run ended once more
    assert took < 4 * BROKER_ANSWER_S + 5


def test_a_worker_whose_broker_is_paused_keeps_its_heartbeat_and_says_so(
    make_sweep_stack, own_redis, client
):
    url, server = own_redis
    stack = make_sweep_stack(REDIS_URL=url, MOEOPS_HEARTBEAT_S="0.5")
    host = stack.wait_until(
        lambda: Host.objects.filter(pk=stack.host.pk, worker_seen_at__isnull=False).first(), 30
    )

    server.send_signal(signal.SIGSTOP)
    paused_at = time.time()

    def saying_so():
        host = Host.objects.get(pk=stack.host.pk)
        return host if host.worker_alive() and host.broker_out_of_reach() else None

    host = stack.wait_until(saying_so, 30, "heartbeat saying the broker does not answer")
    # heartbeats keep coming while the broker is paused
    stack.wait_until(
        lambda: Host.objects.get(pk=host.pk).worker_seen_at.timestamp() > paused_at + 2 or None,
        30,
        "a heartbeat sent while the broker is paused",
    )
    absence = Host.objects.get(pk=host.pk).worker_absence()
    assert absence.startswith(f"The worker of host {host.name} is running but cannot reach")
    assert f"did not answer within {BROKER_ANSWER_S} s" in absence
    pb.sign_in(client)
    assert escape(absence) in client.get(f"/hosts/{host.name}/").content.decode()

    server.send_signal(signal.SIGCONT)
    stack.wait_until(
        lambda: Host.objects.get(pk=host.pk).worker_absence() == "" or None,
        20,
        "heartbeat saying the broker answers again",
    )
