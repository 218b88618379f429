"""SLO profiles: one rule (SLOProfile.clean → domain.slo) for the admin, the page and the API;
a deployment's default profile; a level judged by its profile."""

import jsonschema_rs
import pytest
from django.contrib.auth.models import User

from domain.levels import LATENCY_METRICS
from moeops.fleet import services
from moeops.fleet.models import Deployment, SLOProfile
from moeops.runs.models import LevelResult
from tests import page_base as pb
from tests.api_base import make_world

pytestmark = pytest.mark.django_db

PROFILE = {"name": "chat", "ttft_percentile": "p99", "ttft_ms": 500, "tpot_percentile": "p99"}
PROFILE["tpot_ms"] = 50


@pytest.fixture
def world():
    return make_world()


# each: (fields, the field named)
BAD = [
    ({"name": "none"}, "__all__"),
    ({"name": "p42", "ttft_percentile": "p42", "ttft_ms": 500}, "ttft_percentile"),
    ({"name": "bare", "ttft_ms": 500}, "ttft_percentile"),
    ({"name": "zero", "tpot_percentile": "p99", "tpot_ms": 0}, "tpot_ms"),
    ({"name": "neg", "itl_percentile": "p90", "itl_ms": -1}, "itl_ms"),
    (
        {"name": "share", "tpot_percentile": "p99", "tpot_ms": 50, "max_failed_percent": 101},
        "max_failed_percent",
    ),
]


def test_the_api_creates_lists_gets_and_updates_a_profile(world):
    response = world.owner.post("/api/v1/slo-profiles", PROFILE)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["max_failed_percent"] == 1.0
    assert body["summary"] == "TTFT p99 ≤ 500 ms, TPOT p99 ≤ 50 ms, failed ≤ 1 %"
    assert world.owner.post("/api/v1/slo-profiles", PROFILE).status_code == 200
    other = {**PROFILE, "tpot_ms": 40}
    assert world.owner.post("/api/v1/slo-profiles", other).status_code == 409
    assert [p["name"] for p in world.read_only.get("/api/v1/slo-profiles").json()["items"]] == [
        "chat"
    ]
    assert world.read_only.get("/api/v1/slo-profiles/chat").json()["id"] == body["id"]
    response = world.owner.patch(
        "/api/v1/slo-profiles/chat", {"ttft_ms": None, "ttft_percentile": ""}
    )
    assert response.status_code == 200, response.content
    assert response.json()["summary"] == "TPOT p99 ≤ 50 ms, failed ≤ 1 %"


def test_only_a_persons_token_writes_a_profile(world):
    assert world.read_only.post("/api/v1/slo-profiles", PROFILE).status_code == 403
    assert world.host_worker.post("/api/v1/slo-profiles", PROFILE).status_code == 403
    assert not SLOProfile.objects.exists()


@pytest.mark.parametrize(("fields", "field"), BAD)
def test_the_api_refuses_a_bad_profile_naming_the_field(world, fields, field):
    response = world.owner.post("/api/v1/slo-profiles", fields)
    # a percentile outside the schema's four is a 422 of its validation, the rest the rule's 400
    assert response.status_code == (422 if fields.get(field) == "p42" else 400), response.content
    detail = response.json()["message" if response.status_code == 422 else "detail"]
    if field == "__all__":
        assert detail == "A profile needs at least one limit (TTFT, TPOT, ITL or E2E latency)."
    else:
        assert detail.startswith(f"{field}: ")
    assert not SLOProfile.objects.exists()


# (body, whether the API stores it): what the published schema allows is stored, and the rest
# is refused, with no default the API then refuses (it said ttft_percentile "" for a limit)
SCHEMA_CASES = [
    ({"name": "a", "ttft_percentile": "p99", "ttft_ms": 500}, True),
    ({"name": "b", "tpot_percentile": "p90", "tpot_ms": 50, "max_failed_percent": 0}, True),
    ({"name": "c", "ttft_ms": 500}, False),
    ({"name": "d", "ttft_percentile": "p99"}, False),
    ({"name": "e", "ttft_percentile": "", "ttft_ms": 500}, False),
    ({"name": "f", "ttft_percentile": None, "ttft_ms": 500}, False),
]


