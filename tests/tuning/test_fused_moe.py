"""The fused-MoE Triton kernel against its PyTorch reference.

Without a GPU the kernels run in Triton's interpreter at small shapes, in fp32/fp16 (its bf16
dot is wrong). Its float→fp8 conversion is wrong too (a rounding carry into the exponent is
lost: 126.8 becomes 64, not 128), so the fp8 paths are tested piecewise: the scaled GEMMs on
operands quantised by PyTorch here, the in-kernel quantisation on exactly representable values
in test_moe_ops.py, and the per-tensor layer whose activations PyTorch quantises here. The whole
fp8 layer at the real shapes runs on the GPU (gpu tests below, and bench/kernel_device.py).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.interpreted import fm, ops
from tuning.config_files import REQUIRED_FIELDS
from tuning.reference import (
    moe_reference,
    quantize_fp8_blocks,
    quantize_fp8_per_expert,
    quantize_fp8_token_groups,
)

GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _interpreter_while_testing(monkeypatch):
    """Triton reads TRITON_INTERPRET again while running (e.g. importing its Gluon frontend)."""
    if not GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


DEVICE = "cuda" if GPU else "cpu"
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# fp32: the interpreter's exact float32 dot; fp16: roundings of h, the activation and y.
TOLERANCE = {"fp32": 1e-5, "fp16": 3e-3, "bf16": 1e-2}
SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1}


def _layer(M, E, N, H, top_k, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    t = TORCH_DTYPES[dtype]
    x = torch.randn((M, H), generator=generator).to(t)
    w1 = (torch.randn((E, 2 * N, H), generator=generator) / H**0.5).to(t)
    w2 = (torch.randn((E, H, N), generator=generator) / N**0.5).to(t)
    logits = torch.randn((M, E), generator=generator)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return [v.to(DEVICE) for v in (x, w1, w2, topk_weights, topk_ids.to(torch.int32))]


def _relative_error(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _poisoned_run(x, w1, w2, topk_weights, topk_ids, **kwargs):
    out = torch.full_like(x, float("nan"))
    result = fm.fused_moe(x, w1, w2, topk_weights, topk_ids, out=out, **kwargs)
    assert result is out
    assert torch.isfinite(out).all(), "some output elements were never written"
    return out


@pytest.mark.parametrize(
    ("M", "E", "N", "H", "top_k", "dtype", "config"),
    [
        (1, 4, 24, 40, 2, "fp32", SMALL),
        (1, 16, 32, 32, 1, "fp32", SMALL),
        (37, 8, 32, 64, 3, "fp16", {**SMALL, "BLOCK_SIZE_N": 32, "GROUP_SIZE_M": 2}),
        (5, 16, 16, 48, 8, "fp32", {**SMALL, "BLOCK_SIZE_K": 32, "num_stages": 2}),
        (50, 6, 48, 80, 4, "fp16", {**SMALL, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_K": 32}),
        (20, 8, 32, 64, 2, "fp32", None),
        # N=40: GEMM 1's last tile of 32 of its 80 rows holds 16 (the rest wrap)
        (13, 6, 40, 48, 3, "fp32", {**SMALL, "BLOCK_SIZE_N": 32}),
    ],
)
def test_it_matches_the_reference(M, E, N, H, top_k, dtype, config):
    x, w1, w2, topk_weights, topk_ids = _layer(M, E, N, H, top_k, dtype)

    out = _poisoned_run(x, w1, w2, topk_weights, topk_ids, config=config, dtype=dtype)

    ref = moe_reference(x, w1, w2, topk_weights, topk_ids)
    assert out.dtype == x.dtype and out.shape == (M, H)
    assert _relative_error(out, ref) < TOLERANCE[dtype]


@settings(max_examples=6, deadline=None)
@given(
    M=st.integers(1, 40),
    E=st.integers(2, 12),
    top_k=st.integers(1, 8),
    block_m=st.sampled_from([16, 32]),
    seed=st.integers(0, 1000),
)
def test_it_matches_the_reference_on_random_shapes(M, E, top_k, block_m, seed):
    top_k = min(top_k, E)
    x, w1, w2, topk_weights, topk_ids = _layer(M, E, 24, 40, top_k, "fp32", seed)
    config = {**SMALL, "BLOCK_SIZE_M": block_m}

    out = _poisoned_run(x, w1, w2, topk_weights, topk_ids, config=config, dtype="fp32")

    assert _relative_error(out, moe_reference(x, w1, w2, topk_weights, topk_ids)) < 1e-5


def test_it_handles_experts_with_no_tokens():
    x, w1, w2, topk_weights, _ = _layer(3, 32, 16, 32, 2, "fp32")
    # every token goes to experts 5 and 30; the other 30 experts get nothing
    topk_ids = torch.tensor([[5, 30]] * 3, dtype=torch.int32, device=DEVICE)

    out = _poisoned_run(x, w1, w2, topk_weights, topk_ids, config=SMALL, dtype="fp32")

    assert _relative_error(out, moe_reference(x, w1, w2, topk_weights, topk_ids)) < 1e-5


@pytest.mark.parametrize(("M", "top_k"), [(150, 8), (400, 3)])
def test_it_matches_the_reference_past_one_sort_chunk(M, top_k):
    """More than PAIR_CHUNK pairs: sort-and-pad counts and places over several programs."""
    assert M * top_k > ops.PAIR_CHUNK
    x, w1, w2, topk_weights, topk_ids = _layer(M, 8, 16, 32, top_k, "fp32", seed=M)

    out = _poisoned_run(x, w1, w2, topk_weights, topk_ids, config=SMALL, dtype="fp32")

    assert _relative_error(out, moe_reference(x, w1, w2, topk_weights, topk_ids)) < 1e-5


def test_gemm_2_runs_its_own_config():
    x, w1, w2, topk_weights, topk_ids = _layer(37, 8, 48, 64, 4, "fp16", seed=6)
    # K = N = 48 is no multiple of 32: the masked K loop of GEMM 2 only
    down = {**SMALL, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 4, "num_stages": 2}

    out = _poisoned_run(
        x, w1, w2, topk_weights, topk_ids, config=SMALL, down_config=down, dtype="fp16"
    )

    ref = moe_reference(x, w1, w2, topk_weights, topk_ids)
    assert _relative_error(out, ref) < TOLERANCE["fp16"]


def test_gemm_2_must_share_block_size_m():
    x, w1, w2, topk_weights, topk_ids = _layer(4, 4, 16, 32, 2, "fp32")
    down = {**SMALL, "BLOCK_SIZE_M": 32}

    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        fm.fused_moe(
            x, w1, w2, topk_weights, topk_ids, config=SMALL, down_config=down, dtype="fp32"
        )


@pytest.mark.parametrize(
    ("block_shape", "block_n"),
    # a tile's columns within one weight-scale block (block_n 16), across two or four of them
    [(None, 32), ([16, 32], 16), ([16, 32], 32), ([16, 32], 64)],
)
def test_fp8_gemm_applies_the_scales_like_the_reference(block_shape, block_n):
    """The scaled grouped GEMM on operands PyTorch quantised (see the module docstring)."""
    M, E, N, H, top_k = 9, 5, 48, 64, 2
    x, w1, _, topk_weights, topk_ids = _layer(M, E, N, H, top_k, "fp32", seed=3)
    if block_shape:
        w1q, w1_scale = quantize_fp8_blocks(w1, block_shape)
        xq, x_scale = quantize_fp8_token_groups(x, block_shape[1])
        x_dequant = xq.double() * x_scale.double().repeat_interleave(block_shape[1], dim=1)
        scales = 2
    else:
        w1q, w1_scale = quantize_fp8_per_expert(w1)
        x_scale = (x.abs().amax() / 448).reshape(1)
        xq = (x / x_scale).clamp(-448, 448).to(ops.FP8_DTYPE)
        x_dequant = xq.double() * x_scale.double()
        scales = 1
    config = ops.full_config({**SMALL, "BLOCK_SIZE_N": block_n})
    blocks = ops.sort_and_pad(topk_ids, E, config["BLOCK_SIZE_M"])
    h = torch.full((M * top_k, 2 * N), float("nan"), dtype=torch.float32, device=DEVICE)

    fm.expert_gemm(xq, w1q, h, blocks, config, scales, block_shape, x_scale, w1_scale, top_k, None)

    for pair, expert in enumerate(topk_ids.reshape(-1).tolist()):
        if block_shape:
            w = (
                w1q[expert].double()
                * w1_scale[expert]
                .double()
                .repeat_interleave(block_shape[0], 0)
                .repeat_interleave(block_shape[1], 1)[: 2 * N, :H]
            )
        else:
            w = w1q[expert].double() * float(w1_scale[expert])
        expected = x_dequant[pair // top_k] @ w.T
        assert torch.allclose(h[pair].double(), expected, rtol=1e-5, atol=1e-5)


def test_per_tensor_fp8_layer_matches_the_reference():
    M, E, N, H, top_k = 19, 6, 32, 64, 4
    x, w1, w2, topk_weights, topk_ids = _layer(M, E, N, H, top_k, "fp16", seed=5)
    w1q, w1_scale = quantize_fp8_per_expert(w1.float())
    w2q, w2_scale = quantize_fp8_per_expert(w2.float())
    kwargs = {"dtype": "fp8_w8a8", "w1_scale": w1_scale, "w2_scale": w2_scale}

    out = _poisoned_run(x, w1q, w2q, topk_weights, topk_ids, config=SMALL, **kwargs)

    ref = moe_reference(x, w1q, w2q, topk_weights, topk_ids, **kwargs)
    # fp16 h and fp8 roundings of the intermediate that land on the other side of a tie
    assert _relative_error(out, ref) < 2e-2


def test_default_config_follows_the_engines_rules():
    small = fm.default_config(64, 256, 256, 6144, 8)
    large = fm.default_config(1024, 256, 256, 6144, 8)
    block = fm.default_config(1024, 256, 256, 6144, 8, "fp8_w8a8", [128, 128])

    assert (small["BLOCK_SIZE_M"], small["BLOCK_SIZE_N"], small["BLOCK_SIZE_K"]) == (16, 32, 64)
    assert (large["BLOCK_SIZE_M"], large["BLOCK_SIZE_K"], large["GROUP_SIZE_M"]) == (64, 32, 8)
    assert (block["BLOCK_SIZE_N"], block["BLOCK_SIZE_K"], block["GROUP_SIZE_M"]) == (128, 128, 32)
    assert all(set(c) == set(REQUIRED_FIELDS) for c in (small, large, block))


def test_it_rejects_operands_that_disagree():
    x, w1, w2, topk_weights, topk_ids = _layer(4, 4, 16, 32, 2, "fp32")

    with pytest.raises(ValueError, match="shapes disagree"):
        fm.fused_moe(x, w1, w2[:, :, :8], topk_weights, topk_ids, dtype="fp32")
    with pytest.raises(ValueError, match="needs x, w1 and w2"):
        fm.fused_moe(x, w1, w2, topk_weights, topk_ids, dtype="bf16")
    with pytest.raises(ValueError, match="must divide the scale block"):
        fm._check_config(ops.full_config({**SMALL, "BLOCK_SIZE_K": 256}), "fp8_w8a8", [128, 128])


WIDE = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "block_shape", "config"),
    [
        ("bf16", None, None),
        ("fp8_w8a8", None, None),
        ("fp8_w8a8", [128, 128], None),
        # a tile two weight-scale blocks wide
        ("fp8_w8a8", [128, 128], {**WIDE, "num_warps": 8}),
    ],
)
def test_it_matches_the_reference_on_the_gpu(dtype, block_shape, config):
    from tuning.search import KernelShape
    from tuning.timing import make_weights, random_routing

    shape = KernelShape(64, 256, 1024, 8, dtype, tuple(block_shape) if block_shape else None)
    weights = make_weights(shape)
    kwargs = weights.layer_kwargs(shape)
    for M in (1, 33, 300):
        x = torch.randn((M, shape.H), device="cuda", dtype=torch.bfloat16)
        topk_weights, topk_ids = random_routing(1, M, shape.E, shape.top_k, seed=M)

        out = _poisoned_run(
            x, weights.w1, weights.w2, topk_weights[0], topk_ids[0], config=config, **kwargs
        )

        ref = moe_reference(x, weights.w1, weights.w2, topk_weights[0], topk_ids[0], **kwargs)
        assert _relative_error(out, ref) < (1e-2 if dtype == "bf16" else 3e-2)


KERNELS = ("_activation_kernel", "_expert_gemm_kernel", "_sum_topk_kernel", "_expert_blocks_kernel")


def _cache_keys_hashing_first(first: str) -> dict:
    """The kernels' Triton cache keys, computed in a fresh process, first's before the others'."""
    code = (
        "import importlib, json, sys;"
        "mods = [importlib.import_module(m) for m in ('tuning.moe_ops', 'tuning.fused_moe')];"
        "kernel = lambda n: next(getattr(m, n) for m in mods if hasattr(m, n));"
        "print(json.dumps({n: kernel(n).cache_key for n in sys.argv[1:]}))"
    )
    order = [first] + [name for name in KERNELS if name != first]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code, *order], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_a_kernels_cache_key_does_not_depend_on_which_kernel_a_process_hashes_first():
    """A compile process and the timing process hash the kernels in different orders (the
    first dtype tuned, the first kernel launched); their Triton cache keys must agree, or the
    compile processes' kernels never serve a launch."""
    activation_first = _cache_keys_hashing_first("_activation_kernel")
    gemm_first = _cache_keys_hashing_first("_expert_gemm_kernel")

    assert activation_first == gemm_first
