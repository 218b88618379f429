"""/api/v1/workloads: named, versioned workloads; a dataset's file refused by its name, line and
reason with nothing stored; a sweep started with a workload sends it and records it."""

import base64
import hashlib
import json
from pathlib import Path

import pytest

from moeops.insights.models import Finding
from moeops.insights.services import run_analyze
from moeops.runs import snapshots
from moeops.runs.models import SweepRun, Workload
from tests import queues
from tests.api_base import make_serving_world
from tests.fakes import shared_prefix_spec

QUEUE = "host.rtx-pro-6000"
RANDOM = {
    "kind": "random",
    "input": {"distribution": "uniform", "low": 512, "high": 1536},
    "output": {"distribution": "fixed", "value": 128},
}
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi"}]},
    {"conversations": [{"from": "human", "value": "What is MoE?"}]},
]
MESSAGES = [
    {"messages": [{"role": "user", "content": "Plan a trip"}]},
    {"messages": [{"role": "user", "content": "Write a haiku"}]},
]


@pytest.fixture
def world(db):
    return make_serving_world("glm-5", on_gpus=True)


def _sweep_of(world, workload, **parameters):
    """The owner's POST /api/v1/runs starting a sweep at concurrency 4 of 64 tokens in, 32 out
    under `workload` (its name), with `parameters` added."""
    load = {"levels": [4], "input_len": 64, "output_len": 32, "workload": workload, **parameters}
    return world.owner.post(
        "/api/v1/runs", {"deployment": "glm-5-sglang", "parameters": load, "start": True}
    )


def _dataset(name, content, **fields):
    return {
        "name": name,
        "spec": {"kind": "dataset"},
        "file_name": name,
        "content": content,
        **fields,
    }


def test_it_stores_a_random_workload_and_a_new_version_when_it_changes(world):
    first = world.owner.post("/api/v1/workloads", {"name": "chatty", "spec": RANDOM})
    again = world.owner.post("/api/v1/workloads", {"name": "chatty", "spec": RANDOM})
    longer = {**RANDOM, "output": {"distribution": "fixed", "value": 512}}
    second = world.owner.post("/api/v1/workloads", {"name": "chatty", "spec": longer})

    assert (first.status_code, again.status_code, second.status_code) == (201, 200, 201)
    assert (first.json()["version"], again.json()["version"], second.json()["version"]) == (1, 1, 2)
    assert second.json()["spec"]["output"] == {"distribution": "fixed", "value": 512}


def test_it_stores_a_sharegpt_dataset_with_its_hash(world):
    content = json.dumps(SHAREGPT)

    response = world.owner.post("/api/v1/workloads", _dataset("chats.json", content))

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["layout"], body["item_count"], body["file_name"]) == ("sharegpt", 2, "chats.json")
    assert body["sha256"] == hashlib.sha256(content.encode()).hexdigest()
    assert Workload.objects.get().items[0] == {"prompt": "Hello there", "answer": "Hi"}


def test_it_stores_a_messages_dataset(world):
    content = "\n".join(json.dumps(row) for row in MESSAGES)

    response = world.owner.post("/api/v1/workloads", _dataset("msgs.jsonl", content))

    assert response.status_code == 201
    assert (response.json()["layout"], response.json()["item_count"]) == ("messages", 2)


