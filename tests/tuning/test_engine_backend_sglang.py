"""SGLang 0.5.23's own fused-MoE kernel (tuning.backends.sglang), read from its wheel (downloaded
once into var/engine/wheels) and launched as SGLang launches it, against the PyTorch reference.

Without a GPU the kernels run in Triton's interpreter at small shapes, in fp32 and fp16 (its bf16
dot and its float→fp8 conversion are wrong), and the backend is told of an sm_80 GPU: on sm_90
SGLang launches every kernel with programmatic dependent launch (griddepcontrol), which the
interpreter cannot run; the sm_90 swap-AB launch is tested with SGLang's PDL check answering no.
SGLang's GEMMs write an fp32 layer's intermediates in fp16 (its compute_type), so fp32 is held to
fp16's tolerance. On a GPU the same tests run the compiled kernels at the GPU's own capability,
and the gpu tests run SGLang's shipped H200 configs (TMA, swap-AB, PDL) at fp8.
"""

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.engine import GPU_TEST_SOURCES, engine_source, source_edited
from tests.interpreted import GPU, interpreting, random_layer
from tuning.backends import load_backend
from tuning.backends.base import BackendError
from tuning.engine_source import (
    EnginePackage,
    EngineSourceError,
    load_functions,
    locate_package,
    top_level_constants,
)
from tuning.reference import moe_reference, quantize_fp8_per_expert
from tuning.search import KernelShape
from tuning.timing import MoEWeights

