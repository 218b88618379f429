"""Levels of several rounds: stored per round through the API, merged into the level's median
and interval, shown on the run page, its charts and its CSV; rounds refused out of bounds."""

import csv
import html
import io
import json

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from domain.intervals import median_interval
from moeops.runs import measurements
from moeops.runs import services as run_services
from moeops.runs.models import LevelResult, LevelRound, SweepRun
from tests import page_base as pb
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


def _round(throughput, p99_tpot, started):
    return {
        "concurrency": 8,
        "completed": 64,
        "failed": 0,
        "duration": 10.0,
        "total_output_tokens": 8192,
        "output_throughput": throughput,
        "median_tpot_ms": p99_tpot / 2,
        "p99_tpot_ms": p99_tpot,
        "usage_reported": True,
        "started_at": started,
        "finished_at": started + 10.0,
        "errors": {},
    }


ROUNDS = [
    _round(1200.0, 40.0, 1.7e9),
    _round(1000.0, 60.0, 1.7e9 + 20),
    _round(1100.0, 50.0, 1.7e9 + 40),
]


def _push(world, run, n, body=None):
    body = {**(body or ROUNDS[n - 1]), "round": n}
    return world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", body)


def test_each_round_of_a_level_is_stored_once_and_the_level_is_their_median(world):
    run = world.run(status="running")
    first = _push(world, run, 1)
    assert first.status_code == 201
    assert first.json()["rounds"] == [1] and first.json()["intervals"] == {}
    second = _push(world, run, 2)
    assert second.status_code == 201 and second.json()["id"] == first.json()["id"]
    assert second.json()["rounds"] == [1, 2]
    # the same round and body again: a repeat, nothing stored
    again = _push(world, run, 2)
    assert again.status_code == 200 and again.json()["rounds"] == [1, 2]
    assert _push(world, run, 3).status_code == 201
    assert LevelResult.objects.count() == 1 and LevelRound.objects.count() == 3

    (level,) = world.read_only.get(f"/api/v1/runs/{run.pk}/levels").json()
    assert level["rounds"] == [1, 2, 3] and level["round"] == 3
    assert level["output_throughput"] == 1100.0 and level["p99_tpot_ms"] == 50.0
    assert level["completed"] == 192 and level["duration"] == 30.0
    assert level["intervals"]["output_throughput"] == pytest.approx(
        median_interval([1200.0, 1000.0, 1100.0])
    )
    assert level["intervals"]["p99_tpot_ms"] == pytest.approx(median_interval([40.0, 60.0, 50.0]))
    stored = LevelRound.objects.get(round=2)
    assert stored.figures["output_throughput"] == 1000.0


def test_a_round_sent_again_with_another_body_is_a_409_naming_it(world):
    run = world.run(status="running")
    assert _push(world, run, 1).status_code == 201
    assert _push(world, run, 2).status_code == 201
    changed = _push(world, run, 2, {**ROUNDS[1], "output_throughput": 999.0})
    assert changed.status_code == 409
    assert "round 2" in changed.json()["detail"]
    assert LevelRound.objects.get(round=2).figures["output_throughput"] == 1000.0


def test_a_level_stored_before_rounds_is_its_own_round_one(world):
    run = world.run(status="running")
    # the body of round 1 as a worker sent it before rounds were: no "round" in it
    assert world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", ROUNDS[0]).status_code == 201
    LevelRound.objects.all().delete()
    level = LevelResult.objects.get()
    assert _push(world, run, 1).status_code == 200
    assert _push(world, run, 2).status_code == 201
    level.refresh_from_db()
    assert level.round_count == 2 and level.output_throughput == 1100.0
    assert list(level.rounds.values_list("round", flat=True)) == [1, 2]


@pytest.mark.parametrize(
    ("rounds", "named"),
    [
        (0, "parameters.rounds: Input should be greater than or equal to 1"),
        (11, "parameters.rounds: Input should be less than or equal to 10"),
        ("x", "parameters.rounds: Input should be a valid integer"),
        (10**400, "parameters.rounds: "),
    ],
)
def test_rounds_out_of_bounds_are_refused_naming_the_field(world, rounds, named):
    body = {
        "deployment": "glm-5-sglang",
        "parameters": {"levels": [8], "input_len": 8, "output_len": 8, "rounds": rounds},
    }
    response = world.owner.post("/api/v1/runs", json.loads(json.dumps(body)))
    assert response.status_code in (400, 422)
    detail = response.json().get("message") or response.json()["detail"]
    assert detail.startswith(named), detail
    assert not SweepRun.objects.exists()


def test_rounds_multiply_the_load_a_sweep_may_send(world):
    # 1024 requests × 2^22 tokens: 4.3 G tokens a round, within the 21.6 G a sweep may send
    load = {"levels": [1024], "input_len": 2**21, "output_len": 2**21, "prompts_per_level": 1024}
    body = {"deployment": "glm-5-sglang", "parameters": {**load, "rounds": 1}}
    assert world.owner.post("/api/v1/runs", body).status_code == 201
    body = {"deployment": "glm-5-sglang", "parameters": {**load, "rounds": 10}}
    response = world.owner.post("/api/v1/runs", body)
    assert response.status_code == 400
    assert "levels × rounds × (prompts" in response.json()["detail"]


