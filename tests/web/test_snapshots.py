"""A run's snapshot: recorded once when the run is created and when its sweep starts, never
rewritten by later edits; the differences between two runs' snapshots, over the API and in the
regression finding; imported files keep what they say."""

import copy

import pytest

from moeops.insights import services as insights
from moeops.runs import services, snapshots
from moeops.runs.models import LevelResult, SweepRun
from tests.api_base import make_world
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
SGLANG_AGG = "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
# what workers.engine_info.identify_engine returned for the real vLLM of tests/engine
VLLM_ENGINE = {
    "engine": "vllm",
    "version": "0.32.0",
    "models": [{"id": "tiny-moe", "max_model_len": 1024, "owned_by": "vllm", "root": "tiny-moe"}],
    "max_model_len": 1024,
    "max_running_requests": 4,
    "max_running_requests_source": "/server_info scheduler_config.max_num_seqs",
    "args": {
        "scheduler_config.max_num_seqs": 4,
        "model_config.max_model_len": 1024,
        "compilation_config.pass_config.fuse_allreduce_rms": True,
    },
    "args_source": "/server_info",
    "env": {"VLLM_TUNED_CONFIG_FOLDER": "/srv/tuned"},
    "allreduce_fusion": True,
    "metric_names": ["vllm:num_requests_running"],
    "notes": [],
    "url": "http://127.0.0.1:8000",
    "reachable": True,
    "error": "",
}
KERNEL = {
    "state": "file",
    "file_name": "E=32,N=256,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json",
    "sha256": "ab" * 32,
    "folder": "VLLM_TUNED_CONFIG_FOLDER",
    "shipped": False,
}


@pytest.fixture
def world(db):
    return make_world()


def _run(world, **parameters):
    run, _ = services.run_create(
        deployment=world.deployment,
        parameters={"levels": [8, 32], "input_len": 1024, "output_len": 1024, **parameters},
    )
    return run


def test_a_new_run_records_the_deployment_topology_load_and_kernel_shape(world):
    world.deployment.engine, world.deployment.engine_version = "vllm", "0.31.0"
    world.deployment.gpus.set(world.host.gpus.all())
    world.deployment.save()

    snapshot = _run(world, prompts_per_level=64).snapshot

    assert snapshot["source"] == "worker"
    assert snapshot["moeops_version"].startswith("0.1.0")
    assert snapshot["deployment"]["engine_version"] == "0.31.0"
    assert snapshot["deployment"]["tp"] == 8
    assert [g["index"] for g in snapshot["deployment"]["gpus"]] == [0, 1]
    assert snapshot["load"] == {
        "levels": [8, 32],
        "input_len": 1024,
        "output_len": 1024,
        "prompts_per_level": 64,
    }
    # GLM-5 at TP8: 256 experts, N = 2048 / 8
    assert snapshot["kernel_shape"] == {
        "E": 256,
        "N": 256,
        "device_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "dtype": "bf16",
        "block_shape": None,
    }


def test_fp4_weights_need_no_triton_config_and_the_snapshot_says_why(world):
    world.deployment.quantization = "nvfp4"
    world.deployment.save()

    shape = _run(world).snapshot["kernel_shape"]

    assert shape["dtype"] is None
    assert shape["reason"].startswith("nvfp4 MoE weights")


def test_editing_the_deployment_changes_no_snapshot_and_is_listed(world):
    run = _run(world)
    before = copy.deepcopy(run.snapshot)
    world.deployment.max_running_requests = 256
    world.deployment.launch_args = {"--disable-radix-cache": True}
    world.deployment.save()

    run.refresh_from_db()
    assert run.snapshot == before
    assert snapshots.deployment_edits(run.snapshot, world.deployment) == [
        {"key": "max_running_requests", "a": None, "b": 256},
        {"key": "launch_args", "a": {}, "b": {"--disable-radix-cache": True}},
    ]


def test_what_the_worker_observed_is_added_once_and_only_its_parts(world):
    run = _run(world)
    path = f"/api/v1/runs/{run.uuid}/snapshot"

    first = world.host_worker.post(path, {"engine": VLLM_ENGINE, "kernel_config": KERNEL})
    again = world.host_worker.post(path, {"engine": {**VLLM_ENGINE, "version": "9.9"}})

    assert first.status_code == 201 and again.status_code == 200
    run.refresh_from_db()
    assert run.snapshot["engine"]["version"] == "0.32.0"
    assert run.snapshot["kernel_config"]["sha256"] == "ab" * 32
    assert run.engine_label() == "vLLM 0.32.0"
    assert run.reported_running_cap() == 4
    assert run.kernel_config_state() == "tuned"
    assert first.json()["snapshot"]["engine"]["args_source"] == "/server_info"


def test_only_the_runs_host_and_writers_may_add_to_its_snapshot(world):
    run = _run(world)
    path = f"/api/v1/runs/{run.uuid}/snapshot"

    assert world.outsider.post(path, {"engine": VLLM_ENGINE}).status_code == 403
    assert world.read_only.post(path, {"engine": VLLM_ENGINE}).status_code == 403
    assert world.anonymous.post(path, {"engine": VLLM_ENGINE}).status_code == 401
    bad = world.host_worker.post(path, {"engine": "vllm"})
    assert bad.status_code == 422 and "engine" in bad.content.decode()
    run.refresh_from_db()
    assert "engine" not in run.snapshot


