"""What a deployment's endpoint may name (moeops.fleet.endpoints): the host's worker fetches it,
so only the host itself or MOEOPS_ENDPOINT_ALLOWLIST, and only staff choose a new address."""

import html

import pytest
from django.contrib.admin import site
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client

from moeops.fleet import services as fleet_services
from moeops.fleet.models import Deployment
from moeops.fleet.tasks import check_deployments
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from moeops.watches.models import AlertChannel
from tests.api_base import make_serving_world

METADATA = "http://169.254.169.254/latest/meta-data/"


@pytest.fixture
def world(db):
    return make_serving_world()


def _browser(staff):
    browser = Client()
    browser.force_login(User.objects.create_user("staff" if staff else "member", is_staff=staff))
    return browser


def _edit(browser, deployment, endpoint_url):
    form = {
        "name": deployment.name,
        "model": deployment.model_id,
        "host": deployment.host_id,
        "engine": deployment.engine,
        "tp": deployment.tp,
        "ep": deployment.ep,
        "launch_args": "{}",
        "allreduce_fusion": "unknown",
        "endpoint_url": endpoint_url,
        "status": deployment.status,
    }
    return browser.post(f"/deployments/{deployment.pk}/edit/", form)


def test_it_rejects_an_endpoint_that_is_neither_the_host_nor_allowed(world):
    body = {"name": "probe", "model": "GLM-5", "host": "rtx-pro-6000", "endpoint_url": METADATA}
    response = world.owner.post("/api/v1/deployments", body)
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "endpoint_url: 169.254.169.254 is neither host rtx-pro-6000 nor in "
        "MOEOPS_ENDPOINT_ALLOWLIST (localhost, 127.0.0.0/8, ::1)"
    )
    assert not Deployment.objects.filter(name="probe").exists()
    patch = world.host_worker.patch("/api/v1/deployments/glm-5-sglang", {"endpoint_url": METADATA})
    assert patch.status_code == 400
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:30000", True),
        ("http://localhost:8000/", True),
        ("http://localhost:8000/v1", False),
        ("http://[::1]:8000", True),
        ("http://rtx-pro-6000:8000", True),
        ("http://RTX-PRO-6000.:8000", True),
        ("http://10.1.2.3:8000", True),
        ("http://gpu7.lab.example:8000", True),
        ("http://lab.example.evil:8000", False),
        ("http://10.0.0.1@169.254.169.254/", False),
        ("http://h200-lab:8000", False),
        ("file:///etc/passwd", False),
        ("http://127.0.0.1:99999", False),
    ],
)
def test_it_allows_the_host_and_the_allow_list_only(world, settings, url, allowed):
    settings.MOEOPS_ENDPOINT_ALLOWLIST = ["localhost", "127.0.0.0/8", "::1", "10.0.0.0/8"]
    settings.MOEOPS_ENDPOINT_ALLOWLIST += [".lab.example"]
    response = world.owner.patch("/api/v1/deployments/glm-5-sglang", {"endpoint_url": url})
    assert (response.status_code == 200) is allowed, response.json()


def test_only_staff_point_a_deployment_at_a_new_address(world):
    member, staff = _browser(staff=False), _browser(staff=True)
    response = _edit(member, world.deployment, "http://127.0.0.1:6379")
    assert response.status_code == 200
    assert "Only staff may point a deployment at a new endpoint address." in response.text
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"
    # the address it has, or none, a member may keep or clear
    assert _edit(member, world.deployment, "http://127.0.0.1:30000/").status_code == 302
    assert _edit(staff, world.deployment, "http://127.0.0.1:30001").status_code == 302
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30001"
    response = _edit(staff, world.deployment, METADATA)
    assert "169.254.169.254 is neither host rtx-pro-6000" in response.text


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("http://rtx-pro-6000:8000", "http://rtx-pro-6000:8000"),
        ("rtx-pro-6000:8000/", "http://rtx-pro-6000:8000/"),
        ("https://RTX-PRO-6000:8443", "https://RTX-PRO-6000:8443"),
    ],
)
def test_the_form_takes_the_host_by_its_bare_name(world, typed, stored):
    # a host's own name often has no dot, and an engine's URL is often typed without http://
    response = _edit(_browser(staff=True), world.deployment, typed)
    assert response.status_code == 302, response.text
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == stored


