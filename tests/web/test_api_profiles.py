"""A profiled level pushed by the worker (POST /api/v1/runs/{ref}/profiles) and read back: stored
once per (run, level, attempt), a repeat 200, another body 409 naming the key, a finished run
closed to new ones as to new levels, a bad body a 4xx naming the field."""

import json

import pytest

from moeops.runs.keys import level_key
from moeops.runs.models import LevelProfile
from tests import step_breakdowns as sb
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def _push(client, run, body):
    data = body.model_dump(mode="json") if hasattr(body, "model_dump") else body
    return client.post(f"/api/v1/runs/{run.uuid}/profiles", data)


def test_it_stores_a_profile_once_and_answers_a_repeat_with_200(world):
    run = world.run(status="running")
    body = sb.captured(64)

    first, again = _push(world.host_worker, run, body), _push(world.host_worker, run, body)

    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    profile = LevelProfile.objects.get()
    assert (profile.key, profile.status, profile.steps_asked) == (
        level_key(64, None),
        "captured",
        40,
    )
    assert profile.step_breakdown() == body.breakdown
    assert first.json()["breakdown"]["ranks"][1]["rank"] == 1
    assert first.json()["cost"]["ratio"] == 1.4


def test_another_body_under_the_same_key_is_a_409_naming_the_key(world):
    run = world.run(status="running")
    _push(world.host_worker, run, sb.captured(64))

    other = _push(world.host_worker, run, sb.captured(64, shares={"moe": 0.6}))

    assert other.status_code == 409
    assert other.json()["detail"].startswith(
        f"profile of level c=64,r=inf of run {run.uuid}, attempt 1, is already stored with "
        "another body"
    )


def test_a_new_attempt_stores_a_profile_of_its_own(world):
    run = world.run(status="running")
    _push(world.host_worker, run, sb.captured(64))

    second = _push(world.host_worker, run, sb.captured(64, shares={"moe": 0.6}, attempt=2))

    assert second.status_code == 201
    listed = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles").json()
    assert [(p["concurrency"], p["attempt"]) for p in listed] == [(64, 2)]


def test_a_finished_run_takes_no_new_profile_but_a_repeat(world):
    run = world.run(status="running")
    body = sb.captured(64)
    _push(world.host_worker, run, body)
    run.status = "succeeded"
    run.save()

    again = _push(world.host_worker, run, body)
    new = _push(world.host_worker, run, sb.captured(128))

    assert again.status_code == 200
    assert new.status_code == 409
    assert new.json()["detail"] == (
        f"run {run.uuid} is succeeded: a finished run takes no more profiles"
    )


def test_an_unavailable_profile_keeps_its_reason(world):
    run = world.run(status="running")

    answer = _push(world.host_worker, run, sb.unavailable(64))

    assert answer.status_code == 201
    assert answer.json()["status"] == "unavailable"
    assert "--profiler-config" in answer.json()["reason"]
    assert answer.json()["breakdown"] is None


@pytest.mark.parametrize(
    "change, field",
    [
        ({"status": "captured", "breakdown": None}, "breakdown: a captured profile holds"),
        ({"status": "failed", "reason": ""}, "reason: a profile failed says why"),
    ],
)
def test_a_status_its_content_contradicts_is_a_400_naming_the_field(world, change, field):
    run = world.run(status="running")
    body = {**sb.unavailable(64).model_dump(mode="json"), **change}

    answer = _push(world.host_worker, run, body)

    assert answer.status_code == 400
    assert answer.json()["detail"].startswith(field)
    assert not LevelProfile.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"concurrency": 0}, "concurrency:"),
        ({"status": "partly"}, "status:"),
        ({"steps_asked": None}, "steps_asked:"),
        ({"extra": 1}, "extra:"),
    ],
)
def test_a_bad_body_is_a_422_naming_the_field(world, change, field):
    run = world.run(status="running")

    answer = _push(world.host_worker, run, {**sb.captured(64).model_dump(mode="json"), **change})

    assert answer.status_code == 422
    assert answer.json()["message"].startswith(field)


def test_a_bad_class_share_deep_in_the_breakdown_is_named_by_its_path(world):
    run = world.run(status="running")
    body = sb.captured(64).model_dump(mode="json")
    body["breakdown"]["ranks"][0]["kinds"][0]["classes"][2]["share"] = -1

    answer = _push(world.host_worker, run, body)

    assert answer.status_code == 422
    assert answer.json()["message"].startswith("breakdown.ranks.0.kinds.0.classes.2.share:")


