import json

import pytest

from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.samples import EngineSample, TelemetrySample
from tests.api_base import make_world, refused_batch
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
SGLANG_AGG = "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
RUN_UUID = "5e7c1f3a-0b8e-4d1e-9a55-2f4a7d9c1b20"


@pytest.fixture
def world(db):
    return make_world()


def _samples(n, gpus=8):
    return [
        {"gpu_index": i % gpus, "ts": 1.7e9 + i // gpus, "gpu_util": 0.0, "power_w": 85.0}
        for i in range(n)
    ]


# --------------------------------------------------------------------------- runs


def test_it_creates_a_run_once_per_uuid(world):
    body = {"deployment": "glm-5-sglang", "uuid": RUN_UUID, "label": "c32→1024"}
    first = world.host_worker.post("/api/v1/runs", body)
    assert first.status_code == 201
    assert first.json()["status"] == "queued"
    assert first.json()["host"] == "rtx-pro-6000"
    again = world.host_worker.post("/api/v1/runs", body)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert SweepRun.objects.count() == 1


def test_it_reads_a_run_by_id_or_uuid(world):
    run = world.run(label="sweep")
    by_id = world.read_only.get(f"/api/v1/runs/{run.pk}")
    by_uuid = world.read_only.get(f"/api/v1/runs/{run.uuid}")
    assert by_id.status_code == by_uuid.status_code == 200
    assert by_id.json() == by_uuid.json()
    assert by_id.json()["cancel_requested"] is False


def test_it_lists_runs_with_filters_and_pages(world):
    for i in range(3):
        world.run(label=f"r{i}")
    world.run(deployment=world.other_deployment, status="succeeded")
    page = world.read_only.get("/api/v1/runs?deployment=glm-5-sglang&limit=2").json()
    assert page["count"] == 3
    assert len(page["items"]) == 2
    rest = world.read_only.get("/api/v1/runs?deployment=glm-5-sglang&limit=2&offset=2").json()
    assert len(rest["items"]) == 1
    assert world.read_only.get("/api/v1/runs?status=succeeded").json()["count"] == 1
    assert world.read_only.get("/api/v1/runs?host=h200-lab").json()["count"] == 1
    assert world.read_only.get("/api/v1/runs?model=GLM-5").json()["count"] == 4
    by_id = world.read_only.get(f"/api/v1/runs?deployment={world.other_deployment.pk}").json()
    assert by_id["count"] == 1
    future = world.read_only.get("/api/v1/runs?created_after=2999-01-01T00:00:00Z").json()
    assert future["count"] == 0
    past = world.read_only.get("/api/v1/runs?created_before=2000-01-01").json()
    assert past["count"] == 0


def test_it_moves_a_run_along_its_states(world):
    run = world.run()
    running = world.host_worker.patch(f"/api/v1/runs/{run.uuid}", {"status": "running"})
    assert running.status_code == 200
    assert running.json()["started_at"] is not None
    done = world.host_worker.patch(f"/api/v1/runs/{run.pk}", {"status": "succeeded"})
    assert done.json()["status"] == "succeeded"
    assert done.json()["finished_at"] is not None
    # the same status again is a no-op, so that a retried push is harmless
    again = world.host_worker.patch(f"/api/v1/runs/{run.pk}", {"status": "succeeded"})
    assert again.status_code == 200


def test_it_refuses_a_finished_run_going_back_to_running(world):
    run = world.run(status="succeeded")
    response = world.host_worker.patch(f"/api/v1/runs/{run.pk}", {"status": "running"})
    assert response.status_code == 409
    assert response.json()["detail"] == f"run {run.pk} is succeeded; it cannot become running"
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_it_stores_progress_without_touching_the_status(world):
    run = world.run(status="running")
    progress = {"level_index": 2, "levels_total": 6, "requests_done": 310}
    response = world.host_worker.patch(
        f"/api/v1/runs/{run.pk}", {"progress": progress, "telemetry_status": "recorded"}
    )
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.progress == progress and run.status == "running"
    assert run.telemetry_status == "recorded"


@pytest.mark.parametrize("before", [{"attempt": 1, "heartbeat": 1.0}, {"heartbeat": 1.0}])
def test_a_takeover_is_granted_to_one_delivery_only(world, before):
    run = world.run(status="running")
    SweepRun.objects.filter(pk=run.pk).update(progress=before)
    url = f"/api/v1/runs/{run.uuid}"
    body = {"takeover": 2, "progress": {"heartbeat": 2.0, "worker": {"pid": 7}}}
    first = world.host_worker.patch(url, body)
    assert first.status_code == 200
    assert first.json()["progress"] == {"heartbeat": 2.0, "worker": {"pid": 7}, "attempt": 2}
    # a second delivery that read the same gone worker asks for the same attempt: refused
    other = {"takeover": 2, "progress": {"heartbeat": 3.0, "worker": {"pid": 8}}}
    second = world.host_worker.patch(url, other)
    assert second.status_code == 409
    assert second.json()["detail"] == (
        f"run {run.pk} cannot be taken over as attempt 2: it is running, attempt 2"
    )
    run.refresh_from_db()
    assert run.progress["worker"] == {"pid": 7}
    # nor is a finished run taken over
    world.host_worker.patch(url, {"status": "succeeded"})
    third = world.host_worker.patch(url, {**body, "takeover": 3})
    assert third.status_code == 409 and "it is succeeded" in third.json()["detail"]


def test_a_takeover_must_carry_the_new_workers_heartbeat(world):
    run = world.run(status="running")
    response = world.host_worker.patch(f"/api/v1/runs/{run.uuid}", {"takeover": 2})
    assert response.status_code == 400
    assert response.json()["detail"] == "progress: a takeover carries the new worker's heartbeat"
    run.refresh_from_db()
    assert run.progress == {}


def test_the_progress_of_a_delivery_taken_over_is_refused_with_its_status(world):
    run = world.run(status="running")
    SweepRun.objects.filter(pk=run.pk).update(progress={"attempt": 3, "heartbeat": 9.0})
    url = f"/api/v1/runs/{run.uuid}"
    # attempt 2's worker, slow but alive, or its push left in a spool, ends the run: refused
    stale = world.host_worker.patch(
        url, {"status": "failed", "progress": {"attempt": 2, "heartbeat": 5.0}}
    )
    assert stale.status_code == 409
    assert stale.json()["detail"] == (
        f"run {run.pk} was taken over as attempt 3; the progress of attempt 2 is refused"
    )
    run.refresh_from_db()
    assert (run.status, run.progress["attempt"]) == ("running", 3)
    # the current attempt's and a progress without an attempt are stored
    assert world.host_worker.patch(url, {"progress": {"attempt": 3}}).status_code == 200
    assert world.host_worker.patch(url, {"progress": {"level_index": 2}}).status_code == 200
    for bad_attempt in ("3", True, 0):
        bad = world.host_worker.patch(url, {"progress": {"attempt": bad_attempt}})
        assert bad.status_code == 400
        assert bad.json()["detail"] == "progress: attempt must be a positive integer"


def test_it_rejects_null_for_a_field_that_cannot_be_empty(world):
    run = world.run()
    response = world.host_worker.patch(f"/api/v1/runs/{run.pk}", {"label": None})
    assert response.status_code == 422
    assert "label may not be null" in response.json()["message"]


def test_it_cancels_a_queued_run_and_asks_a_running_one_to_stop(world):
    queued, running = world.run(), world.run(status="running")
    assert world.owner.post(f"/api/v1/runs/{queued.pk}/cancel").json()["status"] == "cancelled"
    answer = world.owner.post(f"/api/v1/runs/{running.pk}/cancel").json()
    assert answer["status"] == "running" and answer["cancel_requested"] is True
    # the worker reads it between requests
    assert world.host_worker.get(f"/api/v1/runs/{running.uuid}").json()["cancel_requested"]
    finished = world.run(status="failed")
    assert world.owner.post(f"/api/v1/runs/{finished.pk}/cancel").status_code == 409


def test_host_token_writes_only_its_hosts_runs(world):
    other = world.run(deployment=world.other_deployment)
    response = world.host_worker.patch(f"/api/v1/runs/{other.pk}", {"status": "running"})
    assert response.status_code == 403
    assert "bound to host 'rtx-pro-6000'" in response.json()["detail"]
    create = world.host_worker.post("/api/v1/runs", {"deployment": "glm-5-h200"})
    assert create.status_code == 403
    other.refresh_from_db()
    assert other.status == "queued"


def test_read_only_token_cannot_create_runs(world):
    response = world.read_only.post("/api/v1/runs", {"deployment": "glm-5-sglang"})
    assert response.status_code == 403
    assert response.json()["detail"] == "token 'viewer' is read-only"
    assert not SweepRun.objects.exists()


def test_it_answers_404_for_unknown_runs_and_deployments(world):
    assert world.owner.get("/api/v1/runs/999999").status_code == 404
    assert world.owner.get(f"/api/v1/runs/{RUN_UUID}").status_code == 404
    assert world.owner.get("/api/v1/runs/99999999999999999999999").status_code == 404
    missing = world.owner.post("/api/v1/runs", {"deployment": "nope"})
    assert missing.status_code == 404
    assert missing.json()["detail"] == "deployment 'nope' not found"


# --------------------------------------------------------------------------- levels

LEVEL = {
    "concurrency": 128,
    "request_rate": None,
    "completed": 1024,
    "failed": 0,
    "duration": 163.2,
    "total_output_tokens": 131584,
    "output_throughput": 806.3,
    "median_ttft_ms": 2410.0,
    "p99_tpot_ms": 171.5,
    "errors": {},
}


def test_it_stores_a_level_once(world):
    run = world.run(status="running")
    first = world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", LEVEL)
    assert first.status_code == 201
    assert first.json()["key"] == "c=128,r=inf"
    again = world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", LEVEL)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert LevelResult.objects.count() == 1
    listed = world.read_only.get(f"/api/v1/runs/{run.pk}/levels").json()
    assert [level["output_throughput"] for level in listed] == [806.3]


def test_it_keys_levels_by_request_rate_too(world):
    run = world.run(status="running")
    for rate in (4.0, 8.0, "inf"):
        body = {**LEVEL, "request_rate": rate}
        assert world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", body).status_code == 201
    keys = sorted(LevelResult.objects.values_list("key", flat=True))
    assert keys == ["c=128,r=4.0", "c=128,r=8.0", "c=128,r=inf"]


def test_it_rejects_a_level_of_another_hosts_run(world):
    other = world.run(deployment=world.other_deployment)
    response = world.host_worker.post(f"/api/v1/runs/{other.pk}/levels", LEVEL)
    assert response.status_code == 403
    assert not LevelResult.objects.exists()


def test_it_names_the_field_of_a_bad_level(world):
    run = world.run()
    response = world.host_worker.post(
        f"/api/v1/runs/{run.pk}/levels", {**LEVEL, "completed": "lots"}
    )
    assert response.status_code == 422
    assert response.json()["message"].startswith("completed:")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"output_throughput": -500.0}, "output_throughput: must be at least 0"),
        ({"duration": -3.0}, "duration: must be at least 0"),
        ({"mean_ttft_ms": 1e308}, "mean_ttft_ms: must be at most 1e+09"),
        ({"started_at": 1.7e9 + 60, "finished_at": 1.7e9}, "finished_at: must not be before"),
    ],
)
def test_it_rejects_level_metrics_no_level_can_have(world, fields, named):
    run = world.run(status="running")
    response = world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", {**LEVEL, **fields})
    assert response.status_code == 400
    assert response.json()["detail"].startswith(named)
    assert not LevelResult.objects.exists()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"concurrency": 0}, "concurrency: Input should be greater than or equal to 1"),
        ({"request_rate": 0}, "request_rate: Input should be greater than 0"),
        ({"request_rate": "5"}, 'request_rate: must be a number of req/s, or "inf"'),
        ({"output_throughput": "5"}, "output_throughput: Input should be a valid number"),
        ({"completed": True}, "completed: Input should be a valid integer"),
        ({"completed": 1024.0}, "completed: Input should be a valid integer"),
        ({"usage_reported": "yes"}, "usage_reported: Input should be a valid boolean"),
        ({"attempt": True}, "attempt: Input should be a valid integer"),
    ],
)
def test_it_refuses_loose_values_in_a_level(world, fields, named):
    run = world.run(status="running")
    response = world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", {**LEVEL, **fields})
    assert response.status_code == 422
    assert response.json()["message"].startswith(named), response.json()["message"]
    assert not LevelResult.objects.exists()


