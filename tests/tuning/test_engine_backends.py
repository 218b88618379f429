"""The engines' own fused-MoE kernels, read from the engines' packages and launched as they
launch them (tuning.backends, tuning.backends.vllm), against the PyTorch reference.

vLLM 0.32's code comes from the CPU build of tests/engine (var/engine), vLLM 0.33's from its
wheel (downloaded once into var/engine/wheels). Without a GPU the kernels run in Triton's
interpreter at small shapes, in fp32 and fp16 (its bf16 dot is wrong). On a GPU the same tests
run the compiled kernels (make test-gpu covers the real shapes).
"""

import shutil

import pytest
import torch

from tests.engine import engine_source, ensure_installed, source_edited
from tests.interpreted import GPU, interpreting, random_layer
from tuning.backends import load_backend
from tuning.backends.base import BackendError
from tuning.engine_source import EngineSourceError, free_names, locate_package
from tuning.reference import moe_reference
from tuning.search import KernelShape
from tuning.timing import MoEWeights

TOLERANCE = {"fp32": 1e-5, "fp16": 3e-3}
VLLM_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
FUSED_MOE = "model_executor/layers/fused_moe"


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Triton decorates a kernel for the interpreter when TRITON_INTERPRET is set at import."""
    if not GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _vllm_package(version):
    if version == "0.32.0":
        return locate_package("vllm", python=str(ensure_installed()))
    return locate_package("vllm", source_dir=engine_source("vllm", version))


def _vllm(version, capability=90, launch=None):
    """vLLM `version` from tests/engine as a backend on a GPU of `capability`."""
    return load_backend(
        "vllm", source_dir=engine_source("vllm", version), capability=capability, launch=launch
    )


@pytest.fixture(scope="module", params=VLLM_VERSIONS)
def vllm(request):
    package = _vllm_package(request.param)
    with interpreting():
        return load_backend("vllm", source_dir=package.package_dir, capability=90)


def _check(backend, M, shape, config):
    x, w1, w2, topk_weights, topk_ids = random_layer(M, shape)
    out = torch.empty_like(x)
    backend.layer(
        x, MoEWeights(w1, w2), topk_weights, topk_ids, shape=shape, config=config, out=out
    )
    expected = moe_reference(x, w1, w2, topk_weights, topk_ids, dtype=shape.dtype)
    error = (out.double() - expected).abs().max().item() / expected.abs().max().item()
    assert error < TOLERANCE[shape.dtype], (M, config, error)


SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("M", [1, 7, 40])
def test_vllms_layer_matches_the_reference(vllm, dtype, M):
    # M=1 at top-2 of 16 experts: 8 ≤ 16, vLLM's one-token-per-block path, no align
    shape = KernelShape(E=16, N=32, H=64, top_k=2, dtype=dtype)
    config = {**SMALL, "num_warps": 4, "num_stages": 2}

    _check(vllm, M, shape, config)


def test_vllms_layer_matches_with_grouped_tiles_and_swap_ab_sizes(vllm):
    shape = KernelShape(E=8, N=64, H=128, top_k=2, dtype="fp32")
    # BLOCK_SIZE_M < 64 with BLOCK_SIZE_N ≥ 64: the shape of vLLM's swap-AB launch (fp8 on SM90)
    config = {
        "BLOCK_SIZE_M": 32,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 4,
        "num_warps": 4,
        "num_stages": 2,
    }

    _check(vllm, 33, shape, config)


def test_vllms_default_config_is_its_own_rule(vllm):
    glm5_fp8 = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
    bf16 = KernelShape(E=256, N=256, H=6144, top_k=8)

    # vLLM 0.32's get_default_config: 64-wide N tiles and a deeper pipeline up to M=8
    assert vllm.default_config(glm5_fp8, 4) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4,
    }
    assert vllm.default_config(glm5_fp8, 512)["BLOCK_SIZE_M"] == 64
    assert vllm.default_config(bf16, 4096)["BLOCK_SIZE_M"] == 128
    assert "SPLIT_K" not in vllm.default_config(bf16, 1)


def test_vllm_ships_a_glm5_fp8_file_for_the_h200(vllm):
    glm5_fp8 = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))

    shipped = vllm.shipped_configs(glm5_fp8, "NVIDIA H200")

    assert shipped is not None
    assert shipped.path.endswith(
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert set(shipped.entry_for(24)) >= {"BLOCK_SIZE_M", "num_warps"}
    assert vllm.shipped_configs(KernelShape(E=8, N=64, H=128, top_k=2), "NVIDIA H200") is None


def test_the_backend_names_the_engine_and_hashes_its_code(vllm):
    described = vllm.describe()

    assert described["engine"] == "vllm" and described["version"] in VLLM_VERSIONS
    assert len(described["source_sha256"]) == 64


def test_two_vllm_versions_are_two_kernels():
    older = load_backend("vllm", source_dir=_vllm_package("0.32.0").package_dir, capability=90)
    newer = _vllm("0.33.0")

    assert older.version == "0.32.0" and newer.version == "0.33.0"
    # 0.33's launcher reads the weight scales' strides differently
    assert older.source_sha256 != newer.source_sha256


def test_a_kernel_loaded_compiled_first_is_interpreted_when_asked(monkeypatch):
    # another test (or a worker) may load the same engine code for compiling first
    source = _vllm_package("0.32.0").package_dir
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    compiled = load_backend("vllm", source_dir=source, capability=90)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted = load_backend("vllm", source_dir=source, capability=90)

    assert type(compiled.source.module.fused_moe_kernel).__name__ == "JITFunction"
    assert type(interpreted.source.module.fused_moe_kernel).__name__ == "InterpretedFunction"
    assert compiled.source_sha256 == interpreted.source_sha256


def _refused_with_edited(tmp_path, file_name, old, new):
    """vLLM 0.32.0's fused-MoE folder copied into tmp_path/vllm, the first `old` of its
    `file_name` replaced by `new`, loaded for capability 9.0: the BackendError's words (the load
    must refuse it)."""
    copy = tmp_path / "vllm"
    source = _vllm_package("0.32.0").package_dir
    shutil.copytree(source / FUSED_MOE, copy / FUSED_MOE)
    source_edited(copy / FUSED_MOE / file_name, old, new)
    with pytest.raises(BackendError) as raised:
        load_backend("vllm", source_dir=copy, capability=90)
    return str(raised.value)


def test_a_launcher_with_an_unknown_parameter_fails_naming_version_and_parameter(tmp_path):
    refused = _refused_with_edited(
        tmp_path,
        "fused_moe.py",
        "    B_bias: torch.Tensor | None = None,\n):\n    assert topk_weights",
        "    B_bias: torch.Tensor | None = None,\n    stream_k: int = 0,\n"
        "):\n    assert topk_weights",
    )

    assert "invoke_fused_moe_triton_kernel takes a parameter 'stream_k'" in refused


def test_a_function_using_a_name_the_backend_lacks_fails_naming_it(tmp_path):
    refused = _refused_with_edited(
        tmp_path,
        "utils.py",
        "def enable_swap_ab(BLOCK_SIZE_M: int, BLOCK_SIZE_N: int) -> bool:\n    return (",
        "def enable_swap_ab(BLOCK_SIZE_M: int, BLOCK_SIZE_N: int) -> bool:\n"
        "    return tuned_swap_rule() and (",
    )

    assert "enable_swap_ab uses 'tuned_swap_rule'" in refused


def test_no_engine_installed_is_said_plainly():
    with pytest.raises(EngineSourceError) as raised:
        locate_package("sglang")
    assert "MOEOPS_SGLANG_PYTHON" in str(raised.value)


def test_free_names_are_the_globals_a_function_reads_annotations_included():
    source = (
        "def f(a: Any, *rest, k=DEFAULT) -> Thing:\n"
        "    b: List[int] = [x for x in a]\n"
        "    g = lambda y: y + offset\n"
        "    return len(b) + helper(k)\n"
    )

    assert free_names(source) == {"Any", "DEFAULT", "Thing", "List", "offset", "helper"}


# vLLM 0.34: the launcher's sorted-A parameters, its TMA read of B, and the rule for its `_down`
# file (tuning.backends.vllm)
GLM5_FP8 = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))


@pytest.fixture(scope="module")
def vllm034():
    with interpreting():
        return _vllm("0.34.0")


def test_vllm_034_loads_knowing_its_sorted_launch_and_its_tma_switch(vllm034):
    older = _vllm("0.33.0")

    assert vllm034.version == "0.34.0"
    assert vllm034.sorted_launch and vllm034.reads_use_tma
    assert not older.sorted_launch and not older.reads_use_tma
    assert vllm034.source_sha256 != older.source_sha256


@pytest.mark.parametrize(
    ("shape", "capability", "searched"),
    [
        (GLM5_FP8, 90, True),
        (GLM5_FP8, 100, True),
        # neither Ada nor consumer Blackwell: not of the SM90 or SM100 family
        (GLM5_FP8, 89, False),
        (GLM5_FP8, 120, False),
        (GLM5_FP8, None, False),
        # fp8 per tensor and bf16 read B by pointers
        (KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8"), 90, False),
        (KernelShape(E=256, N=256, H=6144, top_k=8), 90, False),
    ],
)
def test_use_tma_is_searched_where_vllm_034_reads_b_by_tma(vllm034, shape, capability, searched):
    vllm034.capability = capability
    try:
        switches = vllm034.search_switches(shape)
    finally:
        vllm034.capability = 90

    assert switches == ({"USE_TMA": (True, False)} if searched else {})


def test_vllm_033_is_searched_without_use_tma_which_its_kernel_would_refuse():
    older = _vllm("0.33.0")

    assert older.search_switches(GLM5_FP8) == {}


@pytest.mark.parametrize("use_tma", [True, False])
def test_vllm_034s_layer_takes_an_entry_with_use_tma_where_its_pointer_path_runs(vllm034, use_tma):
    # fp32 in the interpreter: no TMA there, the launcher pops the key and reads B by pointers
    shape = KernelShape(E=16, N=32, H=64, top_k=2, dtype="fp32")
    config = {**SMALL, "num_warps": 4, "num_stages": 2, "USE_TMA": use_tma}

    _check(vllm034, 7, shape, config)


def test_vllm_034_names_its_down_file_beside_the_up_file_and_ships_glm5s(vllm034):
    older = _vllm("0.33.0")
    up = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]"

    assert vllm034.file_name(GLM5_FP8, "NVIDIA H200") == f"{up}.json"
    assert vllm034.down_file_name(GLM5_FP8, "NVIDIA H200") == f"{up}_down.json"
    assert older.down_file_name(GLM5_FP8, "NVIDIA H200") is None
    down = vllm034.shipped_down(GLM5_FP8, "NVIDIA H200")
    assert sorted(down) == [512, 1024, 3072, 4096]
    # the path off at 512 and 4096, on at 1024 and 3072
    assert down[512] == {"USE_TMA": False} and down[4096] == {"USE_TMA": False}
    assert down[1024]["USE_TMA"] is True and down[1024]["BLOCK_SIZE_N"] == 128
    assert vllm034.shipped_down(KernelShape(E=8, N=64, H=128, top_k=2), "NVIDIA H200") is None


def _sorted_a(shape=GLM5_FP8, **deployment):
    from tuning.backends.vllm import sorted_a_path

    return sorted_a_path(
        shape, **{"capability": 90, "deep_gemm_e8m0": True, "expert_parallel": False, **deployment}
    )


def test_vllm_034_takes_the_sorted_a_path_for_glm5_fp8_with_deep_gemm_e8m0_on_the_h200():
    assert _sorted_a() is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"shape": KernelShape(E=256, N=256, H=6144, top_k=8)}, "block [128, 128]"),
        (
            {"shape": KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8")},
            "block [128, 128]",
        ),
        (
            {
                "shape": KernelShape(
                    E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(64, 128)
                )
            },
            "block [128, 128]",
        ),
        ({"deep_gemm_e8m0": False}, "VLLM_USE_DEEP_GEMM_E8M0"),
        ({"expert_parallel": True}, "expert parallelism"),
        ({"capability": 100}, "compute capability 9.0"),
        ({"capability": None}, "compute capability 9.0"),
        (
            {
                "shape": KernelShape(
                    E=256, N=256, H=2048, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
                )
            },
            "H 2048 is under 4096",
        ),
        (
            {
                "shape": KernelShape(
                    E=256, N=192, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
                )
            },
            "N 192 is not a multiple of 128",
        ),
    ],
)
def test_each_condition_of_vllm_034s_sorted_a_path_turns_it_off(change, reason):
    assert reason in _sorted_a(**change)


@pytest.mark.parametrize(
    ("down_entry", "up_block_m", "taken"),
    [
        ({"USE_TMA": False}, 64, False),
        (None, 64, False),
        # an entry that does not say USE_TMA leaves the path off
        ({"BLOCK_SIZE_N": 128}, 64, False),
        ({"USE_TMA": True, "BLOCK_SIZE_N": 128}, 64, True),
        ({"USE_TMA": True, "BLOCK_SIZE_N": 128}, 8, False),
        # 6144 is no multiple of 4096's tile
        ({"USE_TMA": True, "BLOCK_SIZE_N": 4096}, 64, False),
    ],
)
def test_a_down_entry_takes_the_path_only_saying_use_tma_true(down_entry, up_block_m, taken):
    from tuning.backends.vllm import sorted_a_entry

    up = {"BLOCK_SIZE_M": up_block_m, "BLOCK_SIZE_N": 128}

    assert sorted_a_entry(down_entry, up, 6144) is taken


@pytest.mark.parametrize(
    ("launch", "capability", "path"),
    [
        ({"deep_gemm_e8m0": True}, 90, "sorted_a"),
        ({"deep_gemm_e8m0": True, "expert_parallel": True}, 90, "tma"),
        ({"deep_gemm_e8m0": False}, 90, "tma"),
        (None, 90, "tma"),
        ({"deep_gemm_e8m0": True}, 100, "tma"),
        ({"deep_gemm_e8m0": True}, 80, "default"),
    ],
)
def test_vllm_034s_kernel_path_follows_the_deployments_launch(launch, capability, path):
    backend = _vllm("0.34.0", capability, launch)

    assert backend.kernel_path(GLM5_FP8) == path
    assert backend.down_config_applies(GLM5_FP8) is (path == "sorted_a")
    assert backend.down_switches(GLM5_FP8) == ({"USE_TMA": (True,)} if path == "sorted_a" else {})


def test_vllm_033_has_no_sorted_a_path_whatever_the_launch():
    older = _vllm("0.33.0", launch={"deep_gemm_e8m0": True})

    assert older.kernel_path(GLM5_FP8) == "default"
    assert older.shipped_configs(GLM5_FP8, "NVIDIA H200", down=True) is None


def test_the_shipped_down_file_is_a_candidate_only_on_the_sorted_a_path():
    shape = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
    on = _vllm("0.34.0", launch={"deep_gemm_e8m0": True})
    off = _vllm("0.34.0")

    shipped = on.shipped_configs(shape, "NVIDIA H200", down=True)
    assert shipped.path.endswith("block_shape=[128,128]_down.json")
    assert shipped.entry_for(500) == {"USE_TMA": False}
    assert shipped.entry_for(1000)["USE_TMA"] is True
    assert off.shipped_configs(shape, "NVIDIA H200", down=True) is None


def test_a_layer_with_a_down_config_off_the_sorted_a_path_is_refused(vllm034):
    from tuning.backends.base import BackendError

    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    with pytest.raises(BackendError, match="runs GEMM 2 with GEMM 1's config here"):
        vllm034.layer(
            None, None, None, None, shape=GLM5_FP8, config=config,
            down_config={**config, "BLOCK_SIZE_N": 128}, out=None,
        )  # fmt: skip


def test_the_tune_cli_gives_vllm_the_deployments_launch(tmp_path, monkeypatch):
    from tests.fakes import HF_CONFIGS
    from tuning import tune_cli

    parser = __import__("argparse").ArgumentParser()
    tune_cli.add_arguments(parser)
    argv = ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]
    argv += ["--out", str(tmp_path), "--engine", "vllm"]
    argv += ["--engine-source", str(engine_source("vllm", "0.34.0")), "--deep-gemm-e8m0"]
    args = parser.parse_args(argv)

    tune_cli._checked(args)

    assert args.engine_spec["launch"] == {"deep_gemm_e8m0": True, "expert_parallel": False}


def test_the_sorted_a_path_quantises_with_vllm_034s_own_kernel():
    backend = _vllm("0.34.0", launch={"deep_gemm_e8m0": True})

    kernel = backend._sorted_quant_kernel()

    # (interpreted where this machine has no GPU: the same function either way)
    assert kernel.fn.__name__ == "_silu_mul_quant_sorted_kernel"
    assert kernel.fn.__module__.startswith("moeops_engine_kernels_vllm_0_34_0")
