"""POST /api/v1/runs with `start`: the run is created and its sweep sent to the host's worker,
as the deployment page's Run sweep does."""

import pytest

from moeops.fleet.models import TopologySnapshot
from moeops.runs.models import SweepRun
from tests import queues
from tests.api_base import make_serving_world

QUEUE = "host.rtx-pro-6000"
RUN_UUID = "0b7d4c1e-9a3f-4e52-8c61-5d2f7a9e3b10"
PARAMETERS = {"levels": [32, 64], "input_len": 1024, "output_len": 256, "prompts_per_level": 64}


@pytest.fixture
def world(db):
    return make_serving_world("glm-5", on_gpus=True)


def _start(**fields):
    return {
        "deployment": "glm-5-sglang",
        "uuid": RUN_UUID,
        "label": "api sweep",
        "parameters": PARAMETERS,
        "start": True,
        **fields,
    }


def test_start_creates_the_run_and_sends_its_sweep_after_commit(
    world, broker, django_capture_on_commit_callbacks
):
    topology = TopologySnapshot.objects.create(host=world.host, captured_at="2026-11-30T10:00Z")
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/runs", _start())
        assert queues.queued(broker, QUEUE) == []
    assert response.status_code == 201
    run = SweepRun.objects.get()
    assert (run.status, run.source, run.label) == ("queued", "worker", "api sweep")
    assert run.topology_snapshot == topology
    assert run.parameters == {
        **PARAMETERS,
        "base_url": "http://127.0.0.1:30000",
        "model": "glm-5",
        "gpu_indices": [0, 1],
        "vocab_size": None,
        # the run's own prompts (moeops.runs.services.RUN_OWN_PARAMETERS)
        "seed": run.parameters["seed"],
    }
    assert isinstance(run.parameters["seed"], int)
    [task] = queues.queued(broker, QUEUE)
    assert task.task == "workers.run_sweep"
    assert task.kwargs == {"run_uuid": RUN_UUID, **run.parameters}


def test_a_start_sent_again_is_the_same_run_and_no_second_sweep(
    world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = world.host_worker.post("/api/v1/runs", _start())
        again = world.host_worker.post("/api/v1/runs", _start())
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(queues.queued(broker, QUEUE)) == 1


def test_without_start_the_run_only_waits(world, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/runs", _start(start=False))
    assert response.status_code == 201
    assert SweepRun.objects.get().parameters == PARAMETERS
    assert queues.queued(broker, QUEUE) == []


@pytest.mark.parametrize("missing", ["levels", "input_len", "output_len"])
def test_a_start_without_what_a_sweep_needs_names_the_field(world, broker, missing):
    parameters = {k: v for k, v in PARAMETERS.items() if k != missing}
    response = world.owner.post("/api/v1/runs", _start(parameters=parameters))
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"parameters.{missing}: ")
    assert not SweepRun.objects.exists()


@pytest.mark.parametrize("levels", [[], [32, 0], "32,64", [True]])
def test_levels_must_be_a_list_of_concurrencies(world, broker, levels):
    response = world.owner.post("/api/v1/runs", _start(parameters={**PARAMETERS, "levels": levels}))
    assert response.status_code == 400
    assert response.json()["detail"].startswith("parameters.levels: ")


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        (
            {"levels": [2147483647], "input_len": 2**24, "output_len": 2**24},
            "parameters.levels: 0: Input should be less than or equal to 65536",
        ),
        (
            {"levels": [1024], "input_len": 2**24, "output_len": 2**24, "prompts_per_level": 2**24},
            "parameters: a sweep may send at most 21,600,000,000 tokens, levels × rounds × "
            "(prompts per level + warm-up) × (input + output tokens), as much as a worker sends "
            "in the 6 h a sweep may run even at 1,000,000 tok/s; this one would send "
            "562,949,953,421,312",
        ),
        (
            # no prompts_per_level: the worker sends 4 per concurrent stream
            {"levels": [65536], "input_len": 2**24, "output_len": 2**24},
            "parameters: a sweep may send at most 21,600,000,000 tokens",
        ),
    ],
)
def test_a_sweep_no_worker_could_finish_is_refused_naming_the_bound(
    world, broker, parameters, named
):
    response = world.owner.post("/api/v1/runs", _start(parameters=parameters))
    assert response.status_code == 400
    assert response.json()["detail"].startswith(named), response.json()
    assert not SweepRun.objects.exists()
    assert queues.queued(broker, QUEUE) == []


def test_a_start_needs_the_deployments_endpoint_and_a_worker_source(world, broker):
    response = world.owner.post("/api/v1/runs", _start(deployment="glm-5-h200"))
    assert response.status_code == 400
    assert response.json()["detail"].startswith("endpoint_url: ")
    manual = world.owner.post("/api/v1/runs", _start(source="manual"))
    assert manual.status_code == 400
    assert manual.json()["detail"].startswith("source: ")
    assert world.outsider.post("/api/v1/runs", _start()).status_code == 403
    assert not SweepRun.objects.exists()


def test_a_broker_that_cannot_be_reached_fails_the_started_run(
    world, monkeypatch, free_port, django_capture_on_commit_callbacks
):
    queues.send_to(monkeypatch, f"redis://127.0.0.1:{free_port()}/0")
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/runs", _start())
    assert response.status_code == 201
    run = SweepRun.objects.get()
    assert run.status == "failed"
    assert "Could not reach the broker to enqueue workers.run_sweep" in run.error
    assert "Connection refused" in run.error