def test_a_level_as_the_worker_sends_it_is_stored(world):
    run = world.run(status="running")
    level = {
        **LEVEL,
        "request_rate": 4,
        "input_len": 1024,
        "output_len": 128,
        "usage_reported": True,
        "request_throughput": 6,
        "max_concurrent_requests": 128,
        "errors": {"timeout": 2},
        "started_at": 1_764_000_000,
        "finished_at": 1_764_000_163.2,
        "attempt": 1,
        "raw": {"num_prompts": 1024, "request_rate": None},
    }
    response = world.host_worker.post(f"/api/v1/runs/{run.pk}/levels", level)
    assert response.status_code == 201, response.json()
    stored = LevelResult.objects.get()
    assert (stored.request_rate, stored.completed, stored.request_throughput) == (4.0, 1024, 6.0)


# --------------------------------------------------------------------------- telemetry


def test_it_stores_a_telemetry_batch_once(world):
    run = world.run(status="running")
    body = {"batch_id": "b-0001", "samples": _samples(5000)}
    first = world.host_worker.post(f"/api/v1/runs/{run.uuid}/telemetry", body)
    assert first.status_code == 201
    assert first.json() == {"run": run.pk, "batch_id": "b-0001", "kind": "gpu", "count": 5000}
    again = world.host_worker.post(f"/api/v1/runs/{run.uuid}/telemetry", body)
    assert again.status_code == 200
    assert TelemetrySample.objects.filter(run=run).count() == 5000
    sample = TelemetrySample.objects.filter(run=run, gpu_index=3).order_by("ts").first()
    assert (sample.ts, sample.gpu_util, sample.power_w, sample.mem_util) == (
        1.7e9,
        0.0,
        85.0,
        None,
    )