def test_another_hosts_worker_may_not_push_a_profile(world):
    run = world.run(status="running")

    answer = _push(world.outsider, run, sb.captured(64))

    assert answer.status_code == 403
    assert not LevelProfile.objects.exists()


def test_a_level_profile_is_read_by_its_concurrency(world):
    run = world.run(status="running")
    _push(world.host_worker, run, sb.captured(64))
    _push(world.host_worker, run, sb.unavailable(128))

    one = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles/128")
    none = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles/32")
    listed = world.read_only.get(f"/api/v1/runs/{run.pk}/profiles")

    assert one.status_code == 200 and one.json()["status"] == "unavailable"
    assert none.status_code == 404
    assert none.json()["detail"] == f"run {run.uuid} has no profile of level c=32,r=inf"
    assert [p["concurrency"] for p in listed.json()] == [64, 128]


def test_a_rate_levels_profile_is_read_with_its_rate(world):
    run = world.run(status="running")
    _push(world.host_worker, run, sb.captured(64, request_rate=4.0))

    asked = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles/64?request_rate=4")
    unlimited = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles/64")

    assert asked.status_code == 200 and asked.json()["request_rate"] == 4.0
    assert unlimited.status_code == 404


def test_a_profile_does_not_change_the_runs_peak(world):
    run = world.run(status="running")
    world.host_worker.post(
        f"/api/v1/runs/{run.uuid}/levels",
        {"concurrency": 64, "completed": 32, "duration": 4.0, "output_throughput": 1148.0},
    )
    body = sb.captured(64, cost={"profiled_tok_s": 5000.0, "unprofiled_tok_s": 1148.0})
    _push(world.host_worker, run, body)

    summary = world.read_only.get(f"/api/v1/runs/{run.uuid}").json()

    assert summary["peak_output_throughput"] == 1148.0
    assert summary["level_count"] == 1


@pytest.mark.parametrize(
    "where, value, said",
    [
        ("reason", "a\x00b", "reason: must not contain the NUL character"),
        ("window_s", float("inf"), "window_s: must not be NaN or Infinity"),
    ],
)
def test_what_jsonb_refuses_is_a_422_naming_its_place(world, where, value, said):
    run = world.run(status="running")
    body = {**sb.unavailable(64).model_dump(mode="json"), where: value}
    raw = json.dumps(body)

    answer = world.host_worker.post(f"/api/v1/runs/{run.uuid}/profiles", raw=raw)

    assert answer.status_code == 422
    assert answer.json()["message"].endswith(f": {said}")
    assert not LevelProfile.objects.exists()


def _finished_sweep(world):
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save(update_fields=["endpoint_url"])
    run = world.run(
        status="succeeded",
        source="worker",
        label="plateau",
        parameters={"levels": [8, 64], "input_len": 128, "output_len": 128, "seed": 3},
    )
    for concurrency, tok_s in ((8, 700.0), (64, 912.0)):
        run.levels.create(
            concurrency=concurrency, key=level_key(concurrency, None), output_throughput=tok_s
        )
    return run


def test_profile_again_queues_one_level_of_the_load_profiled(world):
    run = _finished_sweep(world)

    response = world.owner.post(f"/api/v1/runs/{run.uuid}/profile-again", {"steps": 25})

    assert response.status_code == 201, response.content
    again = world.deployment.runs.exclude(pk=run.pk).get()
    assert json.loads(response.content)["uuid"] == str(again.uuid)
    assert (again.status, again.parameters["levels"]) == ("queued", [64])
    assert again.parameters["profile"] == {"levels": [64], "steps": 25}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"concurrency": 32}, "concurrency", "swept [8, 64], not 32"),
        ({"concurrency": 0}, "concurrency", "greater than or equal to 1"),
        ({"steps": 100_000}, "steps", "less than or equal to 1000"),
    ],
)
def test_profile_again_refuses_a_level_or_window_it_cannot_run(world, body, field, words):
    run = _finished_sweep(world)

    response = world.owner.post(f"/api/v1/runs/{run.uuid}/profile-again", body)

    assert response.status_code in (400, 422)
    text = response.content.decode()
    assert field in text and words in text
    assert world.deployment.runs.count() == 1
