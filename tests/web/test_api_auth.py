import datetime as dt
import re
from inspect import isfunction, unwrap
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from moeops.api.api import api
from moeops.api.auth import READ, HostWrite, WriteScope
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


# Routes anyone may call, and why.
OPEN_ROUTES = {("GET", "/health"): "liveness probes carry no token"}
OPEN_URLS = {
    "openapi-json": "the schema tells a client how to authenticate before it holds a token",
    "openapi-view": "the docs page shows that schema",
    "api-root": "/api/v1/ itself answers 404 naming the docs page",
}
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def _routes():
    """(method, path, operation) of every route of the API, with the auth it runs under."""
    for bound in api._get_bound_routers():
        for path, view in bound.path_operations.items():
            for operation in view.operations:
                for method in operation.methods:
                    yield (
                        method,
                        "/" + "/".join(p.strip("/") for p in (bound.prefix, path) if p.strip("/")),
                        operation,
                    )


def _checks_host(function, seen=frozenset()):
    """Whether `function` calls require_host(), itself or through a function of its module that
    does (a helper that several handlers share)."""
    code = function.__code__
    if "require_host" in code.co_names:
        return True
    seen = seen | {function}
    return any(
        isfunction(callee)
        and callee.__module__ == function.__module__
        and callee not in seen
        and _checks_host(callee, seen)
        for callee in (function.__globals__.get(name) for name in code.co_names)
    )


def _scope_problem(method, path, operation):
    """Why a route's declared scope is wrong, or "" when it is right."""
    auth = list(operation.auth_callbacks)
    if not auth:
        return "" if (method, path) in OPEN_ROUTES else "no auth and not in OPEN_ROUTES"
    if method in WRITE_METHODS:
        if len(auth) != 1 or not isinstance(auth[0], WriteScope):
            return "a write with no write scope in its auth="
        if isinstance(auth[0], HostWrite) and not _checks_host(unwrap(operation.view_func)):
            return "HostWrite, but the handler never checks the object's host with require_host()"
        return ""
    return "" if auth == READ else "a read not under READ"


def test_every_route_declares_its_scope():
    routes = list(_routes())
    assert len(routes) > 60
    problems = [(m, p, _scope_problem(m, p, op)) for m, p, op in routes]
    assert [problem for problem in problems if problem[2]] == []
    # nothing the API serves escapes the walk: its URLs are the routes' and the open ones
    named = {getattr(op, "url_name", None) or op.view_func.__name__ for _, _, op in routes}
    assert {url.name for url in api.urls[0]} == named | set(OPEN_URLS)


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
    schemes = body["components"]["securitySchemes"]
    for scope in ("ReadScope", "HostWrite", "AnyWrite", "PersonOnly"):
        assert schemes[scope]["scheme"] == "bearer", scope
    assert schemes["SessionRead"]["in"] == "cookie"
    # each operation names the scope it needs
    assert body["paths"]["/api/v1/runs"]["post"]["security"] == [{"HostWrite": []}]
    assert body["paths"]["/api/v1/runs"]["get"]["security"] == [
        {"ReadScope": []},
        {"SessionRead": []},
    ]
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
