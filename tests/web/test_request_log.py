"""A level's requests: pushed packed with the level, stored per round, exported as JSONL and
CSV with vLLM's --save-detailed keys, and kept from an imported vLLM result."""

import base64
import csv
import io
import json

import pytest

from domain import request_log
from moeops.runs import services
from moeops.runs.importers import ResultFileError
from moeops.runs.models import LevelResult, RequestLog, SweepRun
from tests import page_base as pb
from tests.api_base import make_world
from tests.fakes import FIXTURES


@pytest.fixture
def world(db):
    return make_world()


def _columns(n=3, failed=1):
    ok = n - failed
    return {
        "start_time": [round(0.25 * i, 6) for i in range(n)],
        "ttft": [0.12] * ok + [None] * failed,
        "latency": [0.5] * ok + [0.03] * failed,
        "input_len": [32] * ok + [None] * failed,
        "output_len": [16] * ok + [None] * failed,
        "status": ["ok"] * ok + ["failed"] * failed,
        "error_reason": [None] * ok + ["http_500"] * failed,
        "error": [None] * ok + ["boom"] * failed,
        "itl": [[0.02, 0.025]] * ok + [None] * failed,
    }


def _level(columns, **fields):
    statuses = columns["status"]
    return {
        "concurrency": 4,
        "request_rate": 8.0,
        "achieved_request_rate": 7.9,
        "completed": statuses.count("ok"),
        "failed": statuses.count("failed"),
        "output_throughput": 100.0,
        "request_log": request_log.pack(columns),
        **fields,
    }


def _push(world, run, body):
    return world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", body)


def test_a_level_stores_its_requests_and_the_export_has_a_line_each(world, client):
    run = world.run(status="running")

    answer = _push(world, run, _level(_columns(3)))
    again = _push(world, run, _level(_columns(3)))

    assert (answer.status_code, again.status_code) == (201, 200)
    assert answer.json()["request_log"] == 3
    assert answer.json()["achieved_request_rate"] == 7.9
    assert answer.json()["engine_figures"] == {}
    log = RequestLog.objects.get()
    assert (log.count, log.round, log.itl_dropped) == (3, 1, 0)
    pb.sign_in(client)
    lines = b"".join(client.get(f"/runs/{run.uuid}/requests.jsonl").streaming_content)
    requests = [json.loads(line) for line in lines.decode().splitlines()]
    assert len(requests) == 3
    assert requests[0] == {
        "concurrency": 4,
        "request_rate": 8.0,
        "round": 1,
        "start_time": 0.0,
        "ttft": 0.12,
        "latency": 0.5,
        "input_len": 32,
        "output_len": 16,
        "status": "ok",
        "error_reason": None,
        "error": None,
        "itl": [0.02, 0.025],
    }
    assert requests[2]["error"] == "boom" and requests[2]["itl"] is None


