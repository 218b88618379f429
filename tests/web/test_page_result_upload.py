"""Result files uploaded on the deployment page: the API's import service, in the browser's
form (real files written by SGLang's bench_serving and in vLLM's result layout)."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.examples import load_example_data
from moeops.fleet.models import Deployment
from moeops.runs.models import LevelResult, SweepRun
from tests import page_base as pb
from tests.fakes import FIXTURES

pytestmark = pytest.mark.django_db
RESULTS = FIXTURES / "results"
SGLANG = RESULTS / "TonyLi15-sglang-benchmark__pd_1p2d_n100_in512_out128_c64.jsonl"
VLLM = RESULTS / "vllm_bench_serve_0.11.json"


@pytest.fixture
def deployment(client):
    pb.sign_in(client)
    # the model the vLLM file measured (its model_id); the SGLang file's is Qwen's
    return pb.deployment(served_model_name="zai-org/GLM-5-FP8")


def _upload(client, deployment, path, fmt, **extra):
    upload = SimpleUploadedFile(path.name, path.read_bytes())
    return client.post(
        f"/deployments/{deployment.pk}/results/", {"format": fmt, "file": upload, **extra}
    )


def test_the_page_offers_the_upload(client, deployment):
    html = client.get(deployment.get_absolute_url()).content.decode()
    form = html.split('id="result-upload"')[1].split("</form>")[0]
    assert f'action="/deployments/{deployment.pk}/results/"' in form
    assert 'enctype="multipart/form-data"' in form
    assert '<option value="sglang">SGLang bench_serving (JSONL)</option>' in form


def test_an_sglang_jsonl_becomes_a_finished_run_with_what_its_server_said(client, deployment):
    refused = _upload(client, deployment, SGLANG, "sglang", label="pd 1p2d")
    assert refused.status_code == 400 and not SweepRun.objects.exists()
    assert "Not imported: the file measured Qwen/Qwen2.5-3B-Instruct" in refused.content.decode()
    response = _upload(client, deployment, SGLANG, "sglang", label="pd 1p2d", accept_mismatch="on")
    run = SweepRun.objects.get()
    assert run.other_model == "Qwen/Qwen2.5-3B-Instruct"
    assert response["Location"] == f"/runs/{run.uuid}/"
    assert (run.source, run.status, run.label) == ("import", "succeeded", "pd 1p2d")
    [level] = run.levels.all()
    assert level.concurrency == 64 and level.output_throughput > 0
    assert run.snapshot["file"]["file_name"] == SGLANG.name
    assert run.snapshot["engine"]["engine"] == "sglang"
    assert run.provenance == f"uploaded {SGLANG.name} on the deployment page"


def test_a_vllm_json_is_imported_and_the_same_file_again_opens_its_run(client, deployment):
    first = _upload(client, deployment, VLLM, "vllm")
    run = SweepRun.objects.get()
    assert run.levels.get().output_throughput == pytest.approx(806.161, abs=1e-3)
    again = _upload(client, deployment, VLLM, "vllm")
    assert again["Location"] == first["Location"] == f"/runs/{run.uuid}/"
    assert SweepRun.objects.count() == 1


def test_a_broken_file_lists_its_bad_lines_and_stores_nothing(client, deployment):
    response = _upload(client, deployment, RESULTS / "sglang_broken.jsonl", "sglang")
    assert response.status_code == 400
    form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
    assert "<details open>" in form
    assert "line 2: not JSON" in form
    assert "line 3: lacks the throughput keys" in form
    assert not SweepRun.objects.exists()


def test_a_file_that_is_not_text_is_refused(client, deployment):
    upload = SimpleUploadedFile("r.jsonl", b"\xff\xfe\x00binary")
    response = client.post(
        f"/deployments/{deployment.pk}/results/", {"format": "sglang", "file": upload}
    )
    assert response.status_code == 400
    assert "The file is not UTF-8 text." in response.content.decode()


AGG = RESULTS / "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
AGG_OBJECT = json.loads(AGG.read_text())


@pytest.mark.parametrize(
    ("fmt", "content", "named"),
    [
        ("sglang", json.dumps({**AGG_OBJECT, "output_throughput": 10**400}), "output_throughput"),
        ("sglang", json.dumps({**AGG_OBJECT, "request_rate": 10**400}), "request_rate"),
        ("vllm", json.dumps({**AGG_OBJECT, "completed": 10**400}), "completed"),
        ("vllm", "[" * 5000 + "]" * 5000, "not JSON (nested too deep to read)"),
        (
            "sglang",
            json.dumps({**AGG_OBJECT, "x": json.loads('{"a":' * 900 + "1" + "}" * 900)}),
            "nested",
        ),
    ],
)
def test_a_file_python_cannot_read_whole_is_refused_naming_its_line(
    client, deployment, fmt, content, named
):
    upload = SimpleUploadedFile("r.jsonl", content.encode())
    response = client.post(
        f"/deployments/{deployment.pk}/results/", {"format": fmt, "file": upload}
    )
    assert response.status_code == 400
    form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
    assert "line 1: " in form and named in form
    assert not SweepRun.objects.exists()


# --------------------------------------------------------------------------- another model


def _on_the_write_up(client):
    load_example_data()
    return Deployment.objects.get(name="GLM-5-NVFP4 on 8× RTX PRO 6000")


def test_a_file_of_another_model_is_refused_saying_what_it_measured(client, deployment):
    glm5 = _on_the_write_up(client)
    runs = SweepRun.objects.count()
    response = _upload(client, glm5, AGG, "sglang")
    assert response.status_code == 400
    form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
    assert (
        "Not imported: the file measured Qwen/Qwen2.5-3B-Instruct at TP1 (1 GPU) on SGLang "
        "0.5.5.post3; the deployment GLM-5-NVFP4 on 8× RTX PRO 6000 serves GLM-5-NVFP4 at TP8 "
        "(8 GPUs) on SGLang (they differ in model, TP, GPU count)" in form
    )
    assert SweepRun.objects.count() == runs


def test_a_file_of_another_model_imported_all_the_same_is_badged_and_no_headline(
    client, deployment
):
    glm5 = _on_the_write_up(client)
    response = _upload(client, glm5, AGG, "sglang", accept_mismatch="on")
    run = SweepRun.objects.get(source="import")
    assert response["Location"] == f"/runs/{run.uuid}/"

    page = client.get(response["Location"]).content.decode()
    title = page.split("<h1>")[1].split("</h1>")[0]
    assert f'<span class="badge origin" title="imported from {AGG.name}; it measured ' in title
    assert ">imported</span>" in title and "write-up" not in title
    sweep = page.split("<h2>Sweep</h2>")[1].split("</section>")[0]
    assert "<dd>Qwen/Qwen2.5-3B-Instruct" in sweep and "not the deployment's GLM-5-NVFP4" in sweep
    assert "TP1 " in sweep and "TP8" not in sweep
    assert "SGLang 0.5.5.post3" in sweep
    hardware = page.split("<h2>Hardware</h2>")[1].split("</section>")[0]
    assert "1 GPU " in hardware and "8 GPUs" not in hardware

    listed = client.get(glm5.get_absolute_url()).content.decode().split("<h2>Runs</h2>")[1]
    row = listed.split(f">{AGG.name}</a>")[1].split("</td>")[0]
    assert ">imported</span>" in row and "write-up" not in row

    dashboard, recent = client.get("/").content.decode().split("Recent runs")
    row = dashboard.split("GLM-5-NVFP4 on 8× RTX PRO 6000")[1].split("</tr>")[0]
    assert ">912<" in row and "711" not in row  # the write-up's sweep, not the Qwen file
    assert ">write-up</span>" in row
    row = recent.split(f">{AGG.name}</a>")[1].split("</td>")[0]
    assert ">imported</span>" in row and "write-up" not in row

    listed = client.get("/runs/").content.decode().split(f">{AGG.name}</a>")[1].split("</tr>")[0]
    assert ">imported</span>" in listed
    # "org/name" as it is (a long local path is shortened), the whole on hover
    assert (
        '<td class="clip" title="Qwen/Qwen2.5-3B-Instruct">Qwen/Qwen2.5-3B-Instruct</td>' in listed
    )


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json*")), ids=lambda path: path.name)
def test_a_truncated_real_file_is_refused_or_imported_whole(client, deployment, path):
    text = path.read_text()
    upload = SimpleUploadedFile(path.name, text[: len(text) // 2].encode())
    fmt = "vllm" if path.name.startswith("vllm") else "sglang"
    response = client.post(
        f"/deployments/{deployment.pk}/results/",
        {"format": fmt, "file": upload, "accept_mismatch": "on"},
    )
    if response.status_code == 302:
        run = SweepRun.objects.get()
        assert run.levels.count() == len(run.levels.values("key").distinct()) > 0
    else:
        assert response.status_code == 400
        form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
        assert "line " in form
        assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


def test_the_compare_page_names_the_model_and_gpus_the_file_measured(client, deployment):
    glm5 = _on_the_write_up(client)
    _upload(client, glm5, AGG, "sglang", accept_mismatch="on")
    run = SweepRun.objects.get(source="import")
    html = client.get(f"/compare/?run={run.uuid}").content.decode()
    row = html.split('id="compare-table"')[1].split("<tbody>")[1].split("</tr>")[0]
    cells = [cell.split(">", 1)[1].split("</td>")[0] for cell in row.split("<td")[1:]]
    assert cells[3] == "Qwen/Qwen2.5-3B-Instruct"
    assert cells[10] == "1"  # GPUs: its server_info's TP1, not the deployment's 8
    assert cells[11] == cells[12] == "711"


def test_a_file_measured_elsewhere_shows_no_per_gpu_figure_or_cost_from_the_hosts_gpus(
    client, deployment
):
    deployment.host.price_per_gpu_hour = 2.5
    deployment.host.save()
    # vLLM's files never state their GPUs; the name's "gpus_16" is a person's note
    upload = SimpleUploadedFile("gpt-oss_gpus_16.json", VLLM.read_bytes())
    client.post(f"/deployments/{deployment.pk}/results/", {"format": "vllm", "file": upload})
    run = SweepRun.objects.get()
    assert run.measured_gpu_count() is None and run.snapshot["deployment"]["gpus"] == []
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    reason = "the result file does not say how many GPUs it ran on"
    assert f"No output per GPU (n/a): {reason}." in html
    assert f"No cost (n/a): {reason}." in html


def test_a_guidellm_file_is_offered_and_imports_with_its_requests(client, deployment):
    html = client.get(deployment.get_absolute_url()).content.decode()
    form = html.split('id="result-upload"')[1].split("</form>")[0]
    for fmt in ("aiperf", "guidellm", "inference-perf"):
        assert f'<option value="{fmt}">' in form
    guidellm = RESULTS / "guidellm" / "benchmarks.json"
    refused = _upload(client, deployment, guidellm, "guidellm")
    assert refused.status_code == 400 and not SweepRun.objects.exists()
    assert "Not imported: the file measured tiny-moe; the deployment" in refused.content.decode()
    response = _upload(client, deployment, guidellm, "guidellm", accept_mismatch="on")
    run = SweepRun.objects.get()
    assert response["Location"] == f"/runs/{run.uuid}/"
    assert run.other_model == "tiny-moe"
    benchmarks = json.loads(guidellm.read_text())["benchmarks"]
    assert sorted(run.levels.values_list("concurrency", flat=True)) == sorted(
        b["config"]["strategy"]["streams"] for b in benchmarks
    )
    assert [level.request_logs.get().count for level in run.levels.order_by("concurrency")] == [
        len(b["requests"]["successful"]) for b in benchmarks
    ]


def test_aiperf_records_uploaded_beside_the_summary_are_the_levels_requests(client, deployment):
    summary = RESULTS / "aiperf" / "concurrency_2" / "profile_export_aiperf.json"
    records = summary.parent / "profile_export.jsonl"
    html = client.get(deployment.get_absolute_url()).content.decode()
    assert 'name="requests_file"' in html.split('id="result-upload"')[1].split("</form>")[0]
    extra = {
        "requests_file": SimpleUploadedFile(records.name, records.read_bytes()),
        "accept_mismatch": "on",
    }
    response = _upload(client, deployment, summary, "aiperf", **extra)
    assert response.status_code == 302
    level = SweepRun.objects.get().levels.get()
    assert level.request_logs.get().count == len(records.read_text().splitlines())


def test_records_that_are_not_the_summarys_are_a_form_error(client, deployment):
    summary = RESULTS / "aiperf" / "concurrency_2" / "profile_export_aiperf.json"
    lines = (summary.parent / "profile_export.jsonl").read_bytes().splitlines()
    extra = {
        "requests_file": SimpleUploadedFile("profile_export.jsonl", b"\n".join(lines[:3])),
        "accept_mismatch": "on",
    }
    response = _upload(client, deployment, summary, "aiperf", **extra)
    assert response.status_code == 400
    form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
    assert f"requests: the records hold 3 requests, the summary counts {len(lines)}" in form
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


def test_an_inference_perf_stage_uploaded_with_its_config_is_of_the_model_it_names(
    client, deployment
):
    stage = RESULTS / "inference-perf" / "stage_0_lifecycle_metrics.json"
    config = RESULTS / "inference-perf" / "config.yml"
    html = client.get(deployment.get_absolute_url()).content.decode()
    form = html.split('id="result-upload"')[1].split("</form>")[0]
    assert "run configuration (config.yml)" in form
    extra = {"requests_file": SimpleUploadedFile(config.name, config.read_bytes())}
    refused = _upload(client, deployment, stage, "inference-perf", **extra)
    assert "Not imported: the file measured tiny-moe on vLLM" in refused.content.decode()
    assert not SweepRun.objects.exists()
    extra = {"requests_file": SimpleUploadedFile(config.name, config.read_bytes())}
    response = _upload(client, deployment, stage, "inference-perf", accept_mismatch="on", **extra)
    assert response.status_code == 302
    assert SweepRun.objects.get().other_model == "tiny-moe"


def test_an_inference_perf_config_cut_short_is_a_form_error_naming_its_line(client, deployment):
    stage = RESULTS / "inference-perf" / "stage_0_lifecycle_metrics.json"
    text = (RESULTS / "inference-perf" / "config.yml").read_bytes()
    # inside server's model_name: no longer YAML
    cut = text[: int(len(text) * 0.1)]
    extra = {
        "requests_file": SimpleUploadedFile("config.yml", cut),
        "accept_mismatch": "on",
    }
    response = _upload(client, deployment, stage, "inference-perf", **extra)
    assert response.status_code == 400
    form = response.content.decode().split('id="result-upload"')[1].split("</form>")[0]
    last = cut.count(b"\n") + 1
    assert f"config: line {last}: not YAML (" in form
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()