def test_it_lists_telemetry_in_time_order(world):
    run = world.run(status="running")
    world.host_worker.post(
        f"/api/v1/runs/{run.pk}/telemetry", {"batch_id": "a", "samples": _samples(20)}
    )
    page = world.read_only.get(f"/api/v1/runs/{run.pk}/telemetry?limit=8").json()
    assert page["count"] == 20
    assert [s["gpu_index"] for s in page["items"]] == list(range(8))


def test_it_stores_nothing_of_a_batch_with_one_bad_sample(world):
    run = world.run(status="running")
    samples = _samples(100)
    samples[57]["ts"] = "yesterday"
    refused_batch(world.host_worker, f"/api/v1/runs/{run.pk}/telemetry", samples, "samples.57.ts:")
    assert not TelemetrySample.objects.exists()


def test_it_stores_engine_samples_once(world):
    run = world.run(status="running")
    samples = [
        {"ts": 1.7e9 + i, "running": 64.0, "queued": 448.0, "kv_cache_usage": 0.31}
        for i in range(30)
    ]
    path = f"/api/v1/runs/{run.pk}/engine-samples"
    assert world.host_worker.post(path, {"batch_id": "e1", "samples": samples}).status_code == 201
    assert world.host_worker.post(path, {"batch_id": "e1", "samples": samples}).status_code == 200
    assert EngineSample.objects.filter(run=run).count() == 30
    listed = world.read_only.get(path).json()
    assert listed["items"][0]["queued"] == 448.0


