"""Property-based runs of the write paths: every operation of the OpenAPI schema
(schemathesis), the nested JSON fields with what PostgreSQL cannot store, and result files to
import, mutated. No request gets a 5xx, and a request answered 4xx writes no row."""

import copy
import json

import pytest
import schemathesis
from django.apps import apps
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from moeops.insights.models import Finding, Note, PlanItem
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.wsgi import application
from tests.api_base import GLM5_CONFIG, make_world, wsgi_in_test_transaction
from tests.fakes import FIXTURES, KERNEL_ENTRY

RUN_UUID = "6f0c7f6e-55a4-4b42-9a3f-3d1f9f3c0d10"
TUNING_UUID = "9d2b4a3e-7c61-4c0f-8f0e-2a6b1e5d7c22"
# Path references that name existing rows, filled per test by the `world` fixture: random
# strings alone would only ever reach the 404 branch.
KNOWN_REFS = ["glm-5-sglang", "rtx-pro-6000", "GLM-5", RUN_UUID, TUNING_UUID, "known-note"]

# Hundreds of generated requests, most of make check's time were they in it: make test runs them.
pytestmark = pytest.mark.fuzz

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


@schema.hook("flatmap_path_parameters")
def known_or_generated(context, path_parameters):
    if not path_parameters:
        return st.just(path_parameters)
    known = st.sampled_from(KNOWN_REFS).map(lambda ref: {name: ref for name in path_parameters})
    return st.one_of(st.just(path_parameters), known)


@pytest.fixture
def world(db):
    world = make_world()
    run = world.run(uuid=RUN_UUID, status="running")
    config = KernelConfig.objects.create(
        device_name="NVIDIA H200",
        E=256,
        N=256,
        entries={"1": KERNEL_ENTRY},
        triton_version="3.7.1",
    )
    TuningRun.objects.create(
        uuid=TUNING_UUID, host=world.host, E=256, N=256, hidden_size=6144, topk=8
    )
    finding = Finding.objects.create(
        deployment=world.deployment, run=run, kind="plateau", title="t"
    )
    PlanItem.objects.create(deployment=world.deployment, finding=finding, title="tune")
    Note.objects.create(title="Known", slug="known-note", body="*hi*")
    ids = [str(run.pk), str(config.pk), str(finding.pk)]
    KNOWN_REFS.extend(ids)
    with wsgi_in_test_transaction():
        yield world
    del KNOWN_REFS[-len(ids) :]


def _row_counts():
    """Rows per table, in one query (it runs before and after each of some 2,000 requests)."""
    tables = sorted({model._meta.db_table for model in apps.get_models()})
    counts = ", ".join(f"(SELECT COUNT(*) FROM {connection.ops.quote_name(t)})" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counts}")
        return dict(zip(tables, cursor.fetchone(), strict=True))


def _check(response, before, what):
    """No 5xx; a 4xx left every table as it was."""
    status = response.status_code
    assert status < 500, f"{what} → {status} {response.text[:300]}"
    if status >= 400:
        assert _row_counts() == before, f"{what} → {status} wrote rows"


RESPONSE_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


@schema.parametrize()
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_5xx_nor_writes_on_a_4xx(case, world):
    before = _row_counts()
    response = case.call(headers={"Authorization": f"Bearer {world.owner_token}"})
    _check(response, before, f"{case.method} {case.formatted_path} {case.body!r}")
    # the schema is true: every answer, errors too, is documented with its status code, its
    # media type and the shape of its body
    case.validate_response(response, checks=RESPONSE_CHECKS)


# --------------------------------------------------------------------------- nested JSON

PROBE = json.loads((FIXTURES / "topology" / "probe_1xh200_firecracker.json").read_text())
# what jsonb refuses (NaN, Infinity, NUL, lone surrogates) among ordinary values
UNSTORABLE = st.sampled_from(
    [float("nan"), float("inf"), float("-inf"), "a\x00b", "\ud800", "x\udfffy", 2**70, -(2**31)]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), UNSTORABLE
)
KEYS = st.text(max_size=8) | st.sampled_from(["\x00", "\ud800", "levels", "input_len"])
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=10,
)


def _snapshot(junk, where):
    snapshot = copy.deepcopy(PROBE)
    snapshot["nics"] = [{"name": "NIC0", "device": "mlx5_0"}]
    gpu = snapshot["gpus"][0]
    part = {
        "gpus": gpu,
        "pcie": gpu["pcie"],
        "nics": snapshot["nics"][0],
        "affinity": snapshot["affinity"][0],
        "virtualization": snapshot["virtualization"],
    }.get(where, snapshot)
    part["extra"] = junk
    return {"snapshot": snapshot}


