"""The engines' own fused-MoE kernels, read from the engines' packages and launched as they
launch them (tuning.backends, tuning.backend_vllm), against the PyTorch reference.

vLLM 0.32's code comes from the CPU build of tests/engine (var/engine), vLLM 0.33's from its
wheel (downloaded once into var/engine/wheels). Without a GPU the kernels run in Triton's
interpreter at small shapes, in fp32 and fp16 (its bf16 dot is wrong). On a GPU the same tests
run the compiled kernels (make test-gpu covers the real shapes).
"""

import shutil

import pytest
import torch

from tests.engine import engine_source, ensure_installed
from tests.interpreted import GPU, interpreting
from tuning.backends import BackendError, load_backend
from tuning.engine_source import EngineSourceError, free_names, locate_package
from tuning.reference import moe_reference
from tuning.search import KernelShape
from tuning.timing import MoEWeights

DEVICE = "cuda" if GPU else "cpu"
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
TOLERANCE = {"fp32": 1e-5, "fp16": 3e-3}
VLLM_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Triton decorates a kernel for the interpreter when TRITON_INTERPRET is set at import."""
    if not GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _vllm_package(version):
    if version == "0.32.0":
        return locate_package("vllm", python=str(ensure_installed()))
    return locate_package("vllm", source_dir=engine_source("vllm", version))


@pytest.fixture(scope="module", params=VLLM_VERSIONS)
def vllm(request):
    package = _vllm_package(request.param)
    with interpreting():
        return load_backend("vllm", source_dir=package.package_dir, capability=90)


def _layer(M, shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    t = TORCH_DTYPES[shape.dtype]
    x = torch.randn((M, shape.H), generator=generator).to(t)
    w1 = (torch.randn((shape.E, 2 * shape.N, shape.H), generator=generator) / shape.H**0.5).to(t)
    w2 = (torch.randn((shape.E, shape.H, shape.N), generator=generator) / shape.N**0.5).to(t)
    logits = torch.randn((M, shape.E), generator=generator)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), shape.top_k, dim=-1)
    values = [x, w1, w2, topk_weights, topk_ids.to(torch.int32)]
    return [v.to(DEVICE) for v in values]


def _check(backend, M, shape, config):
    x, w1, w2, topk_weights, topk_ids = _layer(M, shape)
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
    newer = load_backend("vllm", source_dir=engine_source("vllm", "0.33.0"), capability=90)

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


def test_a_launcher_with_an_unknown_parameter_fails_naming_version_and_parameter(tmp_path):
    source = _vllm_package("0.32.0").package_dir
    copy = tmp_path / "vllm"
    folder = "model_executor/layers/fused_moe"
    shutil.copytree(source / folder, copy / folder)
    path = copy / folder / "fused_moe.py"
    path.write_text(
        path.read_text().replace(
            "    B_bias: torch.Tensor | None = None,\n):\n    assert topk_weights",
            "    B_bias: torch.Tensor | None = None,\n    stream_k: int = 0,\n"
            "):\n    assert topk_weights",
            1,
        )
    )

    with pytest.raises(BackendError) as raised:
        load_backend("vllm", source_dir=copy, capability=90)
    assert "invoke_fused_moe_triton_kernel takes a parameter 'stream_k'" in str(raised.value)


def test_a_function_using_a_name_the_backend_lacks_fails_naming_it(tmp_path):
    source = _vllm_package("0.32.0").package_dir
    copy = tmp_path / "vllm"
    folder = "model_executor/layers/fused_moe"
    shutil.copytree(source / folder, copy / folder)
    path = copy / folder / "utils.py"
    path.write_text(
        path.read_text().replace(
            "def enable_swap_ab(BLOCK_SIZE_M: int, BLOCK_SIZE_N: int) -> bool:\n    return (",
            "def enable_swap_ab(BLOCK_SIZE_M: int, BLOCK_SIZE_N: int) -> bool:\n"
            "    return tuned_swap_rule() and (",
            1,
        )
    )

    with pytest.raises(BackendError) as raised:
        load_backend("vllm", source_dir=copy, capability=90)
    assert "enable_swap_ab uses 'tuned_swap_rule'" in str(raised.value)


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
