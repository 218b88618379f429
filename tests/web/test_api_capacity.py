"""A capacity search through the API: started with POST /api/v1/runs (kind "capacity" and an SLO
profile), bad input refused naming the field, the answer read on the run once it ends."""

import pytest

from moeops import jobs
from moeops.fleet.models import SLOProfile
from moeops.runs import services
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests import queues
from tests.api_base import make_serving_world

QUEUE = "host.rtx-pro-6000"
SEARCH = {"kind": "capacity", "slo_profile": "chat", "start": 4, "input_len": 64, "output_len": 64}


@pytest.fixture
def world(db):
    world = make_serving_world("glm-5", on_gpus=True)
    world.profile = SLOProfile.objects.create(
        name="chat", ttft_percentile="p99", ttft_ms=500.0, tpot_percentile="p99", tpot_ms=50.0
    )
    return world


def _start(**parameters):
    return {
        "deployment": "glm-5-sglang",
        "parameters": {**SEARCH, **parameters},
        "start": True,
    }


def test_it_starts_a_search_with_the_profiles_limits(
    world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = world.owner.post("/api/v1/runs", _start(end=256))
    assert response.status_code == 201, response.json()
    run = SweepRun.objects.get()
    assert run.is_capacity_search
    assert run.parameters["slo"] == {
        "profile": "chat",
        "limits": {"ttft": ["p99", 500.0], "tpot": ["p99", 50.0]},
        "max_failed_percent": 1.0,
    }
    assert (run.parameters["rounds"], run.parameters["mode"]) == (3, "concurrency")
    # the per-request limits of the load generator's goodput
    assert (run.parameters["slo_ttft_ms"], run.parameters["slo_tpot_ms"]) == (500.0, 50.0)
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["kind"] == "capacity" and task.kwargs["end"] == 256
    assert response.json()["capacity"] is None


def test_a_search_without_an_end_grows_no_further_than_a_worker_holds_streams(world, broker):
    response = world.owner.post("/api/v1/runs", _start())
    assert response.json()["parameters"]["end"] == 65536


def test_the_profile_may_be_named_by_id_or_left_to_the_deployments_default(world, broker):
    by_id = world.owner.post("/api/v1/runs", _start(slo_profile=str(world.profile.pk)))
    assert by_id.status_code == 201
    world.deployment.default_slo_profile = world.profile
    world.deployment.save()
    parameters = {k: v for k, v in SEARCH.items() if k != "slo_profile"}
    default = world.owner.post(
        "/api/v1/runs", {"deployment": "glm-5-sglang", "parameters": parameters, "start": True}
    )
    assert default.status_code == 201
    assert default.json()["parameters"]["slo"]["profile"] == "chat"


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"slo_profile": None}, "parameters.slo_profile: a capacity search needs an SLO profile"),
        ({"slo_profile": "nobody"}, "parameters.slo_profile: no SLO profile 'nobody'"),
        ({"rounds": 0}, "parameters.rounds: "),
        ({"start": 64, "end": 32}, "parameters.end: The end (32) must not be below the start"),
        ({"start": None}, "parameters.start: "),
        ({"start": 2.5}, "parameters.start: The start must be a whole number"),
        ({"mode": "request_rate", "start": 0}, "parameters.start: "),
        ({"mode": "speed"}, "parameters.mode: "),
        ({"budget": 1}, "parameters.budget: "),
        ({"start": 70000}, "parameters.start: at most 65536 concurrent requests"),
    ],
)
def test_bad_input_is_refused_naming_the_field(world, broker, parameters, field):
    response = world.owner.post("/api/v1/runs", _start(**parameters))
    assert response.status_code == 400
    assert response.json()["detail"].startswith(field), response.json()
    assert not SweepRun.objects.exists()
    assert queues.queued(broker, QUEUE) == []


def _level(run, concurrency, p99_tpot_ms, rounds=(0.9, 1.0, 1.1)):
    for number, factor in enumerate(rounds, 1):
        pb.capacity_round(
            run,
            number,
            concurrency,
            p99_tpot_ms * factor,
            1_800_000_000.0 + 100 * concurrency + number,
            output_throughput=100.0 * concurrency * factor,
            p99_ttft_ms=100.0,
        )


def test_the_answer_is_read_on_the_run_once_it_ends(world, broker):
    created = world.owner.post("/api/v1/runs", _start())
    run = SweepRun.objects.get(pk=created.json()["id"])
    worker = world.host_worker
    assert worker.patch(f"/api/v1/runs/{run.uuid}", {"status": "running"}).status_code == 200
    for concurrency, tpot in ((4, 20.0), (8, 30.0), (16, 70.0), (12, 40.0), (14, 60.0), (13, 46.0)):
        _level(run, concurrency, tpot)
    assert worker.patch(f"/api/v1/runs/{run.uuid}", {"status": "succeeded"}).status_code == 200
    answer = world.owner.get(f"/api/v1/runs/{run.uuid}").json()["capacity"]
    # 13's TPOT p99 rounds are 41.4, 46, 50.6 ms: their interval's upper end is over 50 ms
    assert answer["load"] == 12 and answer["bracket"] == [12, 13]
    assert answer["load_on_medians"] == 13
    assert answer["binding"]["metric"] == "tpot"
    assert answer["binding"]["sentence"].endswith(" at 12 concurrent, limit 50 ms")
    point = answer["at_capacity"]
    assert point["output_throughput"] == pytest.approx(1200.0)
    assert point["per_gpu"] == pytest.approx(600.0)
    assert point["per_user"] == pytest.approx(1000 / 20.0)
    assert point["output_throughput_interval"][0] < 1200.0 < point["output_throughput_interval"][1]
    assert [p["load"] for p in answer["probes"]] == [4, 8, 12, 13, 14, 16]


def test_a_search_that_ends_without_its_worker_still_gets_its_answer(world, broker):
    created = world.owner.post("/api/v1/runs", _start())
    run = SweepRun.objects.get(pk=created.json()["id"])
    services.run_transition(run=run, status="running")
    for concurrency, tpot in ((4, 20.0), (8, 30.0), (16, 70.0)):
        _level(run, concurrency, tpot)
    # the worker is gone: the reaper, not the worker, ends the run
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": 0.0})
    assert services.run_fail_stale() == 1
    run.refresh_from_db()
    assert run.status == "failed" and not run.capacity

    jobs.job_finished("runs.sweeprun", run.pk)

    answer = world.owner.get(f"/api/v1/runs/{run.uuid}").json()["capacity"]
    assert answer["load"] == 8 and answer["bracket"] == [8, 16]
    assert [p["load"] for p in answer["probes"]] == [4, 8, 16]
