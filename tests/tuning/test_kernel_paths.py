"""Which kernel path vLLM 0.34 takes for a deployment's launch, the sentence the pages give, and
the up and `_down` files a sorted-A tune writes (tuning.engines, tuning.tune_results)."""

import json

import pytest

from tuning.engines import path_in_engine, vllm_launch
from tuning.search import KernelShape
from tuning.tune_results import BatchResult, TuneResult, write_config_files

GLM5_FP8 = KernelShape(E=32, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
UP = {
    "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
    "num_warps": 4, "num_stages": 3, "USE_TMA": True,
}  # fmt: skip
DOWN = {**UP, "BLOCK_SIZE_N": 64, "num_stages": 4, "USE_TMA": True}


def test_a_launch_that_sets_nothing_runs_deep_gemm_e8m0_as_vllm_defaults():
    launch = vllm_launch(None, None)

    assert launch.deep_gemm_e8m0 and not launch.expert_parallel
    assert "vLLM's default, on" in launch.why


@pytest.mark.parametrize(
    ("env", "argv", "on", "expert_parallel", "said"),
    [
        ({"VLLM_USE_DEEP_GEMM_E8M0": "0"}, [], False, False, "VLLM_USE_DEEP_GEMM_E8M0=0"),
        ({"VLLM_USE_DEEP_GEMM": "0"}, [], False, False, "VLLM_USE_DEEP_GEMM=0"),
        ({"VLLM_USE_DEEP_GEMM_E8M0": "yes"}, [], False, False, "is not an integer"),
        ({"VLLM_USE_DEEP_GEMM_E8M0": "1"}, [], True, False, "sets VLLM_USE_DEEP_GEMM_E8M0=1"),
        ({}, ["vllm", "serve", "m", "--enable-expert-parallel"], True, True, "expert parallel"),
        ({}, ["vllm", "serve", "m", "-ep"], True, True, "expert parallel"),
        ({}, ["vllm", "serve", "m", "--tensor-parallel-size", "8"], True, False, "on"),
    ],
)
def test_the_launch_recipes_env_and_argv_decide_deep_gemm_e8m0(
    env, argv, on, expert_parallel, said
):
    launch = vllm_launch(env, argv)

    assert launch.deep_gemm_e8m0 is on
    assert launch.expert_parallel is expert_parallel
    assert said in launch.why


@pytest.mark.parametrize(
    ("path", "version", "sorted_a", "says"),
    [
        ("default", "0.33.0", None, "runs this file as it was tuned"),
        ("default", "0.34.0", None, "reads B through TMA, which these entries were not timed"),
        ("tma", "0.34.0", None, "runs this file as it was tuned, USE_TMA"),
        ("tma", "0.33.0", None, "it fails on their USE_TMA; re-tune on 0.33.0"),
        ("sorted_a", "0.34.0", True, "reads both files as tuned"),
        ("sorted_a", "0.34.0", False, "never reads the _down file; re-tune for this launch"),
        ("sorted_a", "0.33.0", True, "neither the TMA read of B nor the sorted-A path"),
        ("sorted_a", "", True, "version is not recorded"),
        ("", "0.34.0", True, "not recorded"),
    ],
)
def test_the_sentence_says_whether_the_engine_runs_the_path_tuned(path, version, sorted_a, says):
    sentence = path_in_engine(
        path, engine="vllm", version=version, tma_shape=True, sorted_a=sorted_a
    )

    assert says in sentence


def test_a_bf16_default_path_file_runs_as_tuned_on_vllm_034():
    sentence = path_in_engine("default", engine="vllm", version="0.34.0", tma_shape=False)

    assert sentence == "vLLM 0.34.0 runs this file as it was tuned: one config for both GEMMs."


def _result(path, batches):
    return TuneResult(
        shape=GLM5_FP8,
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        search="coarse-to-fine",
        ceilings={},
        batches={b.M: b for b in batches},
        kernel={"engine": "vllm", "version": "0.34.0", "source_sha256": "0" * 64, "path": path},
    )


def _batch(M, down):
    return BatchResult(
        M=M, config=dict(UP), tuned_us=10.0, default_us=11.0, floor_us=5.0,
        candidates_tried=9, down_config=down,
    )  # fmt: skip


def test_a_sorted_a_tune_writes_the_up_file_and_its_down_file(tmp_path):
    # M=1: GEMM 2 ran best with GEMM 1's own config; M=2: no down search result; M=64: a
    # down config of its own
    result = _result("sorted_a", [_batch(1, dict(UP)), _batch(2, None), _batch(64, dict(DOWN))])

    paths = write_config_files(result, tmp_path, "vllm")

    names = [p.name for p in paths]
    assert names == [
        "E=32,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=32,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]_down.json",
    ]
    down = json.loads(paths[1].read_text())
    # every batch size: the path off where no down config wins, so no neighbour turns it on
    assert down["1"] == {"USE_TMA": False} and down["2"] == {"USE_TMA": False}
    assert down["64"] == DOWN
    assert down["triton_version"] == "3.6.0"
    assert json.loads(paths[0].read_text())["64"] == UP


@pytest.mark.parametrize("path", ["default", "tma"])
def test_a_tune_off_the_sorted_a_path_writes_no_down_file_for_vllm(tmp_path, path):
    result = _result(path, [_batch(1, None), _batch(64, None)])

    paths = write_config_files(result, tmp_path, "vllm")

    assert [p.name.endswith("_down.json") for p in paths] == [False]
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[0].name]
