import json

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.kernels.models import KernelConfig, TuningRun, TuningTiming
from tests.api_base import make_world
from tests.fakes import FIXTURES, KERNEL_ENTRY, MI300X_FILE, RTX_PRO_6000_FP8_FILE

CONFIGS = FIXTURES / "kernel_configs"


@pytest.fixture
def world(db):
    return make_world()


def _import(client, name, content=None):
    text = content if content is not None else (CONFIGS / name).read_text()
    return client.post("/api/v1/kernel-configs/import", {"file_name": name, "content": text})


def test_it_imports_a_vllm_file_by_its_name(world):
    response = _import(world.owner, RTX_PRO_6000_FP8_FILE)
    assert response.status_code == 201
    body = response.json()
    assert body["device_name"] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert (body["E"], body["N"], body["dtype"]) == (128, 2048, "fp8_w8a8")
    assert body["block_shape"] == [128, 128]
    assert body["triton_version"] == "3.6.0"
    assert body["version"] == 1 and body["source"] == "imported"
    assert body["file_names"]["vllm"] == RTX_PRO_6000_FP8_FILE


def test_a_file_nested_past_what_json_reads_is_refused_on_its_content(world, client):
    deep = "[" * 5000 + "]" * 5000
    stored = KernelConfig.objects.count()
    response = _import(world.owner, RTX_PRO_6000_FP8_FILE, deep)
    assert response.status_code == 400
    assert response.json()["detail"] == "content: not a config: nested too deep to read"
    # the kernels page's upload goes through the same service
    User.objects.create_user("ops", password="pw")
    client.login(username="ops", password="pw")
    upload = SimpleUploadedFile(RTX_PRO_6000_FP8_FILE, deep.encode(), "application/json")
    page = client.post("/kernels/upload/", {"file": upload, "file_name": ""})
    assert page.status_code == 400
    assert "nested too deep to read" in page.content.decode()
    assert KernelConfig.objects.count() == stored


def test_import_then_export_gives_the_same_file(world):
    config_id = _import(world.owner, RTX_PRO_6000_FP8_FILE).json()["id"]
    response = world.read_only.get(f"/api/v1/kernel-configs/{config_id}/file?style=vllm")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{RTX_PRO_6000_FP8_FILE}"'
    original = (CONFIGS / RTX_PRO_6000_FP8_FILE).read_text()
    assert json.loads(response.content) == json.loads(original)
    assert response.content.decode() == original


def test_it_exports_the_sglang_name_and_folder(world):
    config_id = _import(world.owner, RTX_PRO_6000_FP8_FILE).json()["id"]
    response = world.read_only.get(f"/api/v1/kernel-configs/{config_id}/file?style=sglang")
    sglang_name = RTX_PRO_6000_FP8_FILE.replace("[128,128]", "[128, 128]")
    assert response["Content-Disposition"] == f'attachment; filename="{sglang_name}"'
    assert response["X-Config-Path"] == f"triton_3_6_0/{sglang_name}"
    exported = json.loads(response.content)
    assert "triton_version" not in exported
    original = json.loads((CONFIGS / RTX_PRO_6000_FP8_FILE).read_text())
    del original["triton_version"]
    assert exported == original


H200_DOWN = "triton_3_7_1/E=256,N=256,device_name=NVIDIA_H200,block_shape=[128, 128]_down.json"


def test_it_stores_an_sglang_down_file_as_a_series_of_its_own(world):
    text = (
        json.dumps({"1": KERNEL_ENTRY, "64": {**KERNEL_ENTRY, "BLOCK_SIZE_N": 128}}, indent=4)
        + "\n"
    )
    down = _import(world.host_worker, H200_DOWN, text)
    assert down.status_code == 201
    body = down.json()
    assert body["down_moe"] is True and body["version"] == 1
    assert body["file_names"] == {"sglang": H200_DOWN.removeprefix("triton_3_7_1/")}
    assert _import(world.host_worker, H200_DOWN, text).status_code == 200
    main = _import(world.host_worker, H200_DOWN.replace("_down.json", ".json"), text).json()
    assert (main["down_moe"], main["version"]) == (False, 1)
    listed = world.read_only.get("/api/v1/kernel-configs?down_moe=true").json()
    assert [c["id"] for c in listed["items"]] == [body["id"]]

    exported = world.read_only.get(f"/api/v1/kernel-configs/{body['id']}/file?style=sglang")
    assert exported["X-Config-Path"] == H200_DOWN
    assert json.loads(exported.content) == json.loads(text)