def test_samples_keep_the_attempt_of_the_sweep_that_took_them(world):
    run = world.run(status="running")
    path = f"/api/v1/runs/{run.pk}/engine-samples"
    first = [{"ts": 1.7e9, "running": 8.0}]
    resumed = [{"ts": 1.7e9 + 60, "running": 8.0, "attempt": 2}]
    world.host_worker.post(path, {"batch_id": "e1", "samples": first})
    world.host_worker.post(path, {"batch_id": "e2", "samples": resumed})

    assert [s["attempt"] for s in world.read_only.get(path).json()["items"]] == [1, 2]
    nought = world.host_worker.post(
        path, {"batch_id": "e3", "samples": [{"ts": 1.7e9, "attempt": 0}]}
    )
    assert nought.status_code == 422
    assert nought.json()["message"].startswith("samples.0.attempt:")
    assert EngineSample.objects.filter(run=run).count() == 2


def test_outsider_cannot_post_telemetry(world):
    run = world.run(status="running")
    response = world.outsider.post(
        f"/api/v1/runs/{run.pk}/telemetry", {"batch_id": "x", "samples": _samples(8)}
    )
    assert response.status_code == 403
    assert not TelemetrySample.objects.exists()


# --------------------------------------------------------------------------- imports


def _import(client, name, fmt, deployment="glm-5-sglang", **fields):
    body = {
        "format": fmt,
        "deployment": deployment,
        "content": (RESULTS / name).read_text(),
        "file_name": name,
        **fields,
    }
    return client.post("/api/v1/runs/import", body)