def test_a_round_number_out_of_bounds_is_refused(world):
    run = world.run(status="running")
    for bad in (0, 11, "2"):
        body = {**ROUNDS[0], "round": bad}
        response = world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", body)
        assert response.status_code == 422
        assert response.json()["message"].startswith("round: ")
    assert not LevelResult.objects.exists()


# --------------------------------------------------------------------------- pages


@pytest.fixture
def rounds_run(world, client):
    pb.sign_in(client)
    run = world.run(status="running")
    for n in (1, 2, 3):
        measurements.level_record(run=run, round=n, **ROUNDS[n - 1])
    measurements.level_record(run=run, **{**ROUNDS[0], "concurrency": 16})
    return run


def test_the_run_page_shows_the_median_and_interval_of_a_level_of_rounds(client, rounds_run):
    page = html.unescape(client.get(f"/runs/{rounds_run.uuid}/").content.decode())
    low, high = median_interval([1200.0, 1000.0, 1100.0])
    assert f'1,100 <span class="ci">({low:,.0f}–{high:,.0f})</span>' in page
    assert "ran up to 3 rounds" in page
    # the level run once shows its figure alone, and says why
    assert "1,200</td>" in page
    assert '16 <span class="ci">(one round: no interval)</span>' in page


def test_the_run_page_of_single_rounds_shows_no_interval(client, world):
    pb.sign_in(client)
    run = world.run(status="running")
    measurements.level_record(run=run, **ROUNDS[0])
    page = client.get(f"/runs/{run.uuid}/").content.decode()
    assert 'class="ci"' not in page and "rounds-note" not in page


def test_the_throughput_chart_draws_the_band_of_the_interval(client, rounds_run):
    figure = pb.figure(client.get(f"/runs/{rounds_run.uuid}/").content.decode(), "throughput-data")
    (band,) = [t for t in figure["data"] if t.get("fill") == "toself"]
    low, high = median_interval([1200.0, 1000.0, 1100.0])
    assert band["x"] == [8, 8] and band["y"] == pytest.approx([high, low])
    tpot = pb.figure(client.get(f"/runs/{rounds_run.uuid}/").content.decode(), "tpot-data")
    assert len([t for t in tpot["data"] if t.get("fill") == "toself"]) == 2


def test_the_csv_has_every_round_and_the_levels_interval(client, rounds_run):
    response = client.get(f"/runs/{rounds_run.uuid}/levels.csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["round"], r["concurrency"]) for r in rows] == [
        ("1", "8"),
        ("2", "8"),
        ("3", "8"),
        ("median", "8"),
        ("1", "16"),
    ]
    assert [float(r["output_throughput (tok/s)"]) for r in rows[:4]] == [1200, 1000, 1100, 1100]
    low, high = median_interval([1200.0, 1000.0, 1100.0])
    assert float(rows[3]["output_throughput 95% low"]) == pytest.approx(low)
    assert float(rows[3]["output_throughput 95% high"]) == pytest.approx(high)
    assert rows[0]["output_throughput 95% low"] == "" and rows[4]["output_throughput 95% low"] == ""


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0", "rounds: Input should be greater than or equal to 1"),
        ("11", "rounds: Input should be less than or equal to 10"),
        ("x", "Enter a whole number."),
        (str(10**400), "rounds: Input should be less than or equal to 10"),
    ],
)
def test_the_sweep_form_refuses_rounds_out_of_bounds(db, client, monkeypatch, value, shown):
    monkeypatch.setattr(run_services, "send_host_task", lambda *a: None)
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.snapshot(deployment.host)
    form = {
        "levels": "8",
        "input_len": "8",
        "output_len": "8",
        "prompts_per_level": "8",
        "warmup": "0",
        "rounds": value,
        "endpoint": "completions",
    }
    response = client.post(f"/deployments/{deployment.pk}/sweep/", form)
    assert response.status_code == 400
    assert shown in html.unescape(response.content.decode())
    assert not SweepRun.objects.exists()


def test_rounds_cost_the_run_page_no_query(client, world):
    pb.sign_in(client)
    once, thrice = world.run(status="running"), world.run(status="running")
    for concurrency in (8, 16, 32):
        measurements.level_record(run=once, **{**ROUNDS[0], "concurrency": concurrency})
        for n in (1, 2, 3):
            body = {**ROUNDS[n - 1], "concurrency": concurrency}
            measurements.level_record(run=thrice, round=n, **body)
    counts = []
    for run in (once, thrice):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"/runs/{run.uuid}/").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_admin_shows_a_levels_rounds_read_only(client, world):
    client.force_login(User.objects.create_superuser("root", password="pw-root-123"))
    run = world.run(status="running")
    for n in (1, 2):
        level, _ = measurements.level_record(run=run, round=n, **ROUNDS[n - 1])
    page = client.get(f"/admin/runs/levelresult/{level.pk}/change/")
    assert page.status_code == 200
    text = html.unescape(page.content.decode())
    assert '"output_throughput": 1000.0' in text and 'name="rounds-0-figures"' not in text