def test_a_down_config_has_no_vllm_file(world):
    config_id = _import(world.owner, H200_DOWN, json.dumps({"1": KERNEL_ENTRY})).json()["id"]
    response = world.read_only.get(f"/api/v1/kernel-configs/{config_id}/file?style=vllm")
    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"config {config_id} is an SGLang _down file (GEMM 2's configs); vLLM has none"
    )


def test_it_creates_a_down_config_from_its_fields(world):
    body = {
        "device_name": "NVIDIA H200",
        "E": 256,
        "N": 256,
        "down_moe": True,
        "triton_version": "3.7.1",
        "entries": {"1": KERNEL_ENTRY},
        "source": "tuned",
    }
    first = world.host_worker.post("/api/v1/kernel-configs", body)
    assert first.status_code == 201
    assert first.json()["file_names"]["sglang"] == "E=256,N=256,device_name=NVIDIA_H200_down.json"
    assert world.host_worker.post("/api/v1/kernel-configs", body).status_code == 200
    config = KernelConfig.objects.get()
    assert config.down_moe and str(config) == "E=256,N=256,device_name=NVIDIA_H200_down.json v1"


def test_an_sglang_file_round_trips_through_its_folder(world):
    text = (
        json.dumps({"1": KERNEL_ENTRY, "64": {**KERNEL_ENTRY, "BLOCK_SIZE_M": 64}}, indent=4) + "\n"
    )
    name = "triton_3_4_0/E=256,N=256,device_name=NVIDIA_H200,block_shape=[128, 128].json"
    response = _import(world.host_worker, name, text)
    assert response.status_code == 201
    assert response.json()["triton_version"] == "3.4.0"
    exported = world.read_only.get(
        f"/api/v1/kernel-configs/{response.json()['id']}/file?style=sglang"
    )
    assert exported["X-Config-Path"] == name
    assert json.loads(exported.content) == json.loads(text)


def test_it_accepts_the_content_as_a_json_object_and_stores_it_once(world):
    content = json.loads((CONFIGS / MI300X_FILE).read_text())
    first = _import(world.owner, MI300X_FILE, content)
    again = _import(world.owner, MI300X_FILE, content)
    assert (first.status_code, again.status_code) == (201, 200)
    assert KernelConfig.objects.count() == 1
    changed = {**content, "1": {**content["1"], "num_stages": 3}}
    newer = _import(world.owner, MI300X_FILE, changed)
    assert newer.status_code == 201
    assert newer.json()["version"] == 2


def test_it_names_what_is_wrong_with_a_config_file(world):
    bad_name = _import(world.owner, "E=128,N=1024.json", "{}")
    assert bad_name.status_code == 400
    assert bad_name.json()["detail"].startswith("file_name: ")
    bad_entry = {"1": {**KERNEL_ENTRY, "num_warps": 3}}
    bad_content = _import(world.owner, MI300X_FILE, bad_entry)
    assert bad_content.status_code == 400
    assert bad_content.json()["detail"].startswith("content: batch size 1: num_warps must be")
    not_json = _import(world.owner, MI300X_FILE, "{not json")
    assert not_json.status_code == 400
    assert "not valid JSON" in not_json.json()["detail"]
    assert not KernelConfig.objects.exists()


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("E=99999999999999999999,N=64,device_name=NVIDIA_H200.json", "E must be an integer"),
        (f"E={2**40},N=64,device_name=NVIDIA_H200.json", "E must be an integer from 1 to 16,384"),
        ("E=8,N=64,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[0,0].json", "block_shape"),
    ],
)
def test_it_bounds_the_shape_of_a_file_name_as_it_bounds_the_fields(world, name, named):
    response = _import(world.owner, name, json.dumps({"1": KERNEL_ENTRY}))
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith(f"file_name: {name!r}: ") and named in detail
    fields = {"device_name": "NVIDIA H200", "E": 2**20, "N": 64, "entries": {"1": KERNEL_ENTRY}}
    by_fields = world.owner.post("/api/v1/kernel-configs", fields)
    assert by_fields.status_code == 400
    assert by_fields.json()["detail"] == ("E: must be an integer from 1 to 16,384, got 1048576")
    assert not KernelConfig.objects.exists()