VERSION = dict(GPU_TEST_SOURCES)["sglang"]
TOLERANCE = 3e-3
# the SGLang module that holds its fused-MoE kernel and its launcher
KERNELS = "kernels/ops/moe/fused_moe_triton_kernels.py"
# the capability the layer tests launch for: the GPU's own, else one without PDL
LAYER_CAPABILITY = None if GPU else 80
SMALL = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 32,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}
# GEMM 2's own tile: wider, and a K step past N=32 (SGLang's masked-K path)
DOWN = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 4,
    "num_warps": 4,
    "num_stages": 3,
}
# torch's inductor, which compiles SGLang's @torch.compile top-k sum when an sm_80 layer test first
# calls it, uses a deprecated torch.jit API
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
GLM5_FP8 = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
GLM5_FP8_TP4 = KernelShape(E=256, N=512, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Triton decorates a kernel for the interpreter when TRITON_INTERPRET is set at import."""
    if not GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _load(capability, source_dir=None):
    with interpreting():
        return load_backend(
            "sglang",
            source_dir=source_dir or engine_source("sglang", VERSION),
            capability=capability,
        )


@pytest.fixture(scope="module")
def sglang():
    return _load(LAYER_CAPABILITY)


@pytest.fixture(scope="module")
def sglang_h200():
    return _load(90)


def _relative_error(out, expected):
    return (out.double() - expected).abs().max().item() / expected.abs().max().item()


def _check(backend, M, shape, config, down_config=None):
    x, w1, w2, topk_weights, topk_ids = random_layer(M, shape)
    given = x.clone()
    out = torch.empty_like(x)

    backend.layer(
        x,
        MoEWeights(w1, w2),
        topk_weights,
        topk_ids,
        shape=shape,
        config=config,
        down_config=down_config,
        out=out,
    )

    expected = moe_reference(x, w1, w2, topk_weights, topk_ids, dtype=shape.dtype)
    assert _relative_error(out, expected) < TOLERANCE, (M, config, down_config)
    # SGLang runs inplace: over out, never over the caller's x
    assert torch.equal(x, given)


def _spy(monkeypatch, backend, name):
    """Calls of the backend module's function `name`, recorded as (args, kwargs, result)."""
    calls = []
    module = backend.source.module
    original = getattr(module, name)

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append((args, kwargs, result))
        return result

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("down_config", [None, DOWN], ids=["one-config", "down-config"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("M", [1, 7, 40])
def test_sglangs_layer_matches_the_reference(sglang, dtype, M, down_config):
    shape = KernelShape(E=16, N=32, H=64, top_k=2, dtype=dtype)

    _check(sglang, M, shape, SMALL, down_config)


def test_gemm_2_launches_with_the_down_config_and_both_read_one_sort(sglang, monkeypatch):
    launches = _spy(monkeypatch, sglang, "invoke_fused_moe_kernel")
    shape = KernelShape(E=16, N=32, H=64, top_k=2, dtype="fp16")

    _check(sglang, 7, shape, SMALL, DOWN)

    # invoke_fused_moe_kernel(A, B, bias, C, A_scale, B_scale, B_zp, topk_weights, topk_ids,
    # sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight, top_k, config)
    (up, _, _), (down, _, _) = launches
    assert up[14] == SMALL and down[14] == DOWN
    assert up[9] is down[9] and up[10] is down[10]
    assert (up[12], up[13], down[12], down[13]) == (False, 2, True, 1)


def test_a_down_config_of_another_block_size_m_is_refused(sglang):
    shape = KernelShape(E=16, N=32, H=64, top_k=2, dtype="fp16")

    with pytest.raises(BackendError) as raised:
        _check(sglang, 7, shape, SMALL, {**DOWN, "BLOCK_SIZE_M": 32})
    assert "SGLang sorts the tokens once for both GEMMs" in str(raised.value)


@pytest.mark.parametrize("M", [1, 7])
def test_tiny_batches_of_many_experts_take_sglangs_single_launch_align(sglang, monkeypatch, M):
    aligns = _spy(monkeypatch, sglang, "moe_align_small_numel")
    # M·top_k ≤ SMALL_NUMEL_LIMIT pairs, more than 64 buckets (E + 1)
    shape = KernelShape(E=64, N=32, H=64, top_k=2, dtype="fp16")

    _check(sglang, M, shape, SMALL)

    assert len(aligns) == 1


def test_the_top_k_sum_runs_sglangs_triton_reduction(sglang, monkeypatch):
    sums = _spy(monkeypatch, sglang, "moe_sum_reduce_triton")
    # past 32 tokens SGLang sums top_k > 2 rows with sgl_kernel's moe_sum_reduce
    shape = KernelShape(E=16, N=32, H=64, top_k=4, dtype="fp16")

    _check(sglang, 40, shape, SMALL)

    assert len(sums) == 1


def test_sm90_alone_swaps_a_and_b_for_narrow_fp8_tiles(sglang_h200, monkeypatch):
    # H200, A100, B200: one engine module, the capability set at every call
    backends = (sglang_h200, _load(80), _load(100))
    if not GPU:
        # the interpreter cannot run griddepcontrol, which sm_90 and later launch with
        monkeypatch.setattr(sglang_h200.source.module, "is_arch_support_pdl", lambda: False)
    asked = _spy(monkeypatch, sglang_h200, "should_enable_swap_ab")
    M, E, N, H, top_k = 40, 6, 32, 64, 2
    shape = KernelShape(E=E, N=N, H=H, top_k=top_k, dtype="fp8_w8a8")
    x, w1, w2, topk_weights, topk_ids = random_layer(M, KernelShape(E, N, H, top_k, "fp16"), seed=6)
    w1q, w1_scale = quantize_fp8_per_expert(w1.float())
    w2q, w2_scale = quantize_fp8_per_expert(w2.float())
    weights = MoEWeights(w1q, w2q, w1_scale, w2_scale)
    config = {**SMALL, "BLOCK_SIZE_N": 64}
    outs = []

    for backend in backends:
        outs.append(torch.empty_like(x))
        backend.layer(x, weights, topk_weights, topk_ids, shape=shape, config=config, out=outs[-1])

    # GEMM 1 and GEMM 2 of each layer
    assert [(args, swap) for args, _, swap in asked] == [
        *[((16, 64), True)] * 2,
        *[((16, 64), False)] * 4,
    ]
    swapped = outs[0]
    assert _relative_error(swapped, outs[1].double()) < 1e-2
    kwargs = {"dtype": "fp8_w8a8", "w1_scale": w1_scale, "w2_scale": w2_scale}
    expected = moe_reference(x, w1q, w2q, topk_weights, topk_ids, **kwargs)
    # fp16 intermediates and fp8 roundings of them that land on the other side of a tie
    assert _relative_error(swapped, expected) < 3e-2


def test_sglangs_default_config_is_its_own_rule(sglang_h200):
    bf16 = KernelShape(E=256, N=256, H=6144, top_k=8)
    fp8_per_tensor = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8")
    l40s = _load(90)
    # reassigned, as the compile processes do for the timing process's GPU
    l40s.capability = 89

    # SGLang 0.5.23's get_default_config; Triton's 4 warps and 3 stages where it names none
    assert sglang_h200.default_config(GLM5_FP8, 4) == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert sglang_h200.default_config(bf16, 4) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert sglang_h200.default_config(bf16, 512)["BLOCK_SIZE_M"] == 64
    assert sglang_h200.default_config(fp8_per_tensor, 256)["BLOCK_SIZE_N"] == 128
    assert sglang_h200.default_config(fp8_per_tensor, 512) == {
        "BLOCK_SIZE_M": 128,
        "BLOCK_SIZE_N": 256,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 8,
        "num_stages": 4,
    }
    # below 128 KiB of shared memory per block (sm_89's 99 KiB) SGLang takes smaller fp8 tiles
    assert l40s.default_config(fp8_per_tensor, 512) == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 256,
        "GROUP_SIZE_M": 64,
        "num_warps": 4,
        "num_stages": 2,
    }
    assert sglang_h200.default_config(fp8_per_tensor, 512)["BLOCK_SIZE_K"] == 128


def test_sglang_ships_a_glm5_fp8_file_for_the_h200(sglang_h200):
    shipped = sglang_h200.shipped_configs(GLM5_FP8, "NVIDIA H200")
    down = sglang_h200.shipped_configs(GLM5_FP8, "NVIDIA H200", down=True)

    # no Triton 3.2+ folder has GLM-5's shape at TP8 on the H200: SGLang falls back to 3.1.0's
    assert shipped is not None
    assert shipped.path.endswith(
        "/configs/triton_3_1_0/"
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    )
    assert set(shipped.entry_for(24)) >= {"BLOCK_SIZE_M", "num_warps", "num_stages"}
    # and no _down file: GEMM 2 reuses the up-projection file
    assert down.path == shipped.path


def test_sglang_ships_a_down_file_with_tma_for_glm5_at_tp4_on_the_h200(sglang_h200):
    down = sglang_h200.shipped_configs(GLM5_FP8_TP4, "NVIDIA H200", down=True)
    up = sglang_h200.shipped_configs(GLM5_FP8_TP4, "NVIDIA H200", triton_version="3.6.0")

    assert down.path.endswith(
        "/triton_3_6_0/E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
        "block_shape=[128, 128]_down.json"
    )
    assert down.entry_for(1)["USE_TMA"] is True
    assert up.path == down.path.replace("_down.json", ".json")
    assert sglang_h200.shipped_configs(KernelShape(8, 64, 128, 2), "NVIDIA H200") is None


def test_a_shipped_entry_without_warps_or_stages_gets_tritons_launch_defaults(sglang_h200):
    bf16 = replace(GLM5_FP8_TP4, dtype="bf16", block_shape=None)

    down = sglang_h200.shipped_configs(bf16, "NVIDIA H200", down=True, triton_version="3.7.1")

    assert down.path.endswith("/triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200_down.json")
    # the file's 256 entry names tile sizes alone
    assert down.entries[256] == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert down.entries[512]["USE_TMA"] is True


def test_the_backend_names_sglang_and_hashes_its_code(sglang):
    described = sglang.describe()

    assert described["engine"] == "sglang" and described["version"] == VERSION
    assert len(described["source_sha256"]) == 64
    assert sglang.separate_down_config


def _copy_of_sglang(tmp_path):
    source = engine_source("sglang", VERSION)
    for folder in ("kernels/ops/moe", "srt/layers/moe/moe_runner/triton_utils"):
        shutil.copytree(source / folder, tmp_path / "sglang" / folder)
    info = f"sglang-{VERSION}.dist-info"
    shutil.copytree(source.parent / info, tmp_path / info)
    return tmp_path / "sglang"


def _refused_with_kernels_edited(tmp_path, old, new):
    """A copy of SGLang whose KERNELS module has its first `old` replaced by `new`, loaded for
    capability 9.0: the BackendError's words (the load must refuse it)."""
    copy = _copy_of_sglang(tmp_path)
    source_edited(copy / KERNELS, old, new)
    with pytest.raises(BackendError) as raised:
        _load(90, copy)
    return str(raised.value)


def test_a_launcher_with_an_unknown_parameter_fails_naming_version_and_parameter(tmp_path):
    refused = _refused_with_kernels_edited(
        tmp_path,
        "    a_output_slices: int = 1,\n) -> None:",
        "    a_output_slices: int = 1,\n    stream_k: int = 0,\n) -> None:",
    )

    assert (
        "SGLang 0.5.23's invoke_fused_moe_kernel takes a parameter 'stream_k', which moeops' "
        "sglang backend does not know"
    ) in refused


def test_a_function_using_a_name_the_backend_lacks_fails_naming_it(tmp_path):
    refused = _refused_with_kernels_edited(
        tmp_path,
        "    return is_sm90_supported() and BLOCK_SIZE_M < 64",
        "    return tuned_swap_rule() and BLOCK_SIZE_M < 64",
    )

    assert "SGLang 0.5.23's should_enable_swap_ab uses 'tuned_swap_rule'" in refused


def test_top_level_constants_are_read_without_running_the_module():
    text = "import os\nLIMIT = 64\nCUTOFF: int = 128 * 1024\nNAME = os.getenv('X')\n"

    assert top_level_constants(text, ["LIMIT", "CUTOFF"], where="m.py") == {
        "LIMIT": 64,
        "CUTOFF": 131072,
    }
    with pytest.raises(EngineSourceError, match="sets 'NAME' to something other than a constant"):
        top_level_constants(text, ["NAME"], where="m.py")
    with pytest.raises(EngineSourceError, match="defines no constant 'SIZE'"):
        top_level_constants(text, ["SIZE"], where="m.py")


def test_loading_sglang_imports_no_dynamo_for_its_torch_compile_helpers():
    # in a process of its own: this one may have imported dynamo already
    source = engine_source("sglang", VERSION)
    script = (
        "import sys\n"
        "from tuning.backends import load_backend\n"
        f"load_backend('sglang', source_dir={str(source)!r}, capability=90)\n"
        "print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "False"]


def test_an_engine_helper_under_torch_compile_is_compiled_when_first_called(tmp_path):
    from torch._dynamo.utils import counters

    (tmp_path / "ops.py").write_text(
        "@torch.compile(backend='eager', dynamic=False)\n"
        "def scaled_sum(x, scale):\n"
        "    return x.sum(dim=1) * scale\n"
    )
    package = EnginePackage("sglang", tmp_path, "0.0.1")
    loaded = load_functions(package, {"ops.py": ["scaled_sum"]}, "import torch\n", {"torch"})
    frames = counters["frames"]["ok"]

    assert loaded.scaled_sum(torch.arange(6.0).reshape(2, 3), 2.0).tolist() == [6.0, 24.0]
    assert counters["frames"]["ok"] == frames + 1


def test_the_package_found_beside_its_dist_info_is_0_5_23():
    package = locate_package("sglang", source_dir=engine_source("sglang", VERSION))

    assert package.title == "SGLang 0.5.23"


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 128, 512])
def test_sglangs_shipped_h200_configs_run_and_match_the_reference_on_the_gpu(sglang, M):
    from tuning.timing import make_weights, random_routing

    config = sglang.shipped_configs(GLM5_FP8_TP4, "NVIDIA H200").entry_for(M)
    down_config = sglang.shipped_configs(GLM5_FP8_TP4, "NVIDIA H200", down=True).entry_for(M)
    # as SGLang does: GEMM 2 takes GEMM 1's BLOCK_SIZE_M (one sort)
    down_config = {**down_config, "BLOCK_SIZE_M": config["BLOCK_SIZE_M"]}
    # the shipped tiles on fewer experts and a narrower hidden size: the reference's float64
    # weights of the file's own shape would take 13 GB
    shape = replace(GLM5_FP8_TP4, E=32, H=1024)
    weights = make_weights(shape)
    kwargs = weights.layer_kwargs(shape)
    x = torch.randn((M, shape.H), device="cuda", dtype=torch.bfloat16)
    topk_weights, topk_ids = random_routing(1, M, shape.E, shape.top_k, seed=M)
    out = torch.empty_like(x)

    sglang.layer(
        x,
        weights,
        topk_weights[0],
        topk_ids[0],
        shape=shape,
        config=config,
        down_config=down_config,
        out=out,
    )

    expected = moe_reference(x, weights.w1, weights.w2, topk_weights[0], topk_ids[0], **kwargs)
    assert _relative_error(out, expected) < 3e-2, (config, down_config)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 33, 300])
def test_sglangs_bf16_layer_with_a_tma_down_config_matches_the_reference_on_the_gpu(sglang, M):
    from tuning.timing import make_weights, random_routing

    shape = KernelShape(E=64, N=256, H=1024, top_k=8)
    weights = make_weights(shape)
    x = torch.randn((M, shape.H), device="cuda", dtype=torch.bfloat16)
    topk_weights, topk_ids = random_routing(1, M, shape.E, shape.top_k, seed=M)
    config = sglang.default_config(shape, M)
    down_config = {**config, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "USE_TMA": True}
    out = torch.empty_like(x)

    sglang.layer(
        x,
        weights,
        topk_weights[0],
        topk_ids[0],
        shape=shape,
        config=config,
        down_config=down_config,
        out=out,
    )

    expected = moe_reference(x, weights.w1, weights.w2, topk_weights[0], topk_ids[0])
    assert _relative_error(out, expected) < 1e-2
