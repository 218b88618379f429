"""A run's levels exported as `vllm bench serve --save-result` objects (the run page's download
and GET /api/v1/runs/<ref>/vllm-results): vLLM's key names, and the file imports back into
moeops as the same levels."""

import json
import re
from pathlib import Path

import pytest

from domain.levels import LATENCY_KEYS
from moeops.runs import services as run_services
from moeops.runs.importers import ALIASES, ResultFileError
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from tests import page_base as pb

pytestmark = pytest.mark.django_db
FIXTURES = Path(__file__).parents[1] / "fixtures" / "results"
# what vLLM's process_one_metric names a statistic: mean_ttft_ms, p99_e2el_ms, …
VLLM_METRIC = re.compile(r"(mean|median|std|p\d+)_(ttft|tpot|itl|e2el)_ms")


def _figures(seed):
    """Every level figure moeops stores, each its own value (a figure lost or swapped shows)."""
    counts = {"completed": 60 + seed, "failed": seed % 3, "max_concurrent_requests": 8 + seed}
    tokens = {"total_input_tokens": 7680 * (seed + 1), "total_output_tokens": 1920 * (seed + 1)}
    floats = {
        "duration": 12.5 + seed,
        "request_throughput": 4.75 + seed,
        "output_throughput": 153.25 + seed,
        "total_token_throughput": 767.5 + seed,
        "max_output_tokens_per_s": 201.0 + seed,
        "request_goodput": 3.5 + seed,
    }
    latencies = {key: 10.0 + i + seed / 8 for i, key in enumerate(LATENCY_KEYS)}
    return {**counts, **tokens, **floats, **latencies}


@pytest.fixture
def swept(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    parameters = {"model": "glm-5", "endpoint": "chat", "burstiness": 1.0}
    run = pb.run(deployment, label="glm-5 chat sweep", parameters=parameters)
    loads = [(8, None), (32, None), (32, 4.0)]
    for seed, (concurrency, rate) in enumerate(loads):
        LevelResult.objects.create(
            run=run,
            key=level_key(concurrency, rate),
            concurrency=concurrency,
            request_rate=rate,
            input_len=1024,
            output_len=256,
            **_figures(seed),
        )
    return run


def _level_fields(level):
    fields = ("concurrency", "request_rate", "input_len", "output_len", *ALIASES)
    return {field: getattr(level, field) for field in fields}


def test_the_exported_json_imports_back_as_the_same_levels(client, swept):
    response = client.get(f"/runs/{swept.uuid}/vllm-results.json")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="glm-5-chat-sweep-vllm.json"'
    text = response.content.decode()
    imported, created = run_services.run_import(
        deployment=swept.deployment, fmt="vllm", text=text, file_name="sweep-vllm.json"
    )
    assert created and imported.pk != swept.pk
    order = ("concurrency", "request_rate")
    exported = [_level_fields(level) for level in swept.levels.order_by(*order)]
    assert [_level_fields(level) for level in imported.levels.order_by(*order)] == exported
    # the file names the model the requests named: the deployment's, no mismatch to confirm
    assert imported.recorded().other_model is None
    assert imported.parameters["format"] == "vllm"


def test_an_array_of_results_is_refused_naming_the_line_of_its_bad_object(client, swept):
    text = client.get(f"/runs/{swept.uuid}/vllm-results.json").content.decode()
    lines = text.splitlines()
    # the second level's object (line 3) loses its throughput
    lines[2] = lines[2].replace('"output_throughput"', '"output_throughput_was"')

    with pytest.raises(ResultFileError) as caught:
        run_services.run_import(
            deployment=swept.deployment, fmt="vllm", text="\n".join(lines), file_name="bad.json"
        )

    assert caught.value.problems == [
        "line 3: lacks the throughput keys (output_throughput, output_token_throughput)"
    ]
    assert SweepRun.objects.count() == 1


def test_each_level_is_one_object_under_vllms_key_names(client, swept):
    objects = json.loads(client.get(f"/runs/{swept.uuid}/vllm-results.json").content)

    assert [(o["max_concurrency"], o["request_rate"]) for o in objects] == [
        (8, "inf"),
        (32, "inf"),
        (32, 4.0),
    ]
    first = objects[0]
    assert first["backend"] == first["endpoint_type"] == "openai-chat"
    assert first["model_id"] == first["tokenizer_id"] == "glm-5"
    assert first["num_prompts"] == 60 and first["output_throughput"] == 153.25
    assert (first["random_input_len"], first["random_output_len"]) == (1024, 256)
    # every key is one vLLM writes: in a --save-result file written from vllm/benchmarks/serve.py,
    # a statistic as its process_one_metric names it, a sweep's bench parameter (summary.json),
    # or moeops' own as --metadata adds keys
    vllm_keys = set(json.loads((FIXTURES / "vllm_bench_serve_0.11.json").read_text()))
    sweep_keys = {"dataset_name", "random_input_len", "random_output_len"}
    unknown = {
        key for key in first if key not in vllm_keys | sweep_keys and not VLLM_METRIC.fullmatch(key)
    }
    assert unknown == {"moeops_run"}
    assert first["moeops_run"] == str(swept.uuid)


def test_the_api_answers_the_same_objects(client, swept):
    page = json.loads(client.get(f"/runs/{swept.uuid}/vllm-results.json").content)

    response = client.get(f"/api/v1/runs/{swept.uuid}/vllm-results")

    assert response.status_code == 200
    assert response.json() == page


def test_the_run_page_offers_the_download(client, swept):
    html = client.get(f"/runs/{swept.uuid}/").content.decode()

    assert f'href="/runs/{swept.uuid}/vllm-results.json"' in html
