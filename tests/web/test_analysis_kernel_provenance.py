"""Kernel provenance: a tuned file in effect that was tuned in another version of the engine's
kernel (the rule on hand-built data, then on the database with moeops' own H200 tune, a GLM-5
fp8 file tuned in vLLM 0.33.0's kernel)."""

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from moeops.examples.h200_tune import load_h200_tune
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec
from moeops.insights import services
from moeops.insights.models import Finding
from moeops.insights.rules import kernels as kernel_rules
from moeops.insights.rules.run_data import PreviousRun, RunData, TunedFile
from moeops.kernels.models import TuningRun
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun

# the source hashes of vLLM's fused-MoE kernel as moeops' H200 tunes recorded them
# (moeops/examples/h200_vllm_glm5_fp8_block_tune.json; bench/results/engine_tune_h200/vllm034_*)
KERNEL_033 = "8f71154b516883f25f06dd5424d1f473a31fee9a12bf952611c88df4a181f01a"
KERNEL_034 = "3d9d1ca2ca003d34fb6d9a0e08db1027b036a072361ffc6f79a9c0242d18f09c"


def tuned_033(**fields):
    return TunedFile(
        config_id=7,
        name="E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json v1",
        kernel_engine="vllm",
        kernel_version="0.33.0",
        kernel_source_sha256=KERNEL_033,
        **fields,
    )


def serving(version, **fields):
    return RunData(observed={"engine": "vllm", "version": version}, **fields)


def test_a_file_tuned_on_the_version_that_serves_raises_nothing():
    assert kernel_rules.kernel_provenance(serving("0.33.0", tuned_file=tuned_033())) == []


def test_another_version_with_the_same_kernel_source_raises_nothing():
    data = serving("0.33.1", tuned_file=tuned_033(), serving_kernel_sha256=KERNEL_033)

    assert kernel_rules.kernel_provenance(data) == []


def test_another_version_raises_the_finding_and_the_re_tune():
    [p] = kernel_rules.kernel_provenance(serving("0.34.0", tuned_file=tuned_033()))

    assert p.kind == "kernel_provenance" and p.severity == "warning"
    assert p.text.startswith(
        "This file was tuned for vLLM 0.33.0's kernel; the engine runs 0.34.0, whose launch "
        "differs: re-tune."
    )
    assert p.plan == ["Tune for vLLM 0.34.0 and re-sweep"]
    assert p.evidence["tuned_on"]["version"] == "0.33.0"
    assert p.evidence["serving"] == {
        "engine": "vllm",
        "version": "0.34.0",
        "kernel_source_sha256": None,
    }


def test_another_version_whose_kernel_source_differs_raises_the_finding():
    data = serving("0.34.0", tuned_file=tuned_033(), serving_kernel_sha256=KERNEL_034)

    [p] = kernel_rules.kernel_provenance(data)
    assert p.evidence["serving"]["kernel_source_sha256"] == KERNEL_034


def test_no_tuned_file_in_effect_raises_nothing():
    assert kernel_rules.kernel_provenance(serving("0.34.0")) == []


def test_a_file_tuned_in_another_engine_s_kernel_gets_that_finding_not_this_one():
    untimed = (
        "Tuned in SGLang 0.5.9's own kernel, never timed in vLLM's: it may run slower there "
        "than vLLM's own configs; tune with vLLM's kernel for vLLM."
    )
    sglang_file = TunedFile(
        config_id=3, name="E=8,N=64.json v1", kernel_engine="sglang", untimed=untimed
    )

    [p] = kernel_rules.kernel_provenance(serving("0.34.0", tuned_file=sglang_file))
    assert p.key.startswith("other-engine") and untimed in p.text
    assert "tuned for" not in p.text


def test_an_engine_version_change_under_the_same_tuned_file_raises_the_re_tune():
    moved = {"engine": "vllm", "from": "0.33.0", "to": "0.34.0"}
    before = PreviousRun(
        id=1, uuid="0" * 32, label="before the upgrade", levels=(), engine_moved=moved
    )

    [p] = kernel_rules.kernel_provenance(serving("0.34.0", previous=before))
    assert p.key == "engine-moved:0.33.0:0.34.0"
    assert p.plan == ["Tune for vLLM 0.34.0 and re-sweep"]
    assert "before the upgrade ran vLLM 0.33.0 with the same tuned kernel file" in p.text


