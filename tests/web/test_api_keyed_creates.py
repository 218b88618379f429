"""Creates under a client's uuid store one body: the same uuid with the same body is a repeat
(200), with another body a 409 naming the key, and the first body stays as it was stored."""

import pytest

from moeops.fleet.models import GPUReading, HealthCheck
from moeops.kernels.models import TuningRun
from moeops.runs.models import SweepRun
from tests.api_base import make_world

KEY = "7a1c0e52-3b9d-4f6e-8a27-c4d5e6f70819"
ANOTHER_BODY = "is already stored with another body"


@pytest.fixture
def world(db):
    return make_world()


def _twice(client, path, first, second):
    return client.post(path, {"uuid": KEY, **first}), client.post(path, {"uuid": KEY, **second})


def _refused(first, again, what):
    assert (first.status_code, again.status_code) == (201, 409)
    assert again.json()["detail"].startswith(f"{what} {KEY} {ANOTHER_BODY}")


@pytest.mark.parametrize(
    "change",
    [{"label": "c64"}, {"parameters": {"levels": [8]}}, {"source": "manual"}],
    ids=["label", "parameters", "source"],
)
def test_a_run_uuid_sent_with_another_body_is_a_conflict(world, change):
    body = {"deployment": "glm-5-sglang", "label": "c32", "parameters": {"levels": [32]}}

    first, again = _twice(world.host_worker, "/api/v1/runs", body, {**body, **change})

    _refused(first, again, "run")
    run = SweepRun.objects.get()
    assert (run.label, run.parameters, run.source) == ("c32", {"levels": [32]}, "worker")


def test_a_run_uuid_sent_with_the_same_body_is_a_repeat(world):
    body = {"deployment": "glm-5-sglang", "label": "c32", "parameters": {"levels": [32]}}

    first, again = _twice(world.host_worker, "/api/v1/runs", body, dict(reversed(body.items())))

    assert (first.status_code, again.status_code) == (201, 200)
    assert SweepRun.objects.count() == 1


def test_a_health_check_uuid_sent_with_another_status_is_a_conflict(world):
    body = {"checked_at": 1_780_000_000.0, "status": "healthy", "detail": "serves glm-5"}
    path = "/api/v1/deployments/glm-5-sglang/health-checks"

    first, again = _twice(world.host_worker, path, body, {**body, "status": "failed"})

    _refused(first, again, "health check")
    assert HealthCheck.objects.get().status == "healthy"
    world.deployment.refresh_from_db()
    assert world.deployment.status == "healthy"
    assert world.host_worker.post(path, {"uuid": KEY, **body}).status_code == 200


def test_a_gpu_reading_uuid_sent_with_other_gpus_is_a_conflict(world):
    gpu = {"gpu_index": 0, "ts": 1_780_000_000.0, "gpu_util": 97.0, "power_w": 612.3}
    body = {"taken_at": 1_780_000_000.0, "status": "recorded", "gpus": [gpu]}
    other = {**body, "gpus": [{**gpu, "gpu_util": 3.0}]}
    path = "/api/v1/hosts/rtx-pro-6000/gpu-readings"

    first, again = _twice(world.host_worker, path, body, other)

    _refused(first, again, "GPU reading")
    assert GPUReading.objects.get().gpus[0]["gpu_util"] == 97.0
    assert world.host_worker.post(path, {"uuid": KEY, **body}).status_code == 200


def test_a_tuning_run_uuid_sent_with_another_E_is_a_conflict(world):
    body = {
        "host": "rtx-pro-6000",
        "deployment": "glm-5-sglang",
        "E": 256,
        "N": 256,
        "hidden_size": 6144,
        "topk": 8,
        "batch_sizes": [1, 16],
    }

    first, again = _twice(world.host_worker, "/api/v1/tuning-runs", body, {**body, "E": 128})

    _refused(first, again, "tuning run")
    assert TuningRun.objects.get().E == 256
    assert world.host_worker.post("/api/v1/tuning-runs", {"uuid": KEY, **body}).status_code == 200