def test_it_imports_a_real_sglang_file(world):
    response = _import(world.owner, SGLANG_AGG, "sglang", accept_mismatch=True)
    assert response.status_code == 201
    run = response.json()["run"]
    assert response.json()["levels"] == 1
    assert (run["source"], run["status"], run["label"]) == ("import", "succeeded", SGLANG_AGG)
    level = LevelResult.objects.get(run_id=run["id"])
    assert level.concurrency == 8 and level.request_rate is None
    assert level.output_throughput == pytest.approx(710.7638973941176)
    assert level.median_ttft_ms == pytest.approx(33.528951462358236)
    assert level.raw["server_info"]["tp_size"] == 1
    assert level.raw["request_rate"] == "Infinity"


def test_it_imports_the_same_file_once(world):
    first = _import(world.owner, "vllm_bench_serve_append.jsonl", "vllm", accept_mismatch=True)
    again = _import(world.owner, "vllm_bench_serve_append.jsonl", "vllm", accept_mismatch=True)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["run"]["id"] == first.json()["run"]["id"]
    assert LevelResult.objects.count() == 2


def test_it_imports_old_vllm_results(world):
    response = _import(
        world.owner, "vllm_benchmark_serving_0.4.0.json", "vllm", accept_mismatch=True
    )
    assert response.status_code == 201
    level = LevelResult.objects.get()
    assert level.request_throughput == pytest.approx(1000 / 151.25)
    assert level.raw["request_inthroughput"] == pytest.approx(1000 / 151.25)


def test_it_stores_nothing_of_a_file_with_bad_lines(world):
    response = _import(world.owner, "sglang_broken.jsonl", "sglang")
    assert response.status_code == 400
    body = response.json()
    assert [p.split(":")[0] for p in body["problems"]] == ["line 2", "line 3"]
    assert body["detail"].startswith("content: line 2: not JSON")
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