# (method, path, the body with a fuzzed value at a nested place)
NESTED = {
    "snapshot extra": (
        "post",
        "/api/v1/hosts/rtx-pro-6000/topology",
        lambda junk, where: _snapshot(junk, where),
    ),
    "run parameters": (
        "post",
        "/api/v1/runs",
        lambda junk, where: {"deployment": "glm-5-sglang", "parameters": {where: junk}},
    ),
    "run progress": (
        "patch",
        f"/api/v1/runs/{RUN_UUID}",
        lambda junk, where: {"progress": {where: junk}},
    ),
    "run snapshot": (
        "post",
        f"/api/v1/runs/{RUN_UUID}/snapshot",
        lambda junk, where: {"engine": {where: junk}},
    ),
    "level raw": (
        "post",
        f"/api/v1/runs/{RUN_UUID}/levels",
        lambda junk, where: {"concurrency": 8, "output_throughput": 1.0, "raw": {where: junk}},
    ),
    "level metric": (
        "post",
        f"/api/v1/runs/{RUN_UUID}/levels",
        lambda junk, where: {"concurrency": 16, "output_throughput": 1.0, "duration": junk},
    ),
    "model config": (
        "post",
        "/api/v1/models",
        lambda junk, where: {"name": "fuzzed", "config": {**GLM5_CONFIG, where: junk}},
    ),
    "model size": (
        "post",
        "/api/v1/models",
        lambda junk, where: {"name": "sized", "config": {**GLM5_CONFIG, "num_hidden_layers": junk}},
    ),
    "launch args": (
        "post",
        "/api/v1/deployments",
        lambda junk, where: {
            "name": "fuzzed",
            "model": "GLM-5",
            "host": "rtx-pro-6000",
            "launch_args": {where: junk},
        },
    ),
    "tuning progress": (
        "patch",
        f"/api/v1/tuning-runs/{TUNING_UUID}",
        lambda junk, where: {"progress": {where: junk}},
    ),
    "kernel entries": (
        "post",
        "/api/v1/kernel-configs",
        lambda junk, where: {"device_name": "NVIDIA H200", "E": 8, "N": 8, "entries": {"1": junk}},
    ),
    "finding evidence": (
        "post",
        "/api/v1/findings",
        lambda junk, where: {
            "deployment": "glm-5-sglang",
            "kind": "plateau",
            "title": "fuzzed",
            "evidence": {where: junk},
        },
    ),
}
# where the value goes: a part of a snapshot (else its top level), or the key it is set under
PLACES = ["gpus", "pcie", "nics", "affinity", "virtualization", "levels", "input_len", "x"]


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(target=st.sampled_from(sorted(NESTED)), where=st.sampled_from(PLACES), junk=JUNK)
def test_nested_json_gets_no_5xx_nor_writes_on_a_4xx(world, target, where, junk):
    method, path, body = NESTED[target]
    raw = json.dumps(body(junk, where), allow_nan=True).encode()
    before = _row_counts()
    response = getattr(world.owner, method)(path, raw=raw)
    _check(response, before, f"{target} at {where}: {junk!r}")


# --------------------------------------------------------------------------- imported files

RESULTS = FIXTURES / "results"
RESULT_FILES = {
    "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl": "sglang",
    "sglang_bench_serving_2024.jsonl": "sglang",
    "vllm_bench_serve_0.11.json": "vllm",
    "vllm_bench_serve_append.jsonl": "vllm",
    "vllm_benchmark_serving_0.4.0.json": "vllm",
}


def _mutated(text, mutation, key, value):
    """The file with one line's key set to value, or with its lines cut, doubled or emptied."""
    lines = text.splitlines()
    if mutation == "set":
        objects = [json.loads(line) for line in lines] if len(lines) > 1 else [json.loads(text)]
        objects[0][key] = value
        return "\n".join(json.dumps(obj, allow_nan=True) for obj in objects)
    if mutation == "cut":
        return text[: len(text) // 2]
    if mutation == "double":
        return "\n".join(lines + lines)
    return ""


@settings(
    max_examples=80,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    name=st.sampled_from(sorted(RESULT_FILES)),
    mutation=st.sampled_from(["set", "set", "set", "cut", "double", "empty"]),
    key=st.sampled_from(
        ["output_throughput", "duration", "max_concurrency", "completed", "request_rate"]
        + ["mean_ttft_ms", "errors", "server_info", "total_input_tokens", "dataset_name"]
    ),
    value=JUNK,
)
def test_imported_files_get_no_5xx_nor_write_on_a_4xx(world, name, mutation, key, value):
    content = _mutated((RESULTS / name).read_text(), mutation, key, value)
    body = {
        "format": RESULT_FILES[name],
        "deployment": "glm-5-sglang",
        "content": content,
        "file_name": name,
        # the files measured other models than GLM-5: past that check, to their parsing
        "accept_mismatch": True,
    }
    before = _row_counts()
    response = world.owner.post("/api/v1/runs/import", raw=json.dumps(body).encode())
    _check(response, before, f"{name} {mutation} {key}={value!r}")