def test_it_stores_a_config_from_its_fields(world):
    body = {
        "device_name": "NVIDIA H200",
        "E": 256,
        "N": 256,
        "dtype": "bf16",
        "triton_version": "3.7.1",
        "entries": {"1": KERNEL_ENTRY, "16": KERNEL_ENTRY},
        "source": "tuned",
    }
    response = world.host_worker.post("/api/v1/kernel-configs", body)
    assert response.status_code == 201
    assert response.json()["file_names"]["vllm"] == "E=256,N=256,device_name=NVIDIA_H200.json"
    assert world.host_worker.post("/api/v1/kernel-configs", body).status_code == 200
    bad = world.owner.post("/api/v1/kernel-configs", {**body, "device_name": "a,b"})
    assert bad.status_code == 422
    assert bad.json()["message"].startswith("device_name:")


def test_it_lists_configs_by_shape(world):
    _import(world.owner, RTX_PRO_6000_FP8_FILE)
    _import(world.owner, MI300X_FILE)
    assert world.read_only.get("/api/v1/kernel-configs").json()["count"] == 2
    assert world.read_only.get("/api/v1/kernel-configs?N=1024").json()["count"] == 1
    assert world.read_only.get("/api/v1/kernel-configs?dtype=fp8_w8a8").json()["count"] == 1
    assert world.read_only.get("/api/v1/kernel-configs/999/file").status_code == 404


def test_read_only_token_cannot_import_configs(world):
    assert _import(world.read_only, MI300X_FILE).status_code == 403


# --------------------------------------------------------------------------- tuning runs

TUNING = {
    "uuid": "0f7dc1e4-2f44-4b0e-8f5f-0a4c1f9e7a11",
    "host": "rtx-pro-6000",
    "deployment": "glm-5-sglang",
    "device_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "E": 256,
    "N": 256,
    "hidden_size": 6144,
    "topk": 8,
    "dtype": "bf16",
    "batch_sizes": [1, 16, 64, 256],
}


def test_it_creates_a_tuning_run_once(world):
    first = world.host_worker.post("/api/v1/tuning-runs", TUNING)
    again = world.host_worker.post("/api/v1/tuning-runs", TUNING)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["host"] == "rtx-pro-6000"
    assert first.json()["timings"] == []
    assert TuningRun.objects.count() == 1


def test_it_records_timings_and_the_result(world):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    ref = TUNING["uuid"]
    assert world.read_only.get(f"/api/v1/tuning-runs/{ref}").json()["started_at"] is None
    running = world.host_worker.patch(f"/api/v1/tuning-runs/{ref}", {"status": "running"})
    assert running.status_code == 200 and running.json()["started_at"] is not None
    timings = [
        {
            "batch_size": 1,
            "tuned_us": 24.5,
            "default_us": 61.0,
            "floor_us": 18.0,
            "config": KERNEL_ENTRY,
        },
        {"batch_size": 64, "tuned_us": 610.0, "default_us": 1050.0, "floor_us": 490.0},
    ]
    path = f"/api/v1/tuning-runs/{ref}/timings"
    first = world.host_worker.post(path, {"timings": timings})
    assert first.status_code == 201 and first.json() == {"created": 2, "existing": 0}
    again = world.host_worker.post(path, {"timings": timings})
    assert again.status_code == 200 and again.json() == {"created": 0, "existing": 2}
    assert TuningTiming.objects.count() == 2
    config = world.host_worker.post(
        "/api/v1/kernel-configs",
        {"device_name": TUNING["device_name"], "E": 256, "N": 256, "entries": {"1": KERNEL_ENTRY}},
    ).json()
    done = world.host_worker.patch(
        f"/api/v1/tuning-runs/{ref}",
        {"status": "succeeded", "result": config["id"], "wall_s": 812.5},
    )
    assert done.status_code == 200
    body = done.json()
    assert (body["status"], body["result"], body["wall_s"]) == ("succeeded", config["id"], 812.5)
    assert body["finished_at"] >= body["started_at"]
    assert body["timings"][0]["speedup"] == pytest.approx(61.0 / 24.5)
    assert body["timings"][1]["floor_fraction"] == pytest.approx(490.0 / 610.0)


