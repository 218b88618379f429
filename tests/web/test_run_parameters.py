"""One schema for a run's parameters (moeops.runs.parameters): the API, sweeps started through
run_start, imported files and the example data all write what the pages and the worker read."""

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from moeops.examples import load_example_data
from moeops.runs import services
from moeops.runs.models import SweepRun
from moeops.runs.parameters import parameters_checked
from tests import page_base as pb
from tests.api_base import make_serving_world
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
SGLANG_AGG = "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
SWEEP = {"levels": [32, 64], "input_len": 1024, "output_len": 256}


@pytest.fixture
def world(db):
    return make_serving_world()


@pytest.fixture
def member():
    browser = Client()
    pb.sign_in(browser)
    return browser


def _pages_answer(browser, run):
    """The pages that read a run's parameters: the dashboard, its deployment's, its own."""
    for path in (
        "/",
        f"/deployments/{run.deployment_id}/",
        f"/runs/{run.uuid}/",
        f"/runs/{run.uuid}/status.json",
        "/runs/",
    ):
        assert browser.get(path).status_code == 200, path


def test_it_rejects_levels_given_as_a_count(world, member):
    response = world.owner.post(
        "/api/v1/runs", {"deployment": "glm-5-sglang", "parameters": {"levels": 5}}
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("parameters.levels: ")
    assert not SweepRun.objects.exists()
    assert member.get("/").status_code == 200


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"levels": [32, 32]}, "parameters.levels: each concurrency once"),
        ({"levels": [32.5]}, "parameters.levels: 0: "),
        ({"input_len": "1024"}, "parameters.input_len: "),
        ({"output_len": 2**40}, "parameters.output_len: "),
        ({"prompts_per_level": -1}, "parameters.prompts_per_level: "),
        ({"endpoint": "grpc"}, "parameters.endpoint: "),
        ({"request_rate": -1}, "parameters.request_rate: "),
        ({"gpu_indices": ["0"]}, "parameters.gpu_indices: 0: "),
        ({"seed": int("9" * 400)}, "parameters.seed: "),
        ({"seed": -1}, "parameters.seed: "),
        ({"seed": "7"}, "parameters.seed: "),
        ({"note": {"deep": "a\x00b"}}, "parameters: note.deep: must not contain"),
        ([32, 64], "parameters: "),
    ],
)
def test_it_rejects_parameters_of_the_wrong_type(world, parameters, named):
    response = world.owner.post(
        "/api/v1/runs", {"deployment": "glm-5-sglang", "parameters": parameters}
    )
    assert response.status_code in (400, 422)
    detail = response.json().get("message") or response.json()["detail"]
    assert detail.startswith(named), detail
    assert not SweepRun.objects.exists()


def test_it_keeps_valid_parameters_and_keys_it_does_not_know(world):
    parameters = {**SWEEP, "prompts_per_level": 64, "endpoint": "chat", "note": "after upgrade"}
    response = world.owner.post(
        "/api/v1/runs", {"deployment": "glm-5-sglang", "parameters": parameters}
    )
    assert response.status_code == 201
    assert SweepRun.objects.get().parameters == parameters


def test_it_rejects_a_sweep_started_with_parameters_the_worker_cannot_run(world):
    with pytest.raises(ValidationError) as caught:
        services.run_start(deployment=world.deployment, parameters={**SWEEP, "warmup": -1})
    assert list(caught.value.message_dict) == ["parameters.warmup"]
    assert not SweepRun.objects.exists()


def test_each_started_run_draws_its_own_prompts_unless_given_a_seed(world):
    started = [services.run_start(deployment=world.deployment, parameters=SWEEP)[0] for _ in "ab"]
    seeds = [run.parameters["seed"] for run in started]
    assert seeds[0] != seeds[1]
    # a load repeated from a run (a re-sweep, a measurement again) draws its own as well
    again = services.repeated_load(started[0].parameters)
    assert "seed" not in again and again["levels"] == SWEEP["levels"]
    assert (
        services.run_start(deployment=world.deployment, parameters=again)[0].parameters["seed"]
        not in seeds
    )
    given = services.run_start(deployment=world.deployment, parameters={**SWEEP, "seed": 7})[0]
    assert given.parameters["seed"] == 7


def test_an_imported_runs_pages_answer(world, member):
    body = {
        "format": "sglang",
        "deployment": "glm-5-sglang",
        "content": (RESULTS / SGLANG_AGG).read_text(),
        "file_name": SGLANG_AGG,
        "accept_mismatch": True,
    }
    response = world.owner.post("/api/v1/runs/import", body)
    assert response.status_code == 201
    run = SweepRun.objects.get()
    assert run.parameters["format"] == "sglang" and "levels" not in run.parameters
    _pages_answer(member, run)


def test_the_pages_of_a_run_stored_with_a_level_count_still_answer(world, member):
    # written by imports before the schema: parameters.levels was the number of levels
    run = world.run(status="succeeded", source="import", parameters={"levels": 5})
    _pages_answer(member, run)
    running = world.run(status="running", parameters={"levels": 5})
    assert (
        member.get(f"/runs/{running.uuid}/status.json").json()["progress"]["levels_total"] is None
    )


def test_the_example_data_hold_valid_parameters(db):
    load_example_data()
    for run in SweepRun.objects.all():
        assert parameters_checked(run.parameters) == run.parameters
