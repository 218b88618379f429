"""Result files of AIPerf, guidellm and inference-perf, each written by the tool against the
real vLLM of `make test` (tests/fixtures/results/<tool>/COMMAND.md), imported as runs: their
figures as the file gives them, under vLLM's metric names, filed under the model the file names
and never under the deployment's GPUs."""

import json

import pytest

from moeops.fleet.models import Deployment, ModelSpec
from moeops.runs import load_tools
from moeops.runs.importers import parse_results
from moeops.runs.models import LevelResult, RequestLog, SweepRun
from tests.api_base import make_world
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
AIPERF = [RESULTS / "aiperf" / f"concurrency_{c}" / "profile_export_aiperf.json" for c in (2, 4)]
GUIDELLM = RESULTS / "guidellm" / "benchmarks.json"
INFERENCE_PERF = [RESULTS / "inference-perf" / f"stage_{n}_lifecycle_metrics.json" for n in (0, 1)]
# inference-perf's run configuration: the one it ran with (--config_file), and the one it wrote
# into its report folder (every default written out)
CONFIGS = [RESULTS / "inference-perf" / name for name in ("config.yml", "config.yaml")]
# (format, file) of every fixture
FILES = [
    *(("aiperf", path) for path in AIPERF),
    ("guidellm", GUIDELLM),
    *(("inference-perf", path) for path in INFERENCE_PERF),
]
# the model the tools were pointed at (vLLM served it as "tiny-moe": tests/engine)
SERVED = "tiny-moe"


def _id(item):
    fmt, path = item
    return f"{fmt}:{path.parent.name}/{path.name}"


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def tiny(world):
    """A deployment of the model the files measured, on a host of 2 GPUs, at TP 2."""
    model = ModelSpec.objects.create(name=SERVED, config_json={})
    return Deployment.objects.create(name="tiny", model=model, host=world.host, tp=2)


def _import(client, path, fmt, deployment="tiny", **fields):
    body = {"format": fmt, "deployment": deployment, "content": path.read_text()}
    return client.post("/api/v1/runs/import", {**body, "file_name": path.name, **fields})


def _nothing_stored():
    return not SweepRun.objects.exists() and not LevelResult.objects.exists()


# --------------------------------------------------------------------------- figures


@pytest.mark.parametrize("path", AIPERF, ids=lambda p: p.parent.name)
def test_an_aiperf_summary_is_one_level_of_the_files_figures(path):
    doc = json.loads(path.read_text())
    [level] = parse_results(path.read_text(), "aiperf")
    [phase] = [p for p in doc["input_config"]["phases"] if p["kind"] == "profiling"]
    assert level["concurrency"] == phase["concurrency"] and level["request_rate"] is None
    assert level["duration"] == doc["benchmark_duration"]["avg"]
    assert level["completed"] == doc["request_count"]["avg"] and level["failed"] == 0
    assert level["total_input_tokens"] == doc["total_isl"]["avg"]
    assert level["total_output_tokens"] == doc["total_osl"]["avg"]
    assert level["request_throughput"] == doc["request_throughput"]["avg"]
    assert level["output_throughput"] == doc["output_token_throughput"]["avg"]
    assert level["total_token_throughput"] == doc["total_token_throughput"]["avg"]
    for metric, key in load_tools.AIPERF_LATENCY.items():
        for stat, theirs in load_tools.AIPERF_STATS.items():
            assert level[f"{stat}_{metric}_ms"] == doc[key][theirs], (metric, stat)
    # inter_token_latency is vLLM's TPOT (per request), inter_chunk_latency its ITL (per gap)
    assert level["mean_tpot_ms"] == doc["inter_token_latency"]["avg"]
    assert level["p99_itl_ms"] == doc["inter_chunk_latency"]["p99"]
    assert level["raw"]["tool_version"] == doc["aiperf_version"] == "0.13.0"
    assert "requests" not in level


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("path", AIPERF, ids=lambda p: p.parent.name)
def test_aiperf_records_beside_the_summary_are_the_levels_requests(path):
    records = path.parent / "profile_export.jsonl"
    [level] = parse_results(path.read_text(), "aiperf", records.read_text())
    requests, lines = level["requests"], _records(records)
    assert len(requests["status"]) == len(lines) == level["completed"]
    assert requests["status"] == ["ok"] * len(lines)
    starts = [r["metadata"]["request_start_ns"] for r in lines]
    assert requests["start_time"] == pytest.approx(
        [(s - min(starts)) / 1e9 for s in starts], abs=1e-6
    )
    for key, column in (("time_to_first_token", "ttft"), ("request_latency", "latency")):
        assert requests[column] == pytest.approx([r["metrics"][key]["value"] / 1000 for r in lines])
    assert requests["input_len"] == [r["metrics"]["input_sequence_length"]["value"] for r in lines]
    # AIPerf's own count of output tokens, as its summary's total_osl
    assert requests["output_len"] == [
        r["metrics"]["output_sequence_length"]["value"] for r in lines
    ]
    assert sum(requests["output_len"]) == level["total_output_tokens"]
    assert requests["itl"] == [
        pytest.approx([gap / 1000 for gap in r["metrics"]["inter_chunk_latency"]["value"]])
        for r in lines
    ]