def test_a_finished_tuning_run_does_not_run_again(world):
    created = world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "status": "running"})
    # a tune created running (the tuning CLI's) starts then
    assert created.json()["started_at"] is not None
    ref = TUNING["uuid"]
    world.host_worker.patch(f"/api/v1/tuning-runs/{ref}", {"status": "failed", "error": "OOM"})
    response = world.host_worker.patch(f"/api/v1/tuning-runs/{ref}", {"status": "running"})
    assert response.status_code == 409
    assert TuningRun.objects.get().status == "failed"


def test_outsider_cannot_touch_another_hosts_tuning_run(world):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    ref = TUNING["uuid"]
    assert (
        world.outsider.patch(f"/api/v1/tuning-runs/{ref}", {"status": "running"}).status_code == 403
    )
    timings = {"timings": [{"batch_size": 1, "tuned_us": 1.0}]}
    assert world.outsider.post(f"/api/v1/tuning-runs/{ref}/timings", timings).status_code == 403
    assert world.outsider.post("/api/v1/tuning-runs", {**TUNING, "uuid": None}).status_code == 403


def test_it_rejects_a_tuning_run_for_a_deployment_of_another_host(world):
    # the outsider's token is bound to h200-lab; glm-5-sglang runs on rtx-pro-6000
    body = {**TUNING, "uuid": None, "host": "h200-lab"}
    response = world.outsider.post("/api/v1/tuning-runs", body)
    assert response.status_code == 403
    assert response.json()["detail"].endswith("may not write host 'rtx-pro-6000'")
    response = world.owner.post("/api/v1/tuning-runs", body)
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "host: deployment 'glm-5-sglang' runs on host 'rtx-pro-6000', not 'h200-lab'"
    )
    assert not TuningRun.objects.exists()


def test_it_rejects_a_retried_tuning_run_of_another_host(world):
    assert world.host_worker.post("/api/v1/tuning-runs", TUNING).status_code == 201
    body = {**TUNING, "host": "h200-lab", "deployment": "glm-5-h200"}
    response = world.outsider.post("/api/v1/tuning-runs", body)
    assert response.status_code == 409
    assert TuningRun.objects.get().host.name == "rtx-pro-6000"


def test_it_records_why_a_tuning_run_has_no_telemetry(world):
    world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "status": "running"})
    ref = TUNING["uuid"]
    before = world.read_only.get(f"/api/v1/tuning-runs/{ref}").json()
    assert (before["telemetry_status"], before["telemetry_detail"]) == ("pending", "")
    reason = "pynvml is not installed (No module named 'pynvml')"
    response = world.host_worker.patch(
        f"/api/v1/tuning-runs/{ref}",
        {"status": "succeeded", "telemetry_status": "unavailable", "telemetry_detail": reason},
    )
    assert response.status_code == 200
    assert (response.json()["telemetry_status"], response.json()["telemetry_detail"]) == (
        "unavailable",
        reason,
    )
    tuning_run = TuningRun.objects.get()
    assert (tuning_run.telemetry_status, tuning_run.telemetry_detail) == ("unavailable", reason)
    (listed,) = world.read_only.get("/api/v1/tuning-runs").json()["items"]
    assert (listed["telemetry_status"], listed["telemetry_detail"]) == ("unavailable", reason)


@pytest.mark.parametrize(
    "field, value",
    [
        ("telemetry_detail", 503),
        ("telemetry_detail", ["NVML sees no GPU"]),
        ("telemetry_detail", "x" * 301),
        ("telemetry_detail", None),
        ("telemetry_status", "broken"),
        ("telemetry_status", 1),
    ],
)
def test_it_rejects_a_wrong_telemetry_field_and_names_it(world, field, value):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    response = world.host_worker.patch(f"/api/v1/tuning-runs/{TUNING['uuid']}", {field: value})
    assert response.status_code == 422
    assert field in response.json()["message"]
    tuning_run = TuningRun.objects.get()
    assert (tuning_run.telemetry_status, tuning_run.telemetry_detail) == ("pending", "")


def test_it_lists_tuning_runs(world):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    assert world.read_only.get("/api/v1/tuning-runs?host=rtx-pro-6000").json()["count"] == 1
    assert world.read_only.get("/api/v1/tuning-runs?status=running").json()["count"] == 0
    assert world.read_only.get(f"/api/v1/tuning-runs/{TUNING['uuid']}").json()["E"] == 256


# --------------------------------------------------------------------------- the kernel timed

