"""Bad values the API once answered with a 500: each is a 4xx naming the field, nothing saved."""

import pytest

from moeops.fleet.models import Deployment
from moeops.kernels.models import TuningRun
from moeops.watches import services as watch_services
from moeops.watches.models import AlertChannel, Watch
from tests.api_base import make_world

LOAD = {"levels": [4, 8], "input_len": 16, "output_len": 32, "prompts_per_level": 8}


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def watch(world):
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save()
    return watch_services.watch_create(
        deployment=world.deployment, name="nightly", parameters=LOAD, cron="0 3 * * *"
    )


def test_a_watch_may_not_be_enabled_null(world, watch):
    answer = world.owner.patch(f"/api/v1/watches/{watch.pk}", {"enabled": None})

    assert answer.status_code == 422
    assert answer.json()["message"] == "body: enabled may not be null"
    watch.refresh_from_db()
    assert watch.enabled is True


def test_a_watch_may_drop_its_quiet_window(world, watch):
    Watch.objects.filter(pk=watch.pk).update(window_start="01:00", window_end="05:00")

    answer = world.owner.patch(
        f"/api/v1/watches/{watch.pk}", {"window_start": None, "window_end": None}
    )

    assert answer.status_code == 200 and answer.json()["window_start"] is None


def test_an_alert_channel_may_not_be_enabled_null(world):
    channel = AlertChannel.objects.create(name="oncall", kind="email", recipients=["a@b.example"])

    answer = world.owner.patch("/api/v1/alert-channels/oncall", {"enabled": None})

    assert answer.status_code == 422
    assert answer.json()["message"] == "body: enabled may not be null"
    channel.refresh_from_db()
    assert channel.enabled is True


@pytest.mark.parametrize("bad", ["\ud800", "glm\x00"])
def test_a_watch_naming_its_deployment_with_text_no_database_stores_is_refused(world, bad):
    body = {"deployment": bad, "name": "n", "parameters": LOAD, "schedule": {"every_hours": 6}}

    answer = world.owner.post("/api/v1/watches", body)

    assert answer.status_code == 422
    assert answer.json()["message"].startswith("deployment: ")
    assert not Watch.objects.exists()


def test_an_alert_channel_naming_its_deployment_with_a_lone_surrogate_is_refused(world):
    body = {
        "name": "oncall",
        "kind": "email",
        "recipients": ["a@b.example"],
        "deployment": "\udfff",
    }

    answer = world.owner.post("/api/v1/alert-channels", body)

    assert answer.status_code == 422
    assert answer.json()["message"].startswith("deployment: ")
    assert not AlertChannel.objects.exists()


def test_a_workload_name_with_nul_is_refused_or_not_found(world):
    listed = world.read_only.get("/api/v1/workloads?name=a%00b")
    one = world.read_only.get("/api/v1/workloads/a%00b")

    assert listed.status_code == 422 and listed.json()["message"].startswith("name: must ")
    assert one.status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tp": True}, "tp"),
        ({"tp": "4"}, "tp"),
        ({"max_running_requests": 0}, "max_running_requests"),
    ],
)
def test_a_deployment_number_given_as_another_type_or_a_cap_of_zero_is_refused(
    world, change, field
):
    body = {"name": "probe", "model": "GLM-5", "host": "rtx-pro-6000", **change}

    answer = world.owner.post("/api/v1/deployments", body)

    assert answer.status_code == 422
    assert answer.json()["message"].startswith(f"{field}: ")
    assert not Deployment.objects.filter(name="probe").exists()


def test_a_running_request_cap_of_zero_is_refused_on_patch(world):
    answer = world.owner.patch("/api/v1/deployments/glm-5-sglang", {"max_running_requests": 0})

    assert answer.status_code == 422
    assert answer.json()["message"].startswith("max_running_requests: ")
    world.deployment.refresh_from_db()
    assert world.deployment.max_running_requests is None


def test_a_tuning_run_E_given_as_text_is_refused(world):
    body = {"host": "rtx-pro-6000", "E": "12", "N": 256, "hidden_size": 6144, "topk": 8}

    answer = world.host_worker.post("/api/v1/tuning-runs", body)

    assert answer.status_code == 422 and answer.json()["message"].startswith("E: ")
    assert not TuningRun.objects.exists()
