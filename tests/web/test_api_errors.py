import json
import os
import subprocess
import sys

import pytest
from django.test import override_settings

from moeops.fleet.models import Deployment
from moeops.runs import services
from moeops.runs.models import SweepRun
from moeops.runs.samples import TelemetrySample
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def test_it_reports_where_malformed_json_breaks(world):
    response = world.owner.post("/api/v1/runs", raw=b'{"deployment": "glm-5-sglang",')
    assert response.status_code == 400
    assert response.json()["detail"].startswith("request body is not valid JSON: ")
    assert "column 31" in response.json()["detail"]


def test_it_names_the_field_holding_bytes_that_are_not_utf8(world):
    body = b'{"deployment": "glm-5-sglang", "label": "sweep \xff\xfe"}'
    response = world.owner.post("/api/v1/runs", raw=body)
    assert response.status_code == 400
    assert response.json()["detail"] == "body.label: not valid UTF-8"
    nested = b'{"batch_id": "b", "samples": [{"gpu_index": 0, "ts": 1, "x": "\xc3"}]}'
    run = world.run()
    response = world.owner.post(f"/api/v1/runs/{run.pk}/telemetry", raw=nested)
    assert response.json()["detail"] == "body.samples.0.x: not valid UTF-8"
    assert not SweepRun.objects.exclude(pk=run.pk).exists()


def test_it_names_the_field_of_an_integer_with_more_digits_than_python_reads(world):
    run = world.run(status="running")
    level = f'{{"concurrency": 8, "errors": {{}}, "output_throughput": {"9" * 5000}}}'
    response = world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", raw=level.encode())
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "body.output_throughput: an integer of more than 4,300 digits, more than numbers in a "
        "body may have"
    )
    nested = (
        f'{{"batch_id": "b", "samples": [{{"gpu_index": 0, "ts": 1}}, {{"ts": -{"1" * 4301}}}]}}'
    )
    response = world.owner.post(f"/api/v1/runs/{run.pk}/telemetry", raw=nested.encode())
    assert response.json()["detail"].startswith("body.samples.1.ts: an integer of more than")
    assert run.levels.count() == 0 and not TelemetrySample.objects.exists()


def test_it_rejects_latin1_bodies(world):
    response = world.owner.post("/api/v1/runs", raw="{\xe9}".encode("latin-1"))
    assert response.status_code == 400
    assert response.json()["detail"] == "request body is not valid UTF-8"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10_000)
def test_it_refuses_an_oversize_body_with_413(world):
    run = world.run()
    samples = [{"gpu_index": 0, "ts": 1.7e9 + i} for i in range(1000)]
    response = world.owner.post(
        f"/api/v1/runs/{run.pk}/telemetry", {"batch_id": "big", "samples": samples}
    )
    assert response.status_code == 413
    assert response.json()["detail"] == (
        "request body is larger than 10000 bytes (MOEOPS_MAX_BODY_BYTES)"
    )
    assert not TelemetrySample.objects.exists()


def test_the_body_limit_comes_from_the_environment():
    code = "import django; django.setup(); from django.conf import settings; "
    code += "print(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "moeops.settings",
        "MOEOPS_MAX_BODY_BYTES": "4321",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "4321"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"deployment": ["glm-5-sglang"]}, "deployment"),
        ({"deployment": "glm-5-sglang", "parameters": "levels=32"}, "parameters"),
        ({"deployment": "glm-5-sglang", "uuid": "not-a-uuid"}, "uuid"),
        ({"deployment": "glm-5-sglang", "label": "x" * 201}, "label"),
        ({"deployment": "glm-5-sglang", "label": "a\x00b"}, "label"),
        ({"deployment": "glm-5-sglang", "parameters": {"k": "\ud800"}}, "parameters"),
        ({"deployment": "glm-5-sglang", "kernel_config": 2**70}, "kernel_config"),
        ({}, "deployment"),
    ],
)
def test_it_names_the_field_of_a_wrong_type(world, body, field):
    response = world.owner.post("/api/v1/runs", raw=json.dumps(body).encode())
    assert response.status_code == 422
    assert response.json()["message"].split(":")[0] == field
    assert response.json()["detail"][0]["loc"][-1] == field
    assert not SweepRun.objects.exists()


