"""The engine-diff page and POST /api/v1/engine-diffs: what `python -m tuning engine-diff --json`
recorded between vLLM 0.33 and 0.34 (their wheels' fused-MoE code, tests.engine), stored and
shown by a web tier that runs no engine code."""

import io
import json

import pytest

from moeops.kernels.models import EngineDiff
from tests import page_base as pb
from tests.api_base import make_world
from tests.engine import engine_source
from tests.fakes import HF_CONFIGS
from tuning.__main__ import main

pytestmark = pytest.mark.django_db
UP = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine-diff") / "diff.json"
    old, new = str(engine_source("vllm", "0.33.0")), str(engine_source("vllm", "0.34.0"))
    argv = ["engine-diff", "--engine", "vllm", "--from", old, "--to", new]
    argv += ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def _upload(client, data: bytes):
    upload = io.BytesIO(data)
    upload.name = "diff.json"
    return client.post("/kernels/engine-diffs/", {"file": upload})


def test_an_uploaded_report_shows_what_vllm_034_changed(client, report):
    pb.sign_in(client)

    response = _upload(client, json.dumps(report).encode())

    diff = EngineDiff.objects.get()
    assert (
        response.status_code == 302 and response["Location"] == f"/kernels/engine-diffs/{diff.pk}/"
    )
    assert (diff.engine, diff.from_version, diff.to_version) == ("vllm", "0.33.0", "0.34.0")
    html = client.get(response["Location"]).content.decode()
    assert "vLLM 0.33.0 → 0.34.0 on NVIDIA H200" in html
    assert "launcher parameters: +A_is_sorted, +C_is_sorted" in html
    assert f"_down file: none → {UP}_down.json" in html
    # the shipped _down file side by side: none in 0.33, the path off at M=512 in 0.34
    down = html.split("<h2>Shipped _down file</h2>")[1].split("</table>")[0]
    assert '<th class="num">512</th><td class="changed"><del>none</del></td>' in down
    assert "USE_TMA=False" in down
    listing = client.get("/kernels/engine-diffs/").content.decode()
    assert f'href="/kernels/engine-diffs/{diff.pk}/"' in listing


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "The file is not JSON."),
        (b"[]", "an engine-diff report is a JSON object"),
        (b'{"engine": "vllm"}', "shape is missing"),
    ],
)
def test_a_file_that_is_no_report_is_refused_naming_why(client, data, problem):
    pb.sign_in(client)

    response = _upload(client, data)

    assert response.status_code == 400
    assert problem in response.content.decode()
    assert not EngineDiff.objects.exists()


def test_a_worker_pushes_a_report_through_the_api(report):
    world = make_world()

    response = world.owner.post("/api/v1/engine-diffs", {"report": report})

    assert response.status_code == 201
    assert "launcher parameters: +A_is_sorted, +C_is_sorted" in response.json()["lines"]
    broken = {**report, "new": {**report["new"], "launcher": "A_is_sorted"}}
    refused = world.owner.post("/api/v1/engine-diffs", {"report": broken})
    assert refused.status_code == 400
    assert "new.launcher has the wrong type" in refused.content.decode()
    assert EngineDiff.objects.count() == 1


def test_the_admin_lists_and_deletes_a_report_and_writes_none(admin_client, report):
    from moeops.kernels.services import engine_diff_store

    diff = engine_diff_store(report=report, provenance="python -m tuning engine-diff")
    listed = admin_client.get("/admin/kernels/enginediff/").content.decode()
    assert "vLLM 0.33.0 → 0.34.0 on NVIDIA H200" in listed
    assert admin_client.get("/admin/kernels/enginediff/add/").status_code == 403
    shown = admin_client.get(f"/admin/kernels/enginediff/{diff.pk}/change/")
    assert shown.status_code == 200 and 'name="report"' not in shown.content.decode()
    assert admin_client.post(f"/admin/kernels/enginediff/{diff.pk}/change/", {}).status_code == 403
    deleted = admin_client.post(f"/admin/kernels/enginediff/{diff.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and not EngineDiff.objects.exists()