@pytest.mark.parametrize(
    ("file_name", "payload", "detail"),
    [
        ("empty.jsonl", {"content": ""}, "file: empty.jsonl: the file is empty"),
        (
            "odd.jsonl",
            {"content": '{"conversations": [{"from": "human", "value": "x"}]}\n{"q": 1}'},
            "file: odd.jsonl, line 2: neither a ShareGPT conversation",
        ),
        (
            "nohuman.jsonl",
            {"content": '{"conversations": [{"from": "gpt", "value": "hi"}]}'},
            "file: nohuman.jsonl, line 1: a conversation with no human turn in its conversations",
        ),
        (
            "long.txt",
            {"content": "ok\n" + "word " * 40, "context_len": 16},
            "file: long.txt, line 2: the prompt has at least 40 tokens (its words), over the "
            "context length of 16",
        ),
        (
            "blob.bin",
            {"content_base64": base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00").decode()},
            "file: blob.bin, line 3: a NUL byte: the file is binary, not text",
        ),
    ],
)
def test_it_refuses_a_bad_file_naming_it_and_stores_nothing(world, file_name, payload, detail):
    body = {"name": file_name, "spec": {"kind": "dataset"}, "file_name": file_name, **payload}

    response = world.owner.post("/api/v1/workloads", body)

    assert response.status_code == 400
    assert response.json()["detail"].startswith(detail)
    assert not Workload.objects.exists()


def test_it_refuses_a_200_mb_upload_by_its_length_before_reading_it(world):
    size = 200 * 1024 * 1024

    response = world.owner.post(
        "/api/v1/workloads",
        raw=json.dumps(_dataset("huge.jsonl", "x")),
        CONTENT_LENGTH=str(size),
    )

    assert response.status_code == 413
    assert response.json()["detail"] == (
        f"the dataset file is refused unread: its request body of {size:,} bytes is larger than "
        "16,777,216 bytes (MOEOPS_MAX_BODY_BYTES)"
    )
    assert not Workload.objects.exists()


def test_a_workload_is_a_persons_write(world):
    response = world.host_worker.post("/api/v1/workloads", {"name": "w", "spec": RANDOM})

    assert response.status_code == 403
    assert not Workload.objects.exists()


def test_a_bad_spec_names_its_key(world):
    spec = {"kind": "multi_turn", "turns": 0, "question_len": 10, "output": RANDOM["output"]}

    response = world.owner.post("/api/v1/workloads", {"name": "mt", "spec": spec})

    assert response.status_code == 400
    assert response.json()["detail"].startswith("spec: spec.turns: a whole number from 1 to 64")


def test_a_sweep_names_a_workload_sends_its_prompts_and_records_it(
    world, broker, django_capture_on_commit_callbacks
):
    content = json.dumps(SHAREGPT)
    workload = Workload.objects.get(
        pk=world.owner.post("/api/v1/workloads", _dataset("chats.json", content)).json()["id"]
    )

    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep_of(world, "chats.json")

    assert response.status_code == 201, response.json()
    run = SweepRun.objects.get()
    assert run.parameters["workload"] == {**workload.record(), "spec": workload.spec}
    assert run.snapshot["workload"] == {
        "name": "chats.json",
        "version": 1,
        "kind": "dataset",
        "sha256": workload.sha256,
    }
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["workload_items"] == workload.items
    assert "workload_items" not in run.parameters


def test_a_sweep_naming_no_such_workload_is_refused(world):
    response = _sweep_of(world, "nope")

    assert response.status_code == 400
    assert response.json()["detail"] == "workload: no workload 'nope'"
    assert not SweepRun.objects.exists()


def test_a_multi_turn_workload_sent_to_the_completions_endpoint_runs_on_chat(
    world, broker, django_capture_on_commit_callbacks
):
    spec = {"kind": "multi_turn", "turns": 3, "question_len": 8, "output": RANDOM["output"]}
    world.owner.post("/api/v1/workloads", {"name": "mt", "spec": spec})

    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep_of(world, "mt", endpoint="completions")

    assert response.status_code == 201, response.json()
    assert SweepRun.objects.get().parameters["endpoint"] == "chat"
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["endpoint"] == "chat"


MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"


def test_a_multi_turn_workload_takes_an_mt_bench_file_and_its_sweep_sends_the_conversations(
    world, broker, django_capture_on_commit_callbacks
):
    spec = {"kind": "multi_turn", "think_time_s": 0.5}
    body = {"name": "mt-bench", "spec": spec, "file_name": MT_BENCH.name}

    response = world.owner.post("/api/v1/workloads", {**body, "content": MT_BENCH.read_text()})

    assert response.status_code == 201, response.json()
    workload = Workload.objects.get()
    assert (workload.layout, workload.item_count) == ("mtbench", 8)
    assert workload.spec == {
        "kind": "multi_turn",
        "from_file": True,
        "turns": None,
        "think_time_s": 0.5,
        "output": None,
    }
    assert workload.sha256 == hashlib.sha256(MT_BENCH.read_bytes()).hexdigest()
    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep_of(world, "mt-bench")
    assert response.status_code == 201, response.json()
    [task] = queues.queued(broker, QUEUE)
    # each question's two turns travel to the worker, and the chat endpoint is picked
    assert [len(item["turns"]) for item in task.kwargs["workload_items"]] == [2] * 8
    assert task.kwargs["endpoint"] == "chat"


def test_a_multi_turn_workload_of_random_questions_still_takes_no_question_from_nowhere(world):
    response = world.owner.post(
        "/api/v1/workloads", {"name": "mt", "spec": {"kind": "multi_turn", "turns": 2}}
    )

    assert response.status_code == 400
    assert response.json()["detail"].startswith("spec: spec.question_len: a whole number")
    assert not Workload.objects.exists()


SHARED_PREFIX = shared_prefix_spec(groups=2, prefix_len=512, question_len=16, output_len=32)


@pytest.mark.parametrize(("spec", "cold"), [(SHARED_PREFIX, True), (RANDOM, False)])
def test_a_shared_prefix_sweep_the_engine_cached_nothing_of_gets_the_cold_cache_finding(
    world, broker, django_capture_on_commit_callbacks, spec, cold
):
    world.owner.post("/api/v1/workloads", {"name": "traffic", "spec": spec})
    with django_capture_on_commit_callbacks(execute=True):
        _sweep_of(world, "traffic")
    run = SweepRun.objects.get()
    url = f"/api/v1/runs/{run.uuid}"
    # the worker's pushes: vLLM's counters moved by 16 prompts of 528 tokens, none of them a hit
    counters = {"engine": "vllm", "prefix_cache_queries": 16 * 528.0, "prefix_cache_hits": 0.0}
    level = {"concurrency": 4, "completed": 16, "failed": 0, "output_throughput": 100.0}
    assert world.host_worker.patch(url, {"status": "running"}).status_code == 200
    answer = world.host_worker.post(
        f"{url}/levels", {**level, "raw": {"engine_counters": counters}}
    )
    assert answer.json()["engine_figures"]["prefix_cache_hit_rate"] == 0
    assert world.host_worker.patch(url, {"status": "succeeded"}).status_code == 200

    run_analyze(run=SweepRun.objects.get())

    found = Finding.objects.filter(run=run, kind="prefix_cache", key="cold")
    assert found.exists() == cold


def test_runs_of_two_workloads_differ_in_the_workload_factor():
    a = {"source": "worker", "workload": snapshots.workload_record({})}
    b = {
        "source": "worker",
        "workload": {"name": "chats", "version": 2, "kind": "dataset", "sha256": "ab" * 32},
    }

    diff = snapshots.snapshot_diff(a, b)

    assert "workload" in snapshots.differing_factors(diff)
    assert {c["key"] for c in diff["changes"] if c["section"] == "workload"} == {
        "name",
        "version",
        "kind",
        "sha256",
    }


def test_a_sweep_recorded_before_workloads_sent_random_ids():
    old = {"source": "worker"}
    new = {"source": "worker", "workload": snapshots.workload_record({"input_len": 5})}

    diff = snapshots.snapshot_diff(old, new)

    assert "workload" not in snapshots.differing_factors(diff)


TRACE = Path(__file__).parents[1] / "fixtures" / "workloads" / "mooncake_trace.jsonl"


def test_a_trace_workload_stores_its_requests_and_its_sweep_carries_them(
    world, broker, django_capture_on_commit_callbacks
):
    body = {"name": "prod day", "spec": {"kind": "trace", "block_size": 128, "speed": 2}}

    response = world.owner.post(
        "/api/v1/workloads", {**body, "file_name": TRACE.name, "content": TRACE.read_text()}
    )

    assert response.status_code == 201, response.json()
    stored = response.json()
    assert (stored["kind"], stored["layout"], stored["item_count"]) == ("trace", "mooncake", 12)
    assert stored["spec"] == {"kind": "trace", "block_size": 128, "speed": 2.0}
    workload = Workload.objects.get()
    assert workload.items[2] == {
        "timestamp": 500,
        "input_length": 420,
        "output_length": 4,
        "hash_ids": [1, 2, 3, 5],
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep_of(world, "prod day")
    assert response.status_code == 201, response.json()
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["workload_items"] == workload.items


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (None, "file: a trace workload needs its trace file"),
        (
            '{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [1, 2, 3]}\n'
            '{"timestamp": 250, "input_length": 300, "output_le',
            "file: t.jsonl, line 2: not a JSON object (JSONL)",
        ),
        (
            '{"timestamp": 0, "input_length": 200, "output_length": 4, "hash_ids": [1, 2, 3]}',
            "file: t.jsonl, line 1: input_length: 200 tokens do not reach the last of its 3",
        ),
    ],
)
def test_a_bad_trace_is_refused_naming_its_line_and_nothing_is_stored(world, content, detail):
    body = {"name": "t", "spec": {"kind": "trace", "block_size": 128}, "file_name": "t.jsonl"}
    if content is not None:
        body["content"] = content

    response = world.owner.post("/api/v1/workloads", body)

    assert response.status_code == 400
    assert response.json()["detail"].startswith(detail), response.json()
    assert not Workload.objects.exists()


def test_a_sweep_of_a_trace_takes_no_request_rate_and_no_capacity_search(world):
    world.owner.post(
        "/api/v1/workloads",
        {
            "name": "day",
            "spec": {"kind": "trace", "block_size": 128},
            "file_name": TRACE.name,
            "content": TRACE.read_text(),
        },
    )

    rated = _sweep_of(world, "day", request_rates=[2.0])

    assert rated.status_code == 400
    assert rated.json()["detail"].startswith(
        "parameters.request_rates: a trace sends at its own timestamps"
    )
    assert not SweepRun.objects.exists()