def test_the_form_names_what_is_wrong_with_an_endpoint_that_is_no_url(world):
    response = _edit(_browser(staff=True), world.deployment, "http://rtx-pro-6000:99999")
    assert response.status_code == 200
    assert "is not a URL (Port out of range 0-65535)" in response.text
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        (
            "http://127.0.0.1:18100/v1",
            "The endpoint is the server's base URL, without /v1 or another path: "
            "http://127.0.0.1:18100.",
        ),
        ("rtx-pro-6000:8000/?next=http://x", "without /v1 or another path"),
        ("not a url at all", "'not a url at all' is neither a host name nor an IP address."),
    ],
)
def test_the_form_refuses_a_path_or_text_that_is_no_url_saying_what_to_give(world, typed, shown):
    response = _edit(_browser(staff=True), world.deployment, typed)
    assert response.status_code == 200
    assert shown in html.unescape(response.text)
    assert "MOEOPS_ENDPOINT_ALLOWLIST" not in response.text
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "http://127.0.0.1:18100/v1",
            "endpoint_url: the endpoint is the server's base URL, without /v1 or another path: "
            "http://127.0.0.1:18100",
        ),
        (
            "http://not a url at all",
            "endpoint_url: 'not a url at all' is neither a host name nor an IP address",
        ),
    ],
)
def test_the_api_refuses_a_path_or_text_that_is_no_url(world, url, shown):
    body = {"name": "probe", "model": "GLM-5", "host": "rtx-pro-6000", "endpoint_url": url}
    created = world.owner.post("/api/v1/deployments", body)
    assert (created.status_code, created.json()["detail"]) == (400, shown)
    patched = world.owner.patch("/api/v1/deployments/glm-5-sglang", {"endpoint_url": url})
    assert (patched.status_code, patched.json()["detail"]) == (400, shown)
    assert Deployment.objects.count() == 2
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"


def test_an_endpoint_stored_before_the_rule_is_neither_swept_nor_checked(world):
    Deployment.objects.filter(pk=world.deployment.pk).update(endpoint_url=METADATA)
    world.deployment.refresh_from_db()
    with pytest.raises(ValidationError) as caught:
        run_services.run_start(
            deployment=world.deployment,
            parameters={"levels": [8], "input_len": 8, "output_len": 8},
        )
    assert list(caught.value.message_dict) == ["endpoint_url"]
    assert not SweepRun.objects.exists()
    with pytest.raises(ValidationError):
        fleet_services.deployment_check_enqueue(deployment=world.deployment, trigger="manual")
    assert check_deployments() == []


def test_the_admin_holds_the_endpoint_to_the_same_rule(world, rf, admin_user):
    request = rf.get("/admin/")
    request.user = admin_user
    form_class = site._registry[Deployment].get_form(request, world.deployment)
    form_data = {
        "name": world.deployment.name,
        "model": world.deployment.model_id,
        "host": world.deployment.host_id,
        "engine": world.deployment.engine,
        "tp": 1,
        "ep": 1,
        "launch_args": "{}",
        "management": "external",
        "status": world.deployment.status,
    }
    refused = form_class({**form_data, "endpoint_url": METADATA}, instance=world.deployment)
    assert not refused.is_valid()
    assert refused.errors["endpoint_url"] == [
        "169.254.169.254 is neither host rtx-pro-6000 nor in MOEOPS_ENDPOINT_ALLOWLIST "
        "(localhost, 127.0.0.0/8, ::1)."
    ]
    with_path = form_class(
        {**form_data, "endpoint_url": "http://rtx-pro-6000:8000/v1"}, instance=world.deployment
    )
    assert with_path.errors["endpoint_url"] == [
        "The endpoint is the server's base URL, without /v1 or another path: "
        "http://rtx-pro-6000:8000."
    ]
    bare = form_class(
        {**form_data, "endpoint_url": "http://rtx-pro-6000:8000"}, instance=world.deployment
    )
    assert bare.is_valid(), bare.errors


# read as 127.0.0.1 by httpx, as the metadata address by urllib3 and browsers
SPLIT_READINGS = [
    "http://169.254.169.254\\@127.0.0.1/",
    "http://169.254.169.254:80@127.0.0.1/",
    "http://user:pw@127.0.0.1:30000",
    "http://127.0.0.1:30000\\",
    "http://127.0.0.1:3\t0000",
]


@pytest.mark.parametrize("url", SPLIT_READINGS)
def test_an_endpoint_that_clients_read_differently_is_refused(world, url):
    body = {"name": "probe", "model": "GLM-5", "host": "rtx-pro-6000", "endpoint_url": url}

    created = world.owner.post("/api/v1/deployments", body)
    patched = world.owner.patch("/api/v1/deployments/glm-5-sglang", {"endpoint_url": url})

    assert (created.status_code, patched.status_code) == (400, 400)
    assert created.json()["detail"].startswith("endpoint_url: the URL holds ")
    assert not Deployment.objects.filter(name="probe").exists()
    world.deployment.refresh_from_db()
    assert world.deployment.endpoint_url == "http://127.0.0.1:30000"


@pytest.mark.parametrize("url", SPLIT_READINGS)
def test_a_webhook_that_clients_read_differently_is_refused(world, url):
    body = {"name": "hook", "kind": "webhook", "url": url}

    answer = world.owner.post("/api/v1/alert-channels", body)

    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("url: the URL holds ")
    assert not AlertChannel.objects.exists()