def test_guidellm_benchmarks_are_levels_with_their_requests():
    doc = json.loads(GUIDELLM.read_text())
    levels = parse_results(GUIDELLM.read_text(), "guidellm")
    assert [level["concurrency"] for level in levels] == [
        b["config"]["strategy"]["streams"] for b in doc["benchmarks"]
    ]
    assert [level["concurrency"] for level in levels] == [2, 4]
    for level, benchmark in zip(levels, doc["benchmarks"], strict=True):
        metrics = benchmark["metrics"]
        assert level["request_rate"] is None
        assert level["duration"] == benchmark["duration"]
        assert level["completed"] == metrics["request_totals"]["successful"]
        assert level["failed"] == metrics["request_totals"]["errored"]
        assert (
            level["total_input_tokens"] == metrics["prompt_token_count"]["successful"]["total_sum"]
        )
        assert (
            level["total_output_tokens"] == metrics["output_token_count"]["successful"]["total_sum"]
        )
        assert (
            level["output_throughput"] == metrics["output_tokens_per_second"]["successful"]["mean"]
        )
        assert level["request_throughput"] == metrics["requests_per_second"]["successful"]["mean"]
        ttft = metrics["time_to_first_token_ms"]["successful"]
        assert (level["mean_ttft_ms"], level["median_ttft_ms"], level["std_ttft_ms"]) == (
            ttft["mean"],
            ttft["median"],
            ttft["std_dev"],
        )
        assert level["p99_ttft_ms"] == ttft["percentiles"]["p99"]
        assert level["mean_tpot_ms"] == metrics["inter_token_latency_ms"]["successful"]["mean"]
        # request_latency is in s
        latency = metrics["request_latency"]["successful"]
        assert level["p95_e2el_ms"] == pytest.approx(latency["percentiles"]["p95"] * 1000)
        assert level.get("mean_itl_ms") is None  # guidellm keeps no gap between chunks

        kept = benchmark["requests"]["successful"]
        requests = level["requests"]
        assert len(requests["status"]) == len(kept) == level["completed"]
        assert requests["status"] == ["ok"] * len(kept)
        assert requests["input_len"] == [r["prompt_tokens"] for r in kept]
        assert requests["output_len"] == [r["output_tokens"] for r in kept]
        assert requests["latency"] == [r["request_latency"] for r in kept]
        assert requests["ttft"] == pytest.approx([r["time_to_first_token_ms"] / 1000 for r in kept])
        starts = [r["info"]["timings"]["request_start"] for r in kept]
        assert requests["start_time"] == pytest.approx([s - min(starts) for s in starts], abs=1e-6)
        assert "requests" not in level["raw"]