def _observed(world, engine, kernel=KERNEL):
    run = _run(world)
    services.run_record_observed(
        run=run, observed={"engine": engine, "kernel_config": kernel, "client": {"host": "h1"}}
    )
    run.refresh_from_db()
    return run


def test_the_diff_names_each_change_by_section(world):
    a = _observed(world, VLLM_ENGINE)
    wider = copy.deepcopy(VLLM_ENGINE)
    wider.update(version="0.33.0", max_running_requests=16)
    wider["args"]["scheduler_config.max_num_seqs"] = 16
    b = _observed(world, wider, kernel={**KERNEL, "state": "engine_default", "sha256": None})

    answer = world.read_only.get(f"/api/v1/runs/diff?a={a.uuid}&b={b.uuid}")

    assert answer.status_code == 200
    changes = {(c["section"], c["key"]): (c["a"], c["b"]) for c in answer.json()["changes"]}
    assert changes == {
        ("engine", "version"): ("0.32.0", "0.33.0"),
        ("engine", "max_running_requests"): (4, 16),
        ("args", "scheduler_config.max_num_seqs"): (4, 16),
        ("kernel_config", "state"): ("file", "engine_default"),
        ("kernel_config", "sha256"): ("ab" * 32, None),
    }
    assert answer.json()["unknown"] == []


def test_the_diff_says_what_a_run_did_not_record(world):
    a = _observed(world, VLLM_ENGINE)
    b = _run(world, input_len=64)
    empty = SweepRun.objects.create(deployment=world.deployment)

    diff = snapshots.snapshot_diff(a.snapshot, b.snapshot)
    assert "a run did not record what its engine answered" in diff["unknown"]
    assert ("load", "input_len", 1024, 64) in [
        (c["section"], c["key"], c["a"], c["b"]) for c in diff["changes"]
    ]
    assert snapshots.snapshot_diff(a.snapshot, empty.snapshot)["unknown"] == [
        "a run has no snapshot (it was recorded before moeops kept them)"
    ]
    missing = world.read_only.get(
        f"/api/v1/runs/diff?a={a.uuid}&b=5e7c1f3a-0b8e-4d1e-9a55-2f4a7d9c1b20"
    )
    assert missing.status_code == 404
    assert world.read_only.get(f"/api/v1/runs/diff?a={a.uuid}&b=nope").status_code == 422


def test_the_regression_finding_names_what_changed_since_the_previous_run(world):
    before = _observed(world, {**VLLM_ENGINE, "version": "0.31.0"})
    after = _observed(world, VLLM_ENGINE)
    for run, throughput in ((before, 1000.0), (after, 700.0)):
        for concurrency in (8, 32):
            LevelResult.objects.create(
                run=run,
                key=f"c={concurrency},r=inf",
                concurrency=concurrency,
                output_throughput=throughput * concurrency / 8,
            )
        services.run_update(run=run, status="running")
        services.run_update(run=run, status="succeeded")

    [regression] = [f for f in insights.run_analyze(run=after) if f.kind == "regression"]

    assert "What changed since then: engine version 0.31.0 → 0.32.0." in regression.text
    assert regression.evidence["changes"] == ["engine version 0.31.0 → 0.32.0"]


def test_an_imported_sglang_file_records_the_engine_it_embeds(world):
    text = (RESULTS / SGLANG_AGG).read_text()
    run, _ = services.run_import(
        deployment=world.deployment, fmt="sglang", text=text, accept_mismatch=True
    )

    assert run.snapshot["source"] == "import"
    assert run.snapshot["file"]["backend"] == "sglang"
    assert run.snapshot["file"]["random_input_len"] == 128
    assert run.engine_label() == "SGLang 0.5.5.post3"
    assert run.snapshot["engine"]["args"]["attention_backend"] == "fa3"


def test_an_imported_vllm_file_records_its_facts_and_no_engine_it_does_not_name(world):
    text = (RESULTS / "vllm_bench_serve_0.11.json").read_text()
    run, _ = services.run_import(
        deployment=world.deployment, fmt="vllm", text=text, accept_mismatch=True
    )

    assert "engine" not in run.snapshot
    assert run.snapshot["file"]["format"] == "vllm"
    assert run.snapshot["file"]["backend"] == "openai-chat"
    assert run.snapshot["file"]["model_id"] == "zai-org/GLM-5-FP8"
    assert run.snapshot["file"]["num_prompts"] == 1280


def test_a_runs_typed_snapshot_follows_a_change_made_in_place_however_deep():
    # recorded() keeps what it read for a run list's many questions; a service that changes
    # the snapshot in place before asking again must see its change
    run = SweepRun(snapshot={"engine": {"engine": "vllm", "version": "0.34.0"}})
    assert run.recorded().engine["engine"] == "vllm"

    run.snapshot["engine"]["engine"] = "sglang"
    assert run.recorded().engine["engine"] == "sglang"
    run.snapshot["client"] = {"host": "gpu-2"}
    assert run.recorded().client["host"] == "gpu-2"
    run.snapshot = {}
    assert not run.recorded().engine
