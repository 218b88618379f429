"""The shared base of the API tests: an owner, a read-only token, a host token and an outsider.

Each API test file makes it a fixture with `world = pytest.fixture(make_world)`-style one-liners.
"""

import contextlib
import json
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone

from moeops.api.models import ApiToken
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec
from moeops.runs.models import SweepRun
from tests.page_base import GLM5_CONFIG


class ApiClient:
    """A Django test client that sends JSON and `Authorization: Bearer <token>`."""

    def __init__(self, token=None):
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _send(self, method, path, body=None, raw=None, headers=None, **kwargs):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        call = getattr(self.client, method)
        extra = {**self.headers, **(headers or {})}
        if data is None:
            return call(path, headers=extra, **kwargs)
        return call(path, data=data, content_type="application/json", headers=extra, **kwargs)

    def get(self, path, **kwargs):
        return self._send("get", path, **kwargs)

    def post(self, path, body=None, **kwargs):
        return self._send("post", path, body, **kwargs)

    def patch(self, path, body=None, **kwargs):
        return self._send("patch", path, body, **kwargs)


@contextlib.contextmanager
def wsgi_in_test_transaction():
    """Let requests sent straight to the WSGI app (httpx, schemathesis) run inside the test's
    transaction: Django closes a connection at a request's end when it is inside atomic(),
    as Django's own test client prevents in the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@dataclass
class World:
    host: Host
    other_host: Host
    model: ModelSpec
    deployment: Deployment
    other_deployment: Deployment
    owner: ApiClient
    read_only: ApiClient
    host_worker: ApiClient
    outsider: ApiClient
    anonymous: ApiClient
    owner_token: str
    host_token: str

    def run(self, deployment=None, **fields):
        return SweepRun.objects.create(deployment=deployment or self.deployment, **fields)


def make_world():
    """Two hosts with a deployment each; tokens: owner (writes all), read-only, the first
    host's worker, and an outsider (the other host's worker)."""
    host = Host.objects.create(name="rtx-pro-6000")
    other_host = Host.objects.create(name="h200-lab")
    for index in range(2):
        GPU.objects.create(
            host=host, index=index, name="NVIDIA RTX PRO 6000 Blackwell Server Edition"
        )
    model = ModelSpec(name="GLM-5", config_json=GLM5_CONFIG)
    model.fill_shape()
    model.save()
    deployment = Deployment.objects.create(name="glm-5-sglang", model=model, host=host, tp=8)
    other = Deployment.objects.create(name="glm-5-h200", model=model, host=other_host, tp=8)
    _, owner = ApiToken.issue(name="owner")
    _, read_only = ApiToken.issue(name="viewer", read_only=True)
    _, worker = ApiToken.issue(name="worker", host=host)
    _, outsider = ApiToken.issue(name="other-worker", host=other_host)
    return World(
        host=host,
        other_host=other_host,
        model=model,
        deployment=deployment,
        other_deployment=other,
        owner=ApiClient(owner),
        read_only=ApiClient(read_only),
        host_worker=ApiClient(worker),
        outsider=ApiClient(outsider),
        anonymous=ApiClient(),
        owner_token=owner,
        host_token=worker,
    )


def make_serving_world(served_model_name="", on_gpus=False):
    """make_world with its deployment's engine answering at 127.0.0.1:30000, under
    `served_model_name` where one is given, on all of its host's GPUs where `on_gpus`."""
    world = make_world()
    deployment = world.deployment
    deployment.endpoint_url = "http://127.0.0.1:30000"
    deployment.served_model_name = served_model_name
    deployment.save()
    if on_gpus:
        deployment.gpus.set(world.host.gpus.all())
    return world


# where make_world's deployment's tunes start
TUNE_START = "/api/v1/deployments/glm-5-sglang/tuning-runs"


def refused_batch(client, path, samples, named):
    """A batch of samples posted to path, one of them bad: refused whole (422), the message
    naming the bad field (`named`, e.g. "samples.7.ts:") first."""
    response = client.post(path, {"batch_id": "b", "samples": samples})
    assert response.status_code == 422
    assert response.json()["message"].startswith(named)


def make_world_with_worker():
    """make_world with its deployment on all of its host's GPUs and the host's worker seen just
    now (the host takes work)."""
    world = make_world()
    world.deployment.gpus.set(world.host.gpus.all())
    world.host.worker_seen_at = timezone.now()
    world.host.save(update_fields=["worker_seen_at"])
    return world


def make_managed_world():
    """make_world_with_worker with its deployment managed by moeops (vLLM at 127.0.0.1:8000)
    and a staff user `ops` as `world.staff`."""
    world = make_world_with_worker()
    deployment = world.deployment
    deployment.engine = "vllm"
    deployment.management = "managed"
    deployment.endpoint_url = "http://127.0.0.1:8000"
    deployment.save()
    world.staff = User.objects.create_user("ops", password="pw", is_staff=True)
    return world