@pytest.mark.parametrize("path", INFERENCE_PERF, ids=lambda p: p.name)
def test_an_inference_perf_stage_is_one_level_of_the_files_figures(path):
    doc = json.loads(path.read_text())
    [level] = parse_results(path.read_text(), "inference-perf")
    ok = doc["successes"]
    assert level["concurrency"] == doc["load_summary"]["concurrency"]
    # a concurrent stage's requested_rate is no rate it was held to
    assert level["request_rate"] is None
    assert level["duration"] == doc["benchmark_time_seconds"]
    assert (level["completed"], level["failed"]) == (ok["count"], doc["failures"]["count"])
    assert level["total_input_tokens"] == ok["prompt_tokens"]["total"]
    assert level["total_output_tokens"] == ok["output_tokens"]["total"]
    assert level["output_throughput"] == ok["throughput"]["output_tokens_per_sec"]
    assert level["total_token_throughput"] == ok["throughput"]["total_tokens_per_sec"]
    for metric, key in load_tools.INFERENCE_PERF_LATENCY.items():
        for stat, theirs in load_tools.INFERENCE_PERF_STATS.items():
            expected = ok["latency"][key][theirs] * 1000
            assert level[f"{stat}_{metric}_ms"] == pytest.approx(expected), (metric, stat)
    assert level.get("std_ttft_ms") is None  # inference-perf writes no std


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize("item", [f for f in FILES if f[0] != "inference-perf"], ids=_id)
def test_a_file_imports_as_the_model_it_names_with_no_gpu_count(world, tiny, item):
    fmt, path = item
    response = _import(world.owner, path, fmt)
    assert response.status_code == 201, response.text
    run = SweepRun.objects.get()
    levels = parse_results(path.read_text(), fmt)
    assert response.json()["levels"] == run.levels.count() == len(levels)
    assert run.other_model is None
    recorded = run.snapshot["deployment"]
    assert recorded["model"] == SERVED
    # no tool's file states its GPUs: never the host's 2
    assert recorded["gpus"] == [] and run.measured_gpu_count() is None
    assert run.snapshot["file"]["stated"]["gpu_count"] is None
    assert run.snapshot["file"]["tool"] == fmt
    for level in levels:
        row = run.levels.get(concurrency=level["concurrency"])
        assert row.output_throughput == level["output_throughput"]
        assert row.mean_ttft_ms == level["mean_ttft_ms"]
    logs = RequestLog.objects.filter(level__run=run)
    if fmt == "guidellm":
        assert sorted(log.count for log in logs) == [8, 8]
    else:
        assert not logs.exists()


@pytest.mark.parametrize("item", [f for f in FILES if f[0] != "inference-perf"], ids=_id)
def test_a_file_of_another_model_is_a_409_naming_both_until_confirmed(world, item):
    fmt, path = item
    refused = _import(world.owner, path, fmt, deployment="glm-5-sglang")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": f"content: the file measured {SERVED}; the deployment glm-5-sglang serves "
        "GLM-5 at TP8 on SGLang (they differ in model); send accept_mismatch: true to import "
        "it all the same",
        "differences": ["model"],
    }
    assert _nothing_stored()
    accepted = _import(world.owner, path, fmt, deployment="glm-5-sglang", accept_mismatch=True)
    assert accepted.status_code == 201
    run = SweepRun.objects.get()
    assert run.other_model == SERVED and run.snapshot["deployment"]["model"] == SERVED
    assert run.snapshot["deployment"]["gpus"] == [] and run.measured_gpu_count() is None


@pytest.mark.parametrize("path", INFERENCE_PERF, ids=lambda p: p.name)
def test_an_inference_perf_stage_names_no_model_so_is_never_the_deployments(world, tiny, path):
    refused = _import(world.owner, path, "inference-perf")
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(
        "content: the file measured an unnamed model; the deployment tiny serves tiny-moe at TP2 "
    )
    assert _nothing_stored()
    accepted = _import(world.owner, path, "inference-perf", accept_mismatch=True)
    assert accepted.status_code == 201
    run = SweepRun.objects.get()
    assert run.other_model == "an unnamed model"
    assert run.snapshot["deployment"]["model"] is None
    assert run.measured_gpu_count() is None