def test_the_published_schema_of_a_profile_is_what_the_api_stores(world):
    schema = world.read_only.get("/api/v1/openapi.json").json()
    body = schema["paths"]["/api/v1/slo-profiles"]["post"]["requestBody"]["content"]
    validator = jsonschema_rs.Draft202012Validator(
        {**body["application/json"]["schema"], "components": schema["components"]}
    )
    properties = schema["components"]["schemas"]["SLOProfileIn"]["properties"]
    assert all("default" not in properties[f"{m}_percentile"] for m in LATENCY_METRICS)
    for fields, stored in SCHEMA_CASES:
        response = world.owner.post("/api/v1/slo-profiles", fields)
        assert validator.is_valid(fields) == stored, fields
        assert (response.status_code == 201) == stored, (fields, response.content)


def test_the_api_refuses_a_bad_update_and_stores_nothing(world):
    world.owner.post("/api/v1/slo-profiles", PROFILE)
    response = world.owner.patch("/api/v1/slo-profiles/chat", {"tpot_ms": -5})
    assert response.status_code == 400 and "tpot_ms" in response.json()["detail"]
    assert SLOProfile.objects.get().tpot_ms == 50


@pytest.mark.parametrize(("fields", "field"), BAD)
def test_the_page_refuses_a_bad_profile_naming_the_field(client, fields, field):
    pb.sign_in(client)
    form = {"max_failed_percent": 1, **fields}
    response = client.post("/slo/new/", form)
    assert response.status_code == 200
    assert field in response.context["form"].errors
    assert not SLOProfile.objects.exists()


def test_the_page_lists_creates_and_edits_a_profile(client):
    pb.sign_in(client)
    response = client.post("/slo/new/", {**PROFILE, "max_failed_percent": 0.5})
    assert response.status_code == 302
    profile = SLOProfile.objects.get()
    response = client.post(
        f"/slo/{profile.pk}/", {**PROFILE, "tpot_ms": 40, "max_failed_percent": 0.5}
    )
    assert response.status_code == 302
    page = client.get("/slo/").content.decode()
    assert "TTFT p99 ≤ 500 ms, TPOT p99 ≤ 40 ms, failed ≤ 0.5 %" in page
    assert 'href="/slo/"' in page  # the nav link


@pytest.mark.parametrize(("fields", "field"), BAD)
def test_the_admin_refuses_a_bad_profile_naming_the_field(client, fields, field):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    form = {"max_failed_percent": 1, **fields}
    response = client.post("/admin/fleet/sloprofile/add/", form)
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not SLOProfile.objects.exists()


def test_a_deployment_names_its_default_profile_on_the_api_and_loses_it_with_the_profile(world):
    world.owner.post("/api/v1/slo-profiles", PROFILE)
    path = f"/api/v1/deployments/{world.deployment.name}"
    response = world.owner.patch(path, {"default_slo_profile": "chat"})
    assert response.status_code == 200 and response.json()["default_slo_profile"] == "chat"
    assert world.owner.patch(path, {"default_slo_profile": "nope"}).status_code == 404
    SLOProfile.objects.get().delete()
    assert Deployment.objects.get(pk=world.deployment.pk).default_slo_profile is None


def test_the_deployment_form_sets_the_default_profile(client):
    profile, _ = services.slo_profile_create(**PROFILE)
    deployment = pb.deployment()
    pb.sign_in(client)
    form = client.get(f"/deployments/{deployment.pk}/edit/").context["form"]
    data = {k: v for k, v in form.initial.items() if v is not None}
    data |= {"gpus": [g.pk for g in deployment.gpus.all()], "launch_args": "{}"}
    data |= {"default_slo_profile": profile.pk, "model": deployment.model_id}
    data |= {"host": deployment.host_id}
    response = client.post(f"/deployments/{deployment.pk}/edit/", data)
    assert response.status_code == 302, response.context["form"].errors
    assert Deployment.objects.get(pk=deployment.pk).default_slo_profile == profile


def test_a_profile_judges_a_stored_level():
    profile, _ = services.slo_profile_create(**PROFILE)
    run = pb.run(pb.deployment())
    level = LevelResult.objects.create(
        run=run, key="c=8", p99_ttft_ms=420.0, p99_tpot_ms=47.0, completed=100, failed=0
    )
    verdict = profile.judge(level)
    assert verdict.met and verdict.binding.metric == "tpot" and verdict.binding.margin_ms == 3.0
    assert not profile.judge(level, upper={"p99_tpot_ms": 51.0}).met


def test_the_deployment_page_names_its_default_profile(client):
    profile, _ = services.slo_profile_create(**PROFILE)
    deployment = pb.deployment(default_slo_profile=profile)
    pb.sign_in(client)
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "TTFT p99 ≤ 500 ms, TPOT p99 ≤ 50 ms, failed ≤ 1 %" in page