def test_the_csv_export_has_a_row_each_with_the_itls_as_a_json_list(world, client):
    run = world.run(status="running")
    _push(world, run, _level(_columns(3)))
    _push(world, run, {**_level(_columns(2, failed=0)), "round": 2})
    pb.sign_in(client)

    answer = client.get(f"/runs/{run.uuid}/requests.csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))

    assert answer["Content-Disposition"].endswith('-requests.csv"')
    assert [(r["round"], r["status"]) for r in rows] == [
        ("1", "ok"),
        ("1", "ok"),
        ("1", "failed"),
        ("2", "ok"),
        ("2", "ok"),
    ]
    assert json.loads(rows[0]["itl"]) == [0.02, 0.025] and rows[2]["itl"] == ""
    page = client.get(f"/runs/{run.uuid}/")
    assert page.context["requests_logged"] == 5
    assert f"/runs/{run.uuid}/requests.jsonl" in page.content.decode()


def test_a_log_of_another_count_than_the_level_is_refused_and_nothing_stored(world):
    run = world.run(status="running")

    answer = _push(world, run, {**_level(_columns(3)), "completed": 5})

    assert answer.status_code == 400
    assert "request_log holds 3 requests, the level counts 6" in json.dumps(answer.json())
    assert not LevelResult.objects.exists() and not RequestLog.objects.exists()


@pytest.mark.parametrize(
    ("packed", "problem"),
    [
        ("not base64!", "request_log is not base64"),
        (base64.b64encode(b"plain").decode(), "request_log is not zlib-compressed"),
        (
            request_log.pack({**_columns(3), "ttft": [0.1, -1.0, None]}),
            "request_log ttft: request 1 has '-1.0'",
        ),
        (
            request_log.pack({**_columns(3), "itl": [[0.1]]}),
            "request_log itl: 1 values for 3 requests",
        ),
    ],
)
def test_a_log_that_does_not_unpack_is_refused_naming_why(world, packed, problem):
    run = world.run(status="running")

    answer = _push(world, run, {**_level(_columns(3)), "request_log": packed})

    assert answer.status_code == 400
    assert problem in json.dumps(answer.json())
    assert not LevelResult.objects.exists()


def test_a_level_past_the_itl_cap_keeps_every_request_but_their_later_itls():
    columns, dropped = request_log.capped(_columns(3, failed=0), max_itl_values=3)

    assert dropped == 2
    assert columns["itl"] == [[0.02, 0.025], None, None]
    assert columns["ttft"] == _columns(3, failed=0)["ttft"]


def test_an_imported_vllm_result_keeps_its_requests(world, client):
    text = (FIXTURES / "results" / "vllm_benchmark_serving_0.6.json").read_text()

    run, _ = services.run_import(
        deployment=world.deployment, fmt="vllm", text=text, accept_mismatch=True
    )

    log = RequestLog.objects.get(level__run=run)
    assert log.count == 8
    level = run.levels.get()
    assert (level.completed, level.failed) == (7, 1)
    assert "ttfts" not in level.raw
    pb.sign_in(client)
    lines = b"".join(client.get(f"/runs/{run.uuid}/requests.jsonl").streaming_content)
    requests = [json.loads(line) for line in lines.decode().splitlines()]
    assert len(requests) == 8
    assert requests[0]["ttft"] == 0.21 and requests[0]["itl"] == [0.011, 0.012]
    assert requests[0]["request_rate"] == 4.0
    assert [r["status"] for r in requests].count("failed") == 1


def test_the_api_lists_a_levels_engine_figures_from_its_counters(world):
    run = world.run(status="running")
    counters = {"engine": "vllm", "prompt_tokens": 96.0, "generation_tokens": 50.0}
    body = _level(_columns(3), raw={"engine_counters": counters, "warmup_tokens": {}})
    _push(world, run, {**body, "total_input_tokens": 64, "total_output_tokens": 32})
    warm = {"input_tokens": 32, "output_tokens": 16}
    second = _level(_columns(3), raw={"engine_counters": counters, "warmup_tokens": warm})
    _push(world, run, {**second, "round": 2, "total_input_tokens": 64, "total_output_tokens": 32})

    [level] = world.owner.get(f"/api/v1/runs/{run.uuid}/levels").json()

    figures = level["engine_figures"]
    assert (figures["engine_prompt_tokens"], figures["engine_generation_tokens"]) == (192, 100)
    # the client's: 64 + 64 + 32 of warm-up prompt tokens, 32 + 32 + 16 generated
    assert figures["prompt_tokens_gap"] == pytest.approx(192 / 160 - 1)
    assert figures["generation_tokens_gap"] == pytest.approx(100 / 80 - 1)
    assert level["request_log"] == 6


def _export(client, run):
    return b"".join(client.get(f"/runs/{run.uuid}/requests.jsonl").streaming_content).decode()


def _run_of_two_levels(world):
    """A running run whose request-rate level has two rounds and whose unlimited level one."""
    run = world.run(status="running")
    _push(world, run, _level(_columns(3)))
    _push(world, run, {**_level(_columns(4, failed=0)), "round": 2})
    _push(world, run, {**_level(_columns(2, failed=0)), "concurrency": 8, "request_rate": None})
    return run


def _import_export(world, exported, file_name):
    return world.host_worker.post(
        "/api/v1/runs/import",
        {
            "format": "moeops",
            "deployment": world.deployment.name,
            "content": exported,
            "file_name": file_name,
            # the export names no model: confirmed, never filed as the deployment's
            "accept_mismatch": True,
        },
    )


def test_an_exported_run_imported_again_keeps_every_request_of_every_round(world, client):
    run = _run_of_two_levels(world)
    pb.sign_in(client)
    exported = _export(client, run)

    answer = _import_export(world, exported, "requests.jsonl")

    assert answer.status_code == 201, answer.json()
    imported = SweepRun.objects.get(uuid=answer.json()["run"]["uuid"])
    assert imported.source == "import" and imported.parameters["format"] == "moeops"
    assert _export(client, imported) == exported
    rate, unlimited = imported.levels.order_by("concurrency")
    assert (rate.concurrency, rate.request_rate, rate.round_count) == (4, 8.0, 2)
    assert (rate.completed, rate.failed, rate.errors) == (6, 1, {"http_500": 1})
    assert [r.figures["completed"] for r in rate.rounds.all()] == [2, 4]
    assert (unlimited.concurrency, unlimited.request_rate) == (8, None)
    # 2 requests sent 0.25 s apart, each answering 16 tokens in 0.5 s: 32 tokens in 0.75 s
    assert unlimited.duration == pytest.approx(0.75)
    assert unlimited.output_throughput == pytest.approx(32 / 0.75)
    assert unlimited.median_ttft_ms == pytest.approx(120.0)
    assert unlimited.mean_itl_ms == pytest.approx(22.5)


def test_the_csv_export_imported_again_keeps_every_request_as_the_jsonl_does(world, client):
    run = _run_of_two_levels(world)
    pb.sign_in(client)
    exported = b"".join(client.get(f"/runs/{run.uuid}/requests.csv").streaming_content).decode()

    answer = _import_export(world, exported, "requests.csv")

    assert answer.status_code == 201, answer.json()
    imported = SweepRun.objects.get(uuid=answer.json()["run"]["uuid"])
    # the same requests, rounds and figures as the JSONL export of the run it came from
    assert _export(client, imported) == _export(client, run)
    rate, unlimited = imported.levels.order_by("concurrency")
    assert (rate.round_count, rate.completed, rate.failed) == (2, 6, 1)
    assert unlimited.output_throughput == pytest.approx(32 / 0.75)


HEADER = ",".join(request_log.CSV_HEADER)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("4,,1,0.0,abc,0.5,32,16,ok,,,", "line 2: ttft is not a number: 'abc'"),
        ('4,,1,0.0,0.1,0.5,32,16,ok,,,"[0.1,"', "line 2: itl is not a JSON list of gaps"),
        ('4,,1,0.0,0.1,0.5,32,16,ok,,,"[0.1,-2]"', "line 2: itl is no request's: [0.1, -2]"),
        ("x,,1,0.0,0.1,0.5,32,16,ok,,,", "line 2: concurrency is not a whole number: 'x'"),
        ("+-4,,1,0.0,0.1,0.5,32,16,ok,,,", "line 2: concurrency is not a whole number: '+-4'"),
        ("\u00b2,,1,0.0,0.1,0.5,32,16,ok,,,", "line 2: concurrency is not a whole number"),
        ("4" + "0" * 400 + ",,1,0.0,0.1,0.5,32,16,ok,,,", "line 2: concurrency is not a whole"),
        ("4,,1,0.0,-1,0.5,32,16,ok,,,", "line 2: ttft is no request's: -1.0"),
        ("4,,1,0.0,0.1,0.5,32,16,ok,,,,extra", "line 2: has more cells than the header"),
        ("4,,1,0.0,0.1", "line 2: lacks the cell latency"),
    ],
)
def test_a_csv_export_row_that_is_not_a_request_is_refused_naming_its_line(world, row, problem):
    with pytest.raises(ResultFileError) as refused:
        services.run_import(deployment=world.deployment, fmt="moeops", text=f"{HEADER}\n{row}\n")

    assert problem in str(refused.value)
    assert not SweepRun.objects.filter(source="import").exists()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ({"round": 1, "status": "ok"}, "line 1: concurrency is not a count"),
        ({"concurrency": 4, "request_rate": None, "ttft": 0.1}, "line 1: lacks the request's"),
        (
            {"concurrency": 4, "request_rate": -2, "status": "ok"},
            "line 1: request_rate is not a rate",
        ),
    ],
)
def test_an_export_line_that_is_not_a_request_is_refused_naming_it(world, line, problem):
    with pytest.raises(ResultFileError) as refused:
        services.run_import(deployment=world.deployment, fmt="moeops", text=json.dumps(line))

    assert problem in str(refused.value)
    assert not SweepRun.objects.filter(source="import").exists()


def test_a_request_no_level_can_hold_is_refused_naming_its_line(world):
    request = {**request_log.rows(_columns(1, failed=0))[0], "ttft": -0.5}
    line = json.dumps({"concurrency": 4, "request_rate": None, "round": 2, **request})

    with pytest.raises(ResultFileError) as refused:
        services.run_import(deployment=world.deployment, fmt="moeops", text=f"{line}\n{line}")

    assert refused.value.problems == [
        "line 1: ttft is no request's: -0.5",
        "line 2: ttft is no request's: -0.5",
    ]