def test_aiperf_records_sent_beside_the_summary_become_the_request_log(world, tiny):
    path = AIPERF[1]
    records = (path.parent / "profile_export.jsonl").read_text()
    response = _import(world.owner, path, "aiperf", requests_content=records)
    assert response.status_code == 201, response.text
    log = RequestLog.objects.get(level__run__deployment=tiny)
    assert log.count == len(records.splitlines())
    # the summary without its records is another import
    again = _import(world.owner, path, "aiperf")
    assert again.status_code == 201 and SweepRun.objects.count() == 2


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize("item", FILES, ids=_id)
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9, 0.999])
def test_a_truncated_copy_is_refused_naming_its_line(world, tiny, item, fraction):
    fmt, path = item
    text = path.read_text()
    body = {
        "format": fmt,
        "deployment": "tiny",
        "content": text[: int(len(text) * fraction)],
        "accept_mismatch": True,
    }
    response = world.owner.post("/api/v1/runs/import", body)
    assert response.status_code == 400, response.text
    [problem] = response.json()["problems"]
    assert problem.startswith("line ") and ": not JSON (" in problem
    assert _nothing_stored()


def _changed(path, keys, value):
    doc = json.loads(path.read_text())
    holder = doc
    for key in keys[:-1]:
        holder = holder[key]
    holder[keys[-1]] = value
    return json.dumps(doc)


# (format, file, the key path changed, its new value, the words of the refusal)
CHANGED = [
    (
        "aiperf",
        AIPERF[0],
        ["time_to_first_token", "avg"],
        "113 ms",
        'time_to_first_token.avg is not a number: "113 ms"',
    ),
    (
        "aiperf",
        AIPERF[1],
        ["request_count"],
        8,
        "request_count is not an object: 8",
    ),
    (
        "aiperf",
        AIPERF[0],
        ["request_latency", "unit"],
        "s",
        "request_latency.unit is 's', not ms",
    ),
    (
        "guidellm",
        GUIDELLM,
        ["benchmarks", 1, "metrics", "request_totals", "successful"],
        "8",
        'benchmarks[1].metrics.request_totals.successful is not a number: "8"',
    ),
    (
        "guidellm",
        GUIDELLM,
        ["benchmarks", 0, "requests", "successful", 3, "request_latency"],
        [0.5],
        "benchmarks[0].requests.successful[3].request_latency is not a number: [0.5]",
    ),
    (
        "guidellm",
        GUIDELLM,
        ["benchmarks"],
        {"0": 1},
        'benchmarks is not a list: {"0": 1}',
    ),
    (
        "inference-perf",
        INFERENCE_PERF[0],
        ["successes", "throughput", "output_tokens_per_sec"],
        "61.2",
        'successes.throughput.output_tokens_per_sec is not a number: "61.2"',
    ),
    (
        "inference-perf",
        INFERENCE_PERF[1],
        ["load_summary", "concurrency"],
        4.5,
        "load_summary.concurrency is not a count: 4.5",
    ),
    (
        "inference-perf",
        INFERENCE_PERF[0],
        ["failures", "count"],
        10**400,
        f"failures.count is too large a number: {str(10**400)[:37]}… (401 characters)",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "path", "keys", "value", "problem"),
    CHANGED,
    ids=[".".join(map(str, c[2])) for c in CHANGED],
)
def test_a_copy_with_a_value_of_another_type_is_refused_naming_its_key(
    world, tiny, fmt, path, keys, value, problem
):
    body = {
        "format": fmt,
        "deployment": "tiny",
        "content": _changed(path, keys, value),
        "accept_mismatch": True,
    }
    response = world.owner.post("/api/v1/runs/import", body)
    assert response.status_code == 400, response.text
    assert response.json()["problems"] == [problem]
    assert _nothing_stored()


def test_a_file_of_another_tool_is_refused_saying_whose_it_is_not(world, tiny):
    response = _import(world.owner, GUIDELLM, "aiperf")
    assert response.status_code == 400
    assert response.json()["problems"] == [
        "line 1: not AIPerf's profile_export_aiperf.json (no aiperf_version)"
    ]
    assert _nothing_stored()