VLLM_SOURCE = "8f71154b" + "0" * 56
VLLM_KERNEL = {
    "kernel_engine": "vllm",
    "kernel_version": "0.32.0",
    "kernel_source_sha256": VLLM_SOURCE,
}


def test_it_records_the_kernel_a_tune_timed_and_where_each_config_comes_from(world):
    created = world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "engine": "vllm"}).json()
    assert (created["engine"], created["kernel_engine"], created["kernel_note"]) == ("vllm", "", "")
    ref = TUNING["uuid"]
    note = "vLLM 0.32.0's own kernel"
    world.host_worker.patch(
        f"/api/v1/tuning-runs/{ref}", {"status": "running", **VLLM_KERNEL, "kernel_note": note}
    )
    timings = [
        {"batch_size": 1, "tuned_us": 30.0, "default_us": 30.0, "picked": "default"},
        {
            "batch_size": 64,
            "tuned_us": 600.0,
            "default_us": 900.0,
            "shipped_us": 750.0,
            "picked": "tuned",
        },
    ]
    assert (
        world.host_worker.post(f"/api/v1/tuning-runs/{ref}/timings", {"timings": timings})
    ).status_code == 201

    body = world.read_only.get(f"/api/v1/tuning-runs/{ref}").json()
    assert {key: body[key] for key in VLLM_KERNEL} == VLLM_KERNEL
    assert (body["engine"], body["kernel_note"]) == ("vllm", note)
    one, sixty_four = body["timings"]
    assert (one["picked"], one["shipped_us"], one["shipped_speedup"]) == ("default", None, None)
    assert (sixty_four["picked"], sixty_four["shipped_us"]) == ("tuned", 750.0)
    assert sixty_four["shipped_speedup"] == pytest.approx(750.0 / 600.0)
    assert TuningTiming.objects.get(batch_size=64).picked == "tuned"


def test_a_config_records_its_kernel_beside_the_engines_file_not_in_it(world):
    body = {
        "device_name": "NVIDIA H200",
        "E": 256,
        "N": 256,
        "triton_version": "3.7.1",
        "entries": {"1": KERNEL_ENTRY, "16": KERNEL_ENTRY},
        "source": "tuned",
        **VLLM_KERNEL,
    }
    first = world.host_worker.post("/api/v1/kernel-configs", body)
    assert first.status_code == 201
    assert {key: first.json()[key] for key in VLLM_KERNEL} == VLLM_KERNEL
    file = world.read_only.get(f"/api/v1/kernel-configs/{first.json()['id']}/file")
    assert json.loads(file.content) == {
        "triton_version": "3.7.1",
        "1": KERNEL_ENTRY,
        "16": KERNEL_ENTRY,
    }
    # the same entries again: the same version; tuned on another kernel: a version of its own
    assert world.host_worker.post("/api/v1/kernel-configs", body).status_code == 200
    builtin = {**body, "kernel_engine": "builtin", "kernel_version": "moeops"}
    other = world.host_worker.post("/api/v1/kernel-configs", builtin)
    assert (other.status_code, other.json()["version"]) == (201, 2)
    imported = _import(world.owner, MI300X_FILE).json()
    assert (imported["kernel_engine"], imported["kernel_source_sha256"]) == ("", "")


BAD_KERNEL_FIELDS = [
    ("kernel_engine", "tensorrt"),
    ("kernel_version", "0.32 beta"),
    ("kernel_version", "v" * 101),
    ("kernel_source_sha256", "8f71154b"),
    ("kernel_source_sha256", VLLM_SOURCE.upper()),
]


@pytest.mark.parametrize(("field", "value"), BAD_KERNEL_FIELDS)
def test_it_rejects_a_wrong_kernel_of_a_config_and_names_the_field(world, field, value):
    body = {"device_name": "NVIDIA H200", "E": 256, "N": 256, "entries": {"1": KERNEL_ENTRY}}
    response = world.host_worker.post("/api/v1/kernel-configs", {**body, field: value})
    assert response.status_code == 422
    assert response.json()["message"].startswith(f"{field}:")
    assert not KernelConfig.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [*BAD_KERNEL_FIELDS, ("kernel_note", "x" * 301), ("kernel_engine", None)],
)
def test_it_rejects_a_wrong_kernel_of_a_tuning_run_and_names_the_field(world, field, value):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    response = world.host_worker.patch(f"/api/v1/tuning-runs/{TUNING['uuid']}", {field: value})
    assert response.status_code == 422
    assert field in response.json()["message"]
    assert TuningRun.objects.get().kernel_engine == ""


