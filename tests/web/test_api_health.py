"""Deployment health over the API: asking a host's worker for a check, the checks it pushes
back into the history, and the status the newest check sets."""

import time
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from moeops.fleet.models import HealthCheck
from tests import queues
from tests.api_base import make_world

ENDPOINT = "http://127.0.0.1:30000"
QUEUE = "host.rtx-pro-6000"


@pytest.fixture
def world(db):
    world = make_world()
    world.deployment.endpoint_url = ENDPOINT
    world.deployment.served_model_name = "glm-5"
    world.deployment.save()
    return world


def _check(**fields):
    return {
        "uuid": str(uuid.uuid4()),
        "checked_at": time.time(),
        "trigger": "manual",
        "status": "healthy",
        "up": True,
        "detail": "SGLang 0.5.6 serves glm-5",
        "latency_ms": 12.5,
        "engine": "sglang",
        "version": "0.5.6",
        "models": ["glm-5"],
        "max_running_requests": 64,
        **fields,
    }


def test_a_check_is_queued_on_the_deployments_host_after_commit(
    world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/deployments/glm-5-sglang/check")
        assert queues.queued(broker, QUEUE) == []
    assert response.status_code == 202
    kwargs = {
        "deployment": world.deployment.pk,
        "base_url": ENDPOINT,
        "model": "glm-5",
        "engine": "sglang",
        "trigger": "api",
    }
    assert response.json() == {
        "task": "workers.check_deployment",
        "queue": QUEUE,
        "kwargs": kwargs,
    }
    [task] = queues.queued(broker, QUEUE)
    assert (task.task, task.kwargs) == ("workers.check_deployment", kwargs)
    # asked for by a person: it waits for the worker however long that takes
    assert task.headers["expires"] is None


def test_the_hosts_own_worker_token_may_ask_for_a_check(world, broker):
    assert world.host_worker.post("/api/v1/deployments/glm-5-sglang/check").status_code == 202


def test_a_deployment_without_an_endpoint_is_refused_by_name(world, broker):
    response = world.owner.post("/api/v1/deployments/glm-5-h200/check")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("endpoint_url: ")
    assert "glm-5-h200" in response.json()["detail"]


def test_asking_for_a_check_needs_a_token_that_writes_the_host(world, broker):
    path = "/api/v1/deployments/glm-5-sglang/check"
    assert world.anonymous.post(path).status_code == 401
    assert world.read_only.post(path).status_code == 403
    assert world.outsider.post(path).status_code == 403
    browser = Client()
    browser.force_login(User.objects.create_user("ana", password="pw-for-tests"))
    assert browser.post(path).status_code == 403
    assert world.owner.post("/api/v1/deployments/nope/check").status_code == 404


def test_a_broker_that_cannot_be_reached_is_a_503_that_says_so(
    transactional_db, monkeypatch, free_port
):
    world = make_world()
    world.deployment.endpoint_url = ENDPOINT
    world.deployment.save()
    queues.send_to(monkeypatch, f"redis://127.0.0.1:{free_port()}/0")
    response = world.owner.post("/api/v1/deployments/glm-5-sglang/check")
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert detail.startswith("could not reach the broker to enqueue workers.check_deployment")
    assert "Connection refused" in detail


def test_the_worker_pushes_a_check_and_it_sets_the_status(world):
    body = _check()
    response = world.host_worker.post("/api/v1/deployments/glm-5-sglang/health-checks", body)
    assert response.status_code == 201
    out = response.json()
    assert out["deployment"] == "glm-5-sglang"
    assert (out["status"], out["up"], out["trigger"]) == ("healthy", True, "manual")
    assert (out["engine"], out["version"], out["models"]) == ("sglang", "0.5.6", ["glm-5"])
    assert (out["latency_ms"], out["max_running_requests"]) == (12.5, 64)
    deployment = world.deployment
    deployment.refresh_from_db()
    assert (deployment.status, deployment.status_detail) == ("healthy", body["detail"])
    assert deployment.status_checked_at.timestamp() == pytest.approx(body["checked_at"])

    again = world.host_worker.post("/api/v1/deployments/glm-5-sglang/health-checks", body)
    assert again.status_code == 200 and again.json()["id"] == out["id"]
    assert HealthCheck.objects.count() == 1


def test_a_check_replayed_late_joins_the_history_without_undoing_a_newer_one(world):
    path = "/api/v1/deployments/glm-5-sglang/health-checks"
    now = time.time()
    world.host_worker.post(path, _check(checked_at=now))
    failed = _check(
        checked_at=now - 600,
        status="failed",
        up=False,
        detail="the engine did not answer",
        engine=None,
        version=None,
        models=[],
        latency_ms=None,
        max_running_requests=None,
    )
    assert world.host_worker.post(path, failed).status_code == 201
    world.deployment.refresh_from_db()
    assert world.deployment.status == "healthy"
    listed = world.read_only.get(path).json()
    assert listed["count"] == 2
    assert [c["status"] for c in listed["items"]] == ["healthy", "failed"]
    assert listed["items"][1]["engine"] == "" and listed["items"][1]["up"] is False


def test_pushing_a_check_needs_the_hosts_token_and_a_known_status(world):
    path = "/api/v1/deployments/glm-5-h200/health-checks"
    assert world.host_worker.post(path, _check()).status_code == 403
    assert world.read_only.post(path, _check()).status_code == 403
    response = world.outsider.post(path, _check(status="stopped"))
    assert response.status_code == 422
    assert response.json()["message"].startswith("status: ")
    assert not HealthCheck.objects.exists()


def test_a_uuid_of_another_deployments_check_is_a_conflict(world):
    body = _check()
    world.host_worker.post("/api/v1/deployments/glm-5-sglang/health-checks", body)
    response = world.owner.post("/api/v1/deployments/glm-5-h200/health-checks", body)
    assert response.status_code == 409


def test_a_health_status_patched_through_the_api_is_a_check_in_the_history(world):
    body = {"status": "degraded", "status_detail": "/v1/models lists another model"}
    response = world.host_worker.patch("/api/v1/deployments/glm-5-sglang", body)
    assert response.status_code == 200
    assert response.json()["status_checked_at"] is not None
    [check] = world.deployment.health_checks.all()
    assert (check.status, check.up, check.trigger) == ("degraded", True, "api")
    assert check.detail == body["status_detail"]
    world.deployment.refresh_from_db()
    assert world.deployment.status_checked_at == check.checked_at


def test_a_status_that_is_no_check_leaves_the_history_and_check_time_alone(world):
    response = world.owner.patch("/api/v1/deployments/glm-5-sglang", {"status": "stopped"})
    assert response.status_code == 200
    assert response.json()["status"] == "stopped"
    assert response.json()["status_checked_at"] is None
    assert not HealthCheck.objects.exists()