def _refused_records(world, records, problem):
    path = AIPERF[0]
    response = _import(world.owner, path, "aiperf", requests_content=records)
    assert response.status_code == 400, response.text
    assert response.json()["problems"] == [problem]
    assert _nothing_stored()


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9, 0.999])
def test_a_truncated_copy_of_aiperf_records_is_refused_naming_its_line(world, tiny, fraction):
    text = (AIPERF[0].parent / "profile_export.jsonl").read_text()
    cut = text[: int(len(text) * fraction)]
    response = _import(world.owner, AIPERF[0], "aiperf", requests_content=cut)
    assert response.status_code == 400, response.text
    [problem] = response.json()["problems"]
    last = cut.count("\n") + 1
    if cut.endswith("\n"):
        # a cut between records leaves whole ones, fewer than the summary counts
        assert problem == f"requests: the records hold {last - 1} requests, the summary counts 8"
    else:
        assert problem.startswith(f"requests: line {last}: not JSON (")
    assert _nothing_stored()


def test_aiperf_records_with_a_value_of_another_type_are_refused_naming_line_and_key(world, tiny):
    lines = (AIPERF[0].parent / "profile_export.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    record["metrics"]["time_to_first_token"]["value"] = "fast"
    lines[2] = json.dumps(record)
    _refused_records(
        world,
        "\n".join(lines),
        'requests: line 3: metrics.time_to_first_token.value is not a number: "fast"',
    )


def test_records_of_another_level_are_refused_by_their_count(world, tiny):
    lines = (AIPERF[0].parent / "profile_export.jsonl").read_text().splitlines()
    _refused_records(
        world,
        "\n".join(lines[:-1]),
        f"requests: the records hold {len(lines) - 1} requests, the summary counts {len(lines)}",
    )


def test_records_beside_another_format_are_refused(world, tiny):
    records = (AIPERF[0].parent / "profile_export.jsonl").read_text()
    response = _import(world.owner, GUIDELLM, "guidellm", requests_content=records)
    assert response.status_code == 400
    assert response.json()["problems"] == [
        "requests: only AIPerf's per-request records and inference-perf's run configuration "
        "come as a file of their own"
    ]
    assert _nothing_stored()


# ------------------------------------------------------------------ inference-perf's config


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("path", INFERENCE_PERF, ids=lambda p: p.name)
def test_an_inference_perf_stage_with_its_config_imports_as_its_model(world, tiny, path, config):
    tiny.engine = "vllm"
    tiny.save()
    response = _import(world.owner, path, "inference-perf", requests_content=config.read_text())
    assert response.status_code == 201, response.text
    run = SweepRun.objects.get()
    assert run.other_model is None
    assert run.snapshot["deployment"]["model"] == SERVED
    stated = run.snapshot["file"]["stated"]
    assert (stated["model"], stated["engine"], stated["gpu_count"]) == (SERVED, "vllm", None)
    assert run.snapshot["file"]["tokenizer_id"] == "/work/main/var/engine/tiny-moe"
    assert run.snapshot["deployment"]["gpus"] == [] and run.measured_gpu_count() is None
    [level] = parse_results(path.read_text(), "inference-perf")
    row = run.levels.get()
    assert (row.concurrency, row.output_throughput) == (
        level["concurrency"],
        level["output_throughput"],
    )
    # the stage without its config is another import, of an unnamed model
    again = _import(world.owner, path, "inference-perf", accept_mismatch=True)
    assert again.status_code == 201 and SweepRun.objects.count() == 2
    assert SweepRun.objects.exclude(pk=run.pk).get().other_model == "an unnamed model"


def test_an_inference_perf_config_naming_another_engine_is_refused_naming_it(world, tiny):
    config = CONFIGS[0].read_text()
    refused = _import(world.owner, INFERENCE_PERF[0], "inference-perf", requests_content=config)
    assert refused.status_code == 409
    assert refused.json()["differences"] == ["engine"]
    assert _nothing_stored()
    sglang = config.replace("type: vllm", "type: sglang")
    tiny.engine = "vllm"
    tiny.save()
    refused = _import(world.owner, INFERENCE_PERF[0], "inference-perf", requests_content=sglang)
    assert refused.json()["differences"] == ["engine"]
    # tgi names no engine moeops knows: no disagreement
    tgi = config.replace("type: vllm", "type: tgi")
    accepted = _import(world.owner, INFERENCE_PERF[0], "inference-perf", requests_content=tgi)
    assert accepted.status_code == 201, accepted.text
    assert SweepRun.objects.get().snapshot["file"]["stated"]["engine"] is None


def test_an_inference_perf_stage_of_another_model_is_a_409_naming_both(world):
    config = CONFIGS[0].read_text()
    fields = {"deployment": "glm-5-sglang", "requests_content": config}
    refused = _import(world.owner, INFERENCE_PERF[1], "inference-perf", **fields)
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": f"content: the file measured {SERVED} on vLLM; the deployment glm-5-sglang "
        "serves GLM-5 at TP8 on SGLang (they differ in model, engine); send accept_mismatch: "
        "true to import it all the same",
        "differences": ["model", "engine"],
    }
    assert _nothing_stored()
    accepted = _import(
        world.owner, INFERENCE_PERF[1], "inference-perf", accept_mismatch=True, **fields
    )
    assert accepted.status_code == 201
    run = SweepRun.objects.get()
    assert run.other_model == SERVED and run.snapshot["deployment"]["model"] == SERVED


