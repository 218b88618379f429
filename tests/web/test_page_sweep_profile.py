"""A sweep that profiles some of its levels: the deployment page's "Profile levels" and "Profile
steps" reach the worker in the sweep task's parameters; a level that is not one of the sweep's
is refused on its field, and through the API with a 400 naming parameters.profile.levels."""

import html

import pytest

from moeops.runs import services as run_services
from moeops.runs.keys import level_key
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests.api_base import make_world

pytestmark = pytest.mark.django_db

FORM = pb.sweep_form("profiled", "8, 64", input_len=128, output_len=128, prompts_per_level=128)


@pytest.fixture
def deployment(client):
    return pb.deployment_signed_in(client)


def test_the_profile_levels_reach_the_worker_in_the_task(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    form = {**FORM, "profile_levels": "64", "profile_steps": "25"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/deployments/{deployment.pk}/sweep/", form)

    assert response.status_code == 302
    run = SweepRun.objects.get()
    assert run.parameters["profile"] == {"levels": [64], "steps": 25}
    ((name, _, kwargs),) = sent
    assert name == "run_sweep"
    assert kwargs["profile"] == {"levels": [64], "steps": 25}


def test_profile_levels_left_empty_profile_nothing(client, deployment, sent):
    client.post(f"/deployments/{deployment.pk}/sweep/", {**FORM, "profile_steps": "40"})

    assert "profile" not in SweepRun.objects.get().parameters


def test_the_steps_default_to_40(client, deployment, sent):
    client.post(f"/deployments/{deployment.pk}/sweep/", {**FORM, "profile_levels": "8"})

    assert SweepRun.objects.get().parameters["profile"] == {"levels": [8], "steps": 40}


def test_a_level_the_sweep_does_not_run_is_refused_on_its_field(client, deployment, sent):
    response = client.post(
        f"/deployments/{deployment.pk}/sweep/", {**FORM, "profile_levels": "32,64"}
    )

    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "profile_levels: 32 is not among the sweep's levels (8, 64)" in page
    assert not SweepRun.objects.exists() and sent == []


def test_the_form_says_what_profiling_costs(client, deployment):
    page = html.unescape(pb.form_html(client, deployment, "sweep"))

    assert "Profile levels" in page and "Profile steps" in page
    assert "a pass of its own that costs time" in page
    assert "needs an engine started with the profiler" in page


def test_the_api_names_parameters_profile_levels(db, monkeypatch):
    world = make_world()
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save()
    monkeypatch.setattr(run_services, "send_host_task", lambda *args, **kwargs: None)
    parameters = {"levels": [8, 64], "input_len": 128, "output_len": 128}

    response = world.owner.post(
        "/api/v1/runs",
        {
            "deployment": "glm-5-sglang",
            "start": True,
            "parameters": {**parameters, "profile": {"levels": [128]}},
        },
    )

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "parameters.profile.levels: 128 is not among the sweep's levels (8, 64)"
    )


def _swept(client, deployment, sent, django_capture_on_commit_callbacks, throughputs):
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/deployments/{deployment.pk}/sweep/", FORM)
    run = SweepRun.objects.get()
    for concurrency, tok_s in throughputs.items():
        run.levels.create(
            concurrency=concurrency,
            key=level_key(concurrency, None),
            output_throughput=tok_s,
            completed=128,
        )
    run.status = "succeeded"
    run.save(update_fields=["status"])
    sent.clear()
    return run


def test_look_inside_the_step_sweeps_the_peak_level_again_profiled(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    run = _swept(
        client, deployment, sent, django_capture_on_commit_callbacks, {8: 900.0, 64: 912.0}
    )
    page = client.get(f"/runs/{run.uuid}/").content.decode()
    assert "Look inside the step" in page

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.uuid}/profile/", {"concurrency": ""})

    again = SweepRun.objects.exclude(pk=run.pk).get()
    assert response.url == f"/runs/{again.uuid}/"
    assert again.parameters["levels"] == [64]
    assert again.parameters["profile"] == {"levels": [64], "steps": 40}
    # the same load otherwise, with prompts of its own
    assert {k: again.parameters[k] for k in ("input_len", "output_len", "warmup")} == {
        "input_len": 128,
        "output_len": 128,
        "warmup": 8,
    }
    assert again.parameters["seed"] != run.parameters["seed"]
    assert again.label == "profiled: inside the step at 64"
    ((name, _, kwargs),) = sent
    assert (name, kwargs["profile"]) == ("run_sweep", {"levels": [64], "steps": 40})


def test_look_inside_the_step_at_a_level_the_run_did_not_sweep_says_so(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    run = _swept(client, deployment, sent, django_capture_on_commit_callbacks, {8: 900.0})

    response = client.post(f"/runs/{run.uuid}/profile/", {"concurrency": "32"}, follow=True)

    assert SweepRun.objects.count() == 1
    assert "swept [8, 64], not 32" in html.unescape(response.content.decode())