def test_host_token_imports_only_for_its_host(world):
    response = _import(world.host_worker, SGLANG_AGG, "sglang", deployment="glm-5-h200")
    assert response.status_code == 403
    assert _import(world.host_worker, SGLANG_AGG, "sglang", accept_mismatch=True).status_code == 201


AGG_OBJECT = json.loads((RESULTS / SGLANG_AGG).read_text())
# Files that crashed the importer: a number beyond any float, nesting beyond Python's recursion.
UNREADABLE = [
    ("sglang", json.dumps({**AGG_OBJECT, "output_throughput": 10**400}), "output_throughput"),
    ("sglang", json.dumps({**AGG_OBJECT, "request_rate": 10**400}), "request_rate"),
    ("vllm", json.dumps({**AGG_OBJECT, "completed": 10**400}), "completed"),
    ("vllm", "[" * 5000 + "]" * 5000, "not JSON (nested too deep to read)"),
    (
        "sglang",
        json.dumps({**AGG_OBJECT, "completed": 0}).replace(
            '"completed": 0', '"completed": ' + "9" * 5000
        ),
        "more than 4,300 digits",
    ),
    (
        "sglang",
        json.dumps({**AGG_OBJECT, "x": json.loads('{"a":' * 900 + "1" + "}" * 900)}),
        "nested",
    ),
]


@pytest.mark.parametrize(("fmt", "content", "named"), UNREADABLE)
def test_a_file_python_cannot_read_whole_is_a_400_naming_its_line(world, fmt, content, named):
    body = {"format": fmt, "deployment": "glm-5-sglang", "content": content}
    response = world.owner.post("/api/v1/runs/import", body)
    assert response.status_code == 400
    [problem] = response.json()["problems"]
    assert problem.startswith("line 1: ") and named in problem
    assert len(problem) < 200
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.glob("*.json*")))
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9, 0.999])
def test_a_truncated_real_file_is_refused_or_imported_whole(world, name, fraction):
    text = (RESULTS / name).read_text()
    body = {
        "format": "vllm" if name.startswith("vllm") else "sglang",
        "deployment": "glm-5-sglang",
        "content": text[: int(len(text) * fraction)],
        "accept_mismatch": True,
    }
    response = world.owner.post("/api/v1/runs/import", body)
    if response.status_code == 201:
        run = SweepRun.objects.get()
        assert run.levels.count() == response.json()["levels"] > 0
    else:
        assert response.status_code == 400, response.text
        assert response.json()["problems"][0].startswith("line ")
        assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


def test_a_file_of_another_model_is_a_409_naming_what_differs_until_confirmed(world):
    refused = _import(world.owner, SGLANG_AGG, "sglang")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": "content: the file measured Qwen/Qwen2.5-3B-Instruct at TP1 (1 GPU) on SGLang "
        "0.5.5.post3; the deployment glm-5-sglang serves GLM-5 at TP8 (8 GPUs) on SGLang (they "
        "differ in model, TP, GPU count); send accept_mismatch: true to import it all the same",
        "differences": ["model", "TP", "GPU count"],
    }
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()
    accepted = _import(world.owner, SGLANG_AGG, "sglang", accept_mismatch=True)
    assert accepted.status_code == 201
    run = SweepRun.objects.get()
    assert run.snapshot["deployment"]["model"] == "Qwen/Qwen2.5-3B-Instruct"
    assert run.other_model == "Qwen/Qwen2.5-3B-Instruct"


def test_a_vllm_file_of_another_model_is_a_409_too(world):
    refused = _import(world.owner, "vllm_bench_serve_0.11.json", "vllm")
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(
        "content: the file measured zai-org/GLM-5-FP8; the deployment glm-5-sglang serves GLM-5"
    )
    assert refused.json()["differences"] == ["model"]
    assert not SweepRun.objects.exists()