def test_an_inference_perf_config_naming_no_model_names_it_by_its_tokenizer(world, tiny):
    # model_name left to the server: the tokenizer's path names the model it was written for
    config = CONFIGS[0].read_text().replace("  model_name: tiny-moe\n", "")
    tiny.engine = "vllm"
    tiny.save()
    response = _import(world.owner, INFERENCE_PERF[0], "inference-perf", requests_content=config)
    assert response.status_code == 201, response.text
    stated = SweepRun.objects.get().snapshot["file"]["stated"]
    assert stated["model"] == "/work/main/var/engine/tiny-moe"


def _refused_config(world, config, problem):
    fields = {"requests_content": config, "accept_mismatch": True}
    response = _import(world.owner, INFERENCE_PERF[0], "inference-perf", **fields)
    assert response.status_code == 400, response.text
    assert response.json()["problems"] == [problem]
    assert _nothing_stored()


# a cut inside a line: YAML that stops, named by its last line
@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.15, 0.5, 0.9])
def test_a_truncated_inference_perf_config_is_refused_naming_its_line(world, tiny, fraction):
    text = CONFIGS[0].read_text()
    cut = text[: int(len(text) * fraction)]
    fields = {"requests_content": cut, "accept_mismatch": True}
    response = _import(world.owner, INFERENCE_PERF[0], "inference-perf", **fields)
    assert response.status_code == 400, response.text
    [problem] = response.json()["problems"]
    assert problem.startswith(f"config: line {cut.count(chr(10)) + 1}: not YAML (")
    assert _nothing_stored()


# the report folder's config.yaml writes server and tokenizer last: a cut loses them
@pytest.mark.parametrize(
    ("fraction", "problem"),
    [
        (0.2, "server is missing: the configuration names no server it measured"),
        (0.75, "server is missing: the configuration names no server it measured"),
        (0.95, 'tokenizer is not an object: "pretrained_model_name_or_pat"'),
    ],
)
def test_a_truncated_report_config_is_refused_naming_what_it_lost(world, tiny, fraction, problem):
    text = CONFIGS[1].read_text()
    _refused_config(world, text[: int(len(text) * fraction)], f"config: {problem}")


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("model_name: tiny-moe", "model_name: 5", "server.model_name is not text: 5"),
        ("type: vllm", "type: [vllm]", 'server.type is not text: ["vllm"]'),
        (
            "server:\n  type: vllm",
            "server: vllm\nx:\n  type: vllm",
            'server is not an object: "vllm"',
        ),
    ],
    ids=["model_name", "type", "server"],
)
def test_an_inference_perf_config_with_a_value_of_another_type_is_refused_naming_its_key(
    world, tiny, old, new, problem
):
    config = CONFIGS[0].read_text()
    assert old in config
    _refused_config(world, config.replace(old, new, 1), f"config: {problem}")


def test_a_file_that_is_not_a_config_is_refused(world, tiny):
    _refused_config(
        world, "- 1\n- 2\n", "config: line 1: not inference-perf's run configuration: [1, 2]"
    )
    stage = INFERENCE_PERF[1].read_text()
    _refused_config(
        world, stage, "config: server is missing: the configuration names no server it measured"
    )
