"""vLLM 0.34's kernel paths in the web tier: a config with its `_down` file as one record (stored,
imported, exported, applied together) and the sentence on the tune and kernel pages saying which
path a config is for and whether the deployment's engine runs it."""

import json

import pytest
from django.core.exceptions import ValidationError

from moeops import permissions
from moeops.engines.services import _kernel_files, recipe_create
from moeops.kernels import services
from moeops.kernels.models import TuningRun
from tests import page_base as pb

pytestmark = pytest.mark.django_db

UP = {
    "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
    "num_warps": 4, "num_stages": 3, "USE_TMA": True,
}  # fmt: skip
DOWN = {"1": {"USE_TMA": False}, "1024": {**UP, "BLOCK_SIZE_N": 64}}
UP_NAME = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
DOWN_NAME = UP_NAME.removesuffix(".json") + "_down.json"


FP8_CONFIG = {
    **pb.GLM5_CONFIG,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def _deployment(version="0.34.0", env=None, model_row=None, host_row=None):
    deployment = pb.deployment(
        name=f"GLM-5 fp8 on vLLM {version}",
        engine="vllm",
        engine_version=version,
        model_row=model_row or pb.model("GLM-5-FP8", FP8_CONFIG),
        host_row=host_row,
    )
    if env is not None:
        recipe_create(
            deployment=deployment,
            argv=["vllm", "serve", "glm-5"],
            author=permissions.MOEOPS,
            env=env,
        )
    return deployment


def _config(deployment, down=DOWN, path="sorted_a"):
    config, _ = pb.vllm_tuned_config(
        deployment.kernel_shape(),
        {"1": UP, "1024": UP},
        triton_version="3.6.0",
        down_entries=down,
        kernel_path=path,
    )
    return config


def test_the_up_file_and_its_down_file_are_one_record_written_together():
    deployment = _deployment()
    config = _config(deployment)

    files = dict(config.files("vllm"))
    assert config.file_name("vllm") == UP_NAME
    assert list(files) == [UP_NAME, DOWN_NAME]
    assert json.loads(files[DOWN_NAME])["1"] == {"USE_TMA": False}
    # the same entries again are the same record; another _down file is a new version
    assert _config(deployment).pk == config.pk
    other = _config(deployment, down={"1": {"USE_TMA": False}})
    assert other.version == config.version + 1
    # an engine action writes both into the engine's config folder
    recipe = recipe_create(
        deployment=deployment, argv=["vllm"], author=permissions.MOEOPS, kernel_configs=[config]
    )
    assert [f["file_name"] for f in _kernel_files(recipe, "vllm")] == [UP_NAME, DOWN_NAME]


def test_the_pair_imports_as_one_record_and_a_down_file_alone_is_refused():
    up_text = json.dumps({"triton_version": "3.6.0", "1": UP})
    down_text = json.dumps(DOWN)

    config, created = services.kernel_config_import(
        file_name=UP_NAME, text=up_text, down_text=down_text
    )

    assert created and config.down_entries == DOWN
    with pytest.raises(ValidationError) as refused:
        services.kernel_config_import(file_name=DOWN_NAME, text=down_text)
    assert "goes with its up file" in str(refused.value.message_dict["file_name"])
    with pytest.raises(ValidationError) as bad:
        services.kernel_config_import(
            file_name=UP_NAME, text=up_text, down_text=json.dumps({"1": {"USE_TMA": True}})
        )
    assert "batch size 1: BLOCK_SIZE_M is missing" in bad.value.message_dict["down_content"]


def test_down_entries_beside_an_unblocked_file_are_refused_naming_the_field():
    with pytest.raises(ValidationError) as refused:
        services.kernel_config_store(
            device_name="NVIDIA H200", E=8, N=64, dtype="bf16", block_shape=None,
            triton_version="3.6.0", entries={"1": UP}, down_entries=DOWN,
        )  # fmt: skip
    assert "down_entries" in refused.value.message_dict


def test_the_kernel_page_says_the_path_and_whether_each_engine_runs_it(client):
    pb.sign_in(client)
    on = _deployment()
    config = _config(on)
    _deployment("0.33.0", model_row=on.model, host_row=on.host)

    html = client.get(f"/kernels/{config.pk}/").content.decode()

    assert "the sorted-A path: GEMM 2 from a _down file of its own" in html
    assert f"{on.name}</a>: vLLM 0.34.0 reads the up file and, where its launch" in html
    assert "vLLM 0.33.0 has neither the TMA read of B nor the sorted-A path" in html
    assert DOWN_NAME in html and 'class="data compact entries down-entries"' in html
    down = client.get(f"/kernels/{config.pk}/vllm-down.json")
    assert down["Content-Disposition"] == f'attachment; filename="{DOWN_NAME}"'
    assert json.loads(down.content) == {"triton_version": "3.6.0", **DOWN}


def test_the_deployments_that_load_a_config_cost_the_kernel_page_no_query_each(
    client, django_assert_max_num_queries
):
    pb.sign_in(client)
    first = _deployment(env={"VLLM_USE_DEEP_GEMM_E8M0": "0"})
    config = _config(first)
    client.get(f"/kernels/{config.pk}/")
    for version in ("0.33.0", "0.32.0", "0.31.0"):
        _deployment(version, env={}, model_row=first.model, host_row=first.host)

    with django_assert_max_num_queries(13):
        html = client.get(f"/kernels/{config.pk}/").content.decode()

    assert html.count("has neither the TMA read of B nor the sorted-A path") == 3
    assert "with this launch does not take its sorted-A path" in html


def test_the_tune_page_says_the_recipe_keeps_vllm_off_the_path_tuned(client):
    pb.sign_in(client)
    deployment = _deployment(env={"VLLM_USE_DEEP_GEMM_E8M0": "0"})
    shape = deployment.kernel_shape()
    tuning = TuningRun.objects.create(
        deployment=deployment, host=deployment.host, E=shape["E"], N=shape["N"],
        hidden_size=6144, topk=8, dtype="fp8_w8a8", block_shape=[128, 128], engine="vllm",
        kernel_engine="vllm", kernel_version="0.34.0", kernel_path="sorted_a",
        kernel_note="vLLM 0.34.0's own kernel; DeepGEMM with E8M0 scales is on",
    )  # fmt: skip

    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()

    assert "the sorted-A path: GEMM 2 from a _down file of its own" in html
    assert "with this launch does not take its sorted-A path" in html


def test_a_tune_sends_the_launch_recipe_to_the_worker(
    monkeypatch, django_capture_on_commit_callbacks
):
    from moeops.kernels import services as kernel_services

    sent = {}
    monkeypatch.setattr(
        kernel_services, "send_host_task", lambda name, host, kwargs: sent.update(kwargs)
    )
    from moeops.fleet.models import Deployment

    monkeypatch.setattr(Deployment, "tune_refusal", lambda self, **kw: "")
    deployment = _deployment(env={"VLLM_USE_DEEP_GEMM_E8M0": "1"})

    # sent once the tune is committed (moeops.jobs.enqueue)
    with django_capture_on_commit_callbacks(execute=True):
        kernel_services.tuning_start(
            deployment=deployment, dtype="fp8_w8a8", batch_sizes=[1], engine="vllm"
        )

    assert sent["launch_env"] == {"VLLM_USE_DEEP_GEMM_E8M0": "1"}
    assert sent["launch_argv"] == ["vllm", "serve", "glm-5"]