def test_an_engine_version_change_under_another_file_or_the_same_version_is_no_move():
    tuned = {"state": "file", "file_name": "E=8,N=64.json", "sha256": "a" * 64, "shipped": False}

    def snap(version, sha="a" * 64):
        return {
            "engine": {"engine": "vllm", "version": version},
            "kernel_config": {**tuned, "sha256": sha},
        }

    assert snapshots.engine_moved(snap("0.33.0"), snap("0.34.0")) == {
        "engine": "vllm",
        "from": "0.33.0",
        "to": "0.34.0",
    }
    assert snapshots.engine_moved(snap("0.33.0"), snap("0.34.0", sha="b" * 64)) is None
    assert snapshots.engine_moved(snap("0.34.0"), snap("0.34.0")) is None
    shipped = {**snap("0.33.0"), "kernel_config": {**tuned, "shipped": True}}
    assert snapshots.engine_moved(shipped, snap("0.34.0")) is None
    assert kernel_rules.kernel_provenance(serving("0.34.0", previous=None)) == []


# -- on the database -------------------------------------------------------------------------

GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "hidden_size": 6144,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


@pytest.fixture
def glm5_h200(db):
    host = Host.objects.create(name="h200-x8")
    gpus = [
        GPU.objects.create(host=host, index=i, name="NVIDIA H200", compute_capability="9.0")
        for i in range(8)
    ]
    model = ModelSpec(name="GLM-5-FP8", config_json=GLM5)
    model.fill_shape()
    model.save()
    deployment = Deployment.objects.create(
        name="glm5", model=model, host=host, tp=8, engine="vllm", engine_version="0.34.0"
    )
    deployment.gpus.set(gpus)
    return deployment


def swept(deployment, *, version, text, label="sweep"):
    """A finished run whose snapshot says vLLM `version` answered and loaded the file `text`
    from VLLM_TUNED_CONFIG_FOLDER, as a worker's sweep records it."""
    name = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    run = SweepRun.objects.create(
        deployment=deployment,
        label=label,
        status="succeeded",
        parameters={"levels": [8], "input_len": 1024, "output_len": 256},
        snapshot={
            "engine": {"engine": "vllm", "version": version},
            "kernel_config": {
                "state": "file",
                "file_name": name,
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "folder": "VLLM_TUNED_CONFIG_FOLDER",
                "shipped": False,
            },
        },
    )
    LevelResult.objects.create(run=run, key=level_key(8, None), concurrency=8)
    return run


def provenance(run):
    return list(Finding.objects.filter(run=run, kind="kernel_provenance"))


def test_the_0_33_file_on_a_0_34_engine_gets_the_finding_and_the_plan_item(glm5_h200):
    config = load_h200_tune().result
    run = swept(glm5_h200, version="0.34.0", text=config.engine_file_text("vllm"))

    services.run_analyze(run=run)

    [finding] = provenance(run)
    assert finding.evidence["kernel_config"] == config.pk
    assert finding.evidence["tuned_on"]["kernel_source_sha256"] == KERNEL_033
    assert "tuned for vLLM 0.33.0's kernel; the engine runs 0.34.0" in finding.text
    assert [i.title for i in finding.plan_items.all()] == ["Tune for vLLM 0.34.0 and re-sweep"]


def test_the_0_33_file_on_0_33_and_an_unknown_file_get_none(glm5_h200):
    config = load_h200_tune().result
    same = swept(glm5_h200, version="0.33.0", text=config.engine_file_text("vllm"))
    edited = swept(glm5_h200, version="0.34.0", text=config.engine_file_text("vllm") + " ")

    services.run_analyze(run=same)
    services.run_analyze(run=edited)

    assert provenance(same) == provenance(edited) == []


def test_a_patch_release_whose_kernel_moeops_timed_unchanged_gets_none(glm5_h200):
    config = load_h200_tune().result
    TuningRun.objects.create(
        E=256, N=256, hidden_size=6144, topk=8, kernel_engine="vllm", kernel_version="0.33.1",
        kernel_source_sha256=KERNEL_033,
    )  # fmt: skip
    run = swept(glm5_h200, version="0.33.1", text=config.engine_file_text("vllm"))

    services.run_analyze(run=run)

    assert provenance(run) == []


def test_an_upgrade_under_a_file_moeops_does_not_hold_raises_the_re_tune(glm5_h200):
    text = load_h200_tune().result.engine_file_text("vllm").replace("    ", "  ")
    before = swept(glm5_h200, version="0.33.0", text=text, label="on 0.33")
    SweepRun.objects.filter(pk=before.pk).update(created=timezone.now() - timedelta(days=1))
    after = swept(glm5_h200, version="0.34.0", text=text, label="on 0.34")

    services.run_analyze(run=after)

    [finding] = provenance(after)
    assert finding.key == "engine-moved:0.33.0:0.34.0"
    assert finding.evidence["previous_run"]["uuid"] == str(before.uuid)
    assert [i.title for i in finding.plan_items.all()] == ["Tune for vLLM 0.34.0 and re-sweep"]