def test_it_rejects_nan_and_infinity(world):
    run = world.run()
    body = b'{"batch_id": "b", "samples": [{"gpu_index": 0, "ts": 1, "power_w": NaN}]}'
    response = world.owner.post(f"/api/v1/runs/{run.pk}/telemetry", raw=body)
    assert response.status_code == 422
    assert response.json()["message"].startswith("samples.0.power_w:")
    level = b'{"concurrency": 8, "output_throughput": Infinity}'
    assert world.owner.post(f"/api/v1/runs/{run.pk}/levels", raw=level).status_code == 422
    # an unlimited request rate is the one infinity the API takes
    rate = b'{"concurrency": 8, "request_rate": Infinity, "output_throughput": 1.0}'
    response = world.owner.post(f"/api/v1/runs/{run.pk}/levels", raw=rate)
    assert response.status_code == 201
    assert response.json()["request_rate"] is None


def test_it_survives_absurd_nesting(world):
    deep = b'{"deployment": "glm-5-sglang", "parameters": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = world.owner.post("/api/v1/runs", raw=deep)
    assert response.status_code in (400, 422)
    assert not SweepRun.objects.exists()


def test_unknown_ids_are_404_with_the_name(world):
    for path, name in [
        ("/api/v1/deployments/ghost", "deployment 'ghost' not found"),
        ("/api/v1/hosts/ghost/gpus", "host 'ghost' not found"),
        ("/api/v1/kernel-configs/0", "kernel config '0' not found"),
        ("/api/v1/tuning-runs/ghost", "tuning run 'ghost' not found"),
        ("/api/v1/findings/12345678901234567890123", "finding '12345678901234567890123' not found"),
    ]:
        response = world.owner.get(path)
        assert response.status_code == 404, path
        assert response.json()["detail"] == name


def test_a_failure_inside_answers_500_without_a_trace(world, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("disk on fire at /var/lib/secret")

    monkeypatch.setattr(services, "run_create", broken)
    response = world.owner.post("/api/v1/runs", {"deployment": "glm-5-sglang"})
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error; it has been logged"}
    assert b"secret" not in response.content and b"Traceback" not in response.content


def test_a_failed_deployment_create_stores_nothing(world):
    body = {"name": "half", "model": "GLM-5", "host": "rtx-pro-6000", "gpus": [0, 9]}
    assert world.owner.post("/api/v1/deployments", body).status_code == 400
    assert not Deployment.objects.filter(name="half").exists()


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_sent_as_anything_but_json_is_refused_with_415(world, kind):
    body = json.dumps({"deployment": "glm-5-sglang"})

    response = world.owner.client.post(
        "/api/v1/runs", data=body, content_type=kind, headers=world.owner.headers
    )

    assert response.status_code == 415
    assert response.json()["detail"] == (
        f"Content-Type: {kind} is not application/json; send the body as JSON"
    )
    assert not SweepRun.objects.exists()


def test_a_key_holding_a_nul_is_refused_by_its_path_not_dropped(world):
    # a top-level key with a NUL is no field's name: the payload model would drop it unheard
    response = world.owner.post(
        "/api/v1/runs", raw=b'{"deployment": "glm-5-sglang", "label\\u0000": "x"}'
    )
    assert response.status_code == 400
    assert response.json()["detail"] == (
        'body: the key "label\\u0000" holds a NUL character (\\u0000); no key may'
    )
    # nested, inside a JSON field, and where a level's metrics go
    run = world.run(status="running")
    nested = b'{"concurrency": 8, "output_throughput": 1.0, "raw": {"a": [{"b\\u0000c": 1}]}}'
    response = world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", raw=nested)
    assert response.status_code == 400
    assert response.json()["detail"].startswith('body.raw.a.0: the key "b\\u0000c" holds a NUL')
    assert not SweepRun.objects.exclude(pk=run.pk).exists() and run.levels.count() == 0
    # a NUL spelt out inside a value is not a key: the level is stored (its text is escaped)
    level = b'{"concurrency": 8, "output_throughput": 1.0, "raw": {"note": "\\\\u0000"}}'
    assert world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", raw=level).status_code == 201
