import datetime as dt
import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from moeops.api.api import api
from moeops.api.models import ApiToken
from moeops.runs.models import SweepRun
from tests.api_base import ApiClient, make_world


@pytest.fixture
def world(db):
    return make_world()


def _operations():
    """(method, path) of every API operation, path parameters filled in."""
    schema = api.get_openapi_schema()
    for path, methods in schema["paths"].items():
        for method in methods:
            yield method, re.sub(r"\{\w+\}", "1", path)


def test_health_needs_no_token(world):
    response = world.anonymous.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_every_other_endpoint_needs_a_token(world):
    operations = [op for op in _operations() if op[1] != "/api/v1/health"]
    assert len(operations) > 35
    for method, path in operations:
        response = getattr(world.anonymous, method)(path)
        assert response.status_code == 401, (method, path, response.status_code)
        assert response["WWW-Authenticate"] == "Bearer"
        assert "Bearer" in response.json()["detail"]


@pytest.mark.parametrize(
    "header",
    ["Bearer moe_wrongwrongwrongwrong", "Bearer ", "Token abc", "Basic dXNlcjpwYXNz", "Bearer x"],
)
def test_it_refuses_wrong_tokens(world, header):
    response = Client().get("/api/v1/runs", headers={"Authorization": header})
    assert response.status_code == 401


def test_it_refuses_a_forged_secret_with_a_real_prefix(world):
    forged = world.owner_token[:-4] + ("aaaa" if not world.owner_token.endswith("aaaa") else "bbbb")
    assert ApiClient(forged).get("/api/v1/runs").status_code == 401
    assert ApiClient(forged).post("/api/v1/runs", {"deployment": "glm-5-sglang"}).status_code == 401
    assert not SweepRun.objects.exists()


def test_read_only_token_reads(world):
    assert world.read_only.get("/api/v1/deployments").status_code == 200


def test_a_browser_session_reads_but_does_not_write(world):
    user = User.objects.create_user("ana", password="pw-for-tests")
    browser = Client()
    browser.force_login(user)
    assert browser.get("/api/v1/runs").status_code == 200
    response = browser.post(
        "/api/v1/runs", data={"deployment": "glm-5-sglang"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert "browser sessions may only read" in response.json()["detail"]
    assert not SweepRun.objects.exists()


def test_it_notes_when_a_token_was_last_used_once_a_minute(world):
    token = ApiToken.objects.get(name="owner")
    assert token.last_used is None
    world.owner.get("/api/v1/runs")
    token.refresh_from_db()
    first = token.last_used
    assert first is not None
    world.owner.get("/api/v1/runs")
    token.refresh_from_db()
    assert token.last_used == first
    ApiToken.objects.filter(pk=token.pk).update(last_used=timezone.now() - dt.timedelta(hours=1))
    world.owner.get("/api/v1/runs")
    token.refresh_from_db()
    assert timezone.now() - token.last_used < dt.timedelta(minutes=1)


def test_the_schema_and_docs_are_served(world):
    schema = world.anonymous.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    body = schema.json()
    assert body["info"]["title"] == "moeops"
    assert body["components"]["securitySchemes"]["TokenAuth"]["scheme"] == "bearer"
    assert "/api/v1/runs/{ref}/telemetry" in body["paths"]
    docs = world.anonymous.get("/api/v1/docs")
    assert docs.status_code == 200
    # Swagger UI comes from the installed django-ninja, never from a CDN (there is no internet)
    assert "/static/ninja/swagger-ui-bundle.js" in docs.content.decode()
    assert world.anonymous.get("/static/ninja/swagger-ui-bundle.js").status_code == 200


def test_create_token_prints_a_token_once(world):
    out = StringIO()
    call_command("create_token", "ci-worker", "--host", "rtx-pro-6000", stdout=out)
    plaintext = out.getvalue().strip()
    row = ApiToken.lookup(plaintext)
    assert row.name == "ci-worker" and row.host == world.host and not row.read_only
    assert plaintext not in row.hashed
    call_command("create_token", "dashboards", "--read-only", stdout=StringIO())
    assert ApiToken.objects.get(name="dashboards").read_only
    with pytest.raises(CommandError, match="no host named 'nope'"):
        call_command("create_token", "x", "--host", "nope", stdout=StringIO())
