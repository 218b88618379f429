"""vLLM 0.34's TMA read of B on a real GPU (gpu tests): the launch with `"USE_TMA": true` and
false against the float64 reference, and its kernels compiled by the compile processes with no
GPU serving the GPU's launches. The 0.34 source comes from its wheel (tests.engine)."""

import pytest
import torch
import triton

from tests.engine import engine_source
from tests.fakes import KERNEL_ENTRY, compile_only_device
from tuning.backends import load_backend
from tuning.reference import moe_reference
from tuning.search import KernelShape
from tuning.timing import make_weights, random_routing

pytestmark = pytest.mark.gpu

# GLM-5 TP8's layer at 64 experts: the real H and N, TMA's tile divisibility included
SHAPE = KernelShape(E=64, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
CONFIG = {**KERNEL_ENTRY, "BLOCK_SIZE_N": 128}


@pytest.fixture(scope="module")
def vllm034():
    return load_backend("vllm", source_dir=engine_source("vllm", "0.34.0"))


def _run(backend, M, config):
    weights = make_weights(SHAPE, seed=7)
    torch.manual_seed(M)
    x = torch.randn((M, SHAPE.H), device="cuda", dtype=torch.bfloat16)
    topk_weights, topk_ids = (t[0] for t in random_routing(1, M, SHAPE.E, SHAPE.top_k))
    out = torch.full_like(x, float("nan"))
    backend.layer(x, weights, topk_weights, topk_ids, shape=SHAPE, config=config, out=out)
    expected = moe_reference(
        x, weights.w1, weights.w2, topk_weights, topk_ids, **weights.layer_kwargs(SHAPE)
    ).float()
    return out.float(), expected


def _specialisations(backend, M, config) -> list[str]:
    """The fused_moe_kernel signatures the layer's launches compile or look up (jit hook)."""
    seen = []

    def hook(**kwargs):
        if kwargs["fn"].name.endswith("fused_moe_kernel"):
            seen.append(kwargs["compile"]["specialization_data"])
        return False

    backend.source.module.fused_moe_kernel.device_caches.clear()
    triton.knobs.runtime.jit_cache_hook = hook
    try:
        _run(backend, M, config)
    finally:
        triton.knobs.runtime.jit_cache_hook = None
    return seen


@pytest.mark.parametrize("use_tma", [True, False])
@pytest.mark.parametrize("M", [1, 64, 600])
def test_vllm_034s_layer_matches_the_reference_with_and_without_tma(vllm034, use_tma, M):
    out, expected = _run(vllm034, M, {**CONFIG, "USE_TMA": use_tma})

    assert torch.isfinite(out).all()
    assert float((out - expected).norm() / expected.norm()) < 3e-2


def test_use_tma_picks_the_descriptor_read_of_b(vllm034):
    with_tma = _specialisations(vllm034, 64, {**CONFIG, "USE_TMA": True})
    without = _specialisations(vllm034, 64, {**CONFIG, "USE_TMA": False})
    # the entry without the key takes the launcher's default: TMA
    default = _specialisations(vllm034, 64, CONFIG)

    assert with_tma and all("tensordesc" in s for s in with_tma)
    assert without and not any("tensordesc" in s for s in without)
    assert default == with_tma


def test_vllm_034s_tma_kernels_compiled_with_no_gpu_serve_the_gpus_launches():
    source = engine_source("vllm", "0.34.0")
    done = compile_only_device("--engine", "vllm", "--source", source)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every launch found its kernels in the cache" in done.stdout