@pytest.mark.parametrize(
    ("field", "value"), [("picked", "best"), ("picked", None), ("shipped_us", -1.0)]
)
def test_it_rejects_a_wrong_timing_and_names_the_field(world, field, value):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    timing = {"batch_size": 1, "tuned_us": 30.0, field: value}
    response = world.host_worker.post(
        f"/api/v1/tuning-runs/{TUNING['uuid']}/timings", {"timings": [timing]}
    )
    assert response.status_code == 422
    assert field in response.json()["message"]
    assert not TuningTiming.objects.exists()


def test_it_rejects_a_tuning_run_asking_for_an_unknown_engine(world):
    response = world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "engine": "trtllm"})
    assert response.status_code == 422
    assert response.json()["message"].startswith("engine:")
    assert not TuningRun.objects.exists()


def _tune_with_timings(world, status):
    world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "status": "running"})
    ref = TUNING["uuid"]
    timings = [{"batch_size": 1, "tuned_us": 24.5, "default_us": 61.0, "config": KERNEL_ENTRY}]
    world.host_worker.post(f"/api/v1/tuning-runs/{ref}/timings", {"timings": timings})
    world.host_worker.patch(f"/api/v1/tuning-runs/{ref}", {"status": status})
    return ref, timings


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_a_finished_tune_takes_no_new_timings_nor_samples_but_a_resent_push_is_a_repeat(
    world, status
):
    ref, timings = _tune_with_timings(world, status)
    path = f"/api/v1/tuning-runs/{ref}/timings"

    resent = world.host_worker.post(path, {"timings": timings})
    new = world.host_worker.post(path, {"timings": [{"batch_size": 64, "tuned_us": 610.0}]})
    samples = [{"gpu_index": 0, "ts": 1.7e9, "power_w": 85.0}]
    telemetry = world.host_worker.post(
        f"/api/v1/tuning-runs/{ref}/telemetry", {"batch_id": "t1", "samples": samples}
    )

    assert resent.status_code == 200 and resent.json() == {"created": 0, "existing": 1}
    assert new.status_code == 409
    assert new.json()["detail"] == (
        f"tuning run {ref} is {status}: a finished tune takes no more timings"
    )
    assert telemetry.status_code == 409
    assert telemetry.json()["detail"].endswith("a finished run takes no more samples")
    assert list(TuningTiming.objects.values_list("batch_size", flat=True)) == [1]
    assert not TuningRun.objects.get().telemetry.exists()


def test_a_timing_resent_with_other_figures_is_a_conflict_naming_its_batch_size(world):
    world.host_worker.post("/api/v1/tuning-runs", {**TUNING, "status": "running"})
    ref = TUNING["uuid"]
    path = f"/api/v1/tuning-runs/{ref}/timings"
    first = [{"batch_size": 1, "tuned_us": 24.5, "default_us": 61.0}]
    world.host_worker.post(path, {"timings": first})

    other = world.host_worker.post(path, {"timings": [{**first[0], "tuned_us": 30.0}]})
    mixed = world.host_worker.post(
        path, {"timings": [{"batch_size": 2, "tuned_us": 40.0}, {**first[0], "default_us": 1.0}]}
    )

    assert other.status_code == 409 and mixed.status_code == 409
    assert other.json()["detail"] == (
        "the timing of batch size 1 was stored with other figures; a stored timing is not replaced"
    )
    # nothing of a refused push is stored, the new batch size of the mixed one included
    assert list(TuningTiming.objects.values_list("batch_size", "tuned_us")) == [(1, 24.5)]


@pytest.mark.parametrize(
    "field, value",
    [("batch_size", "5"), ("batch_size", True), ("tuned_us", "24.5"), ("candidates_tried", True)],
)
def test_a_timing_takes_json_numbers_only(world, field, value):
    world.host_worker.post("/api/v1/tuning-runs", TUNING)
    timing = {"batch_size": 1, "tuned_us": 24.5, field: value}

    answer = world.host_worker.post(
        f"/api/v1/tuning-runs/{TUNING['uuid']}/timings", {"timings": [timing]}
    )

    assert answer.status_code in (400, 422), answer.content
    assert field in answer.content.decode()
    assert not TuningTiming.objects.exists()
