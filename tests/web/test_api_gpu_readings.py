"""A host's "GPUs now" over the API: asking its worker for a reading, and the readings it pushes."""

import time
import uuid

import pytest

from moeops.fleet.models import GPUReading
from tests import queues
from tests.api_base import make_world

QUEUE = "host.rtx-pro-6000"


@pytest.fixture
def world(db):
    return make_world()


def _gpu(index, **fields):
    return {
        "gpu_index": index,
        "ts": 1_780_000_000.0,
        "gpu_util": 97.0,
        "mem_util": 48.0,
        "power_w": 612.3,
        "power_limit_w": 700.0,
        "mem_used_mib": 96_000.0,
        "mem_total_mib": 143_771.0,
        "sm_clock_mhz": 1980.0,
        "temperature_c": 41.0,
        **fields,
    }


def test_a_reading_is_queued_on_the_hosts_queue_after_commit(
    world, monkeypatch, redis_url, django_capture_on_commit_callbacks
):
    queues.send_to(monkeypatch, redis_url)
    queues.clear(redis_url, QUEUE)
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/hosts/rtx-pro-6000/gpus-now")
    assert response.status_code == 202
    assert response.json() == {"task": "workers.gpus_now", "queue": QUEUE, "kwargs": {}}
    assert [t.task for t in queues.queued(redis_url, QUEUE)] == ["workers.gpus_now"]
    queues.clear(redis_url, QUEUE)


def test_asking_for_a_reading_needs_a_token_that_writes_the_host(world):
    path = "/api/v1/hosts/rtx-pro-6000/gpus-now"
    assert world.anonymous.post(path).status_code == 401
    assert world.read_only.post(path).status_code == 403
    assert world.outsider.post(path).status_code == 403
    assert world.owner.post("/api/v1/hosts/nope/gpus-now").status_code == 404


def test_the_worker_pushes_a_reading_once(world):
    body = {
        "uuid": str(uuid.uuid4()),
        "taken_at": 1_780_000_000.0,
        "status": "recorded",
        "gpus": [_gpu(0), _gpu(1, gpu_util=3.0, level_concurrency=None)],
    }
    path = "/api/v1/hosts/rtx-pro-6000/gpu-readings"
    response = world.host_worker.post(path, body)
    assert response.status_code == 201
    reading = GPUReading.objects.get()
    assert (reading.host, reading.status, reading.detail) == (world.host, "recorded", "")
    assert reading.taken_at.timestamp() == 1_780_000_000.0
    assert reading.gpus == [_gpu(0), _gpu(1, gpu_util=3.0)]
    assert world.host_worker.post(path, body).status_code == 200
    assert GPUReading.objects.count() == 1
    listed = world.read_only.get(path).json()
    assert listed["count"] == 1 and listed["items"][0]["gpus"][1]["gpu_util"] == 3.0


def test_a_host_without_nvml_pushes_why(world):
    body = {"status": "unavailable", "detail": "NVML did not initialise: Driver Not Loaded"}
    path = "/api/v1/hosts/rtx-pro-6000/gpu-readings"
    before = time.time()
    assert world.host_worker.post(path, body).status_code == 201
    reading = GPUReading.objects.get()
    assert (reading.status, reading.detail, reading.gpus) == ("unavailable", body["detail"], [])
    assert reading.taken_at.timestamp() >= before - 1


def test_a_recorded_reading_needs_gpus_and_the_hosts_token(world):
    path = "/api/v1/hosts/rtx-pro-6000/gpu-readings"
    empty = world.host_worker.post(path, {"status": "recorded", "gpus": []})
    assert empty.status_code == 422
    assert "gpus: a recorded reading holds at least one GPU" in empty.json()["message"]
    reading = {"status": "recorded", "gpus": [_gpu(0)]}
    assert world.outsider.post(path, reading).status_code == 403
    assert world.read_only.post(path, reading).status_code == 403
    assert not GPUReading.objects.exists()
