"""The fused Mixture-of-Experts layer as Triton kernels: moeops' builtin kernel.

A tune times the engine's own kernel where the engine is installed (tuning.backends); this one
is the fallback and the CPU tests' kernel. Its launch is the engines' fused_moe_kernel without
swap-AB or BLOCK_SIZE_M 8 (one grid over the padded pairs), and its default config is SGLang's
older rule (default_config below).

x [M, H] routed to top_k of E experts: sort the M·top_k token–expert pairs by expert and pad each
expert's segment to BLOCK_SIZE_M (tuning.moe_ops.sort_and_pad); grouped GEMM 1 gathers x rows and
multiplies by w1 [E, 2N, H] (gate and up); silu(gate)·up; grouped GEMM 2 multiplies by w2 [E, H, N]
and the router weight and scatters each pair to its own row; a last kernel sums the top_k rows of
every token.

The structure and the meaning of every config key (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps,
num_stages) follow the engines' fused-MoE kernel, so that a config tuned on this kernel is a config
for SGLang's and vLLM's. So do the launches and the arithmetic that decide which tile is fastest,
because the config files are for the engines: a variant that is faster here but picks tiles the
engines run slower does not belong here (docs/decisions.md, "the engines' layout"). GEMM 2 may
have its own config (SGLang's `_down` files), which shares BLOCK_SIZE_M with GEMM 1's because both
GEMMs read one sort-and-pad.

dtypes: "bf16" (also "fp16" and "fp32", mainly for the CPU interpreter), and "fp8_w8a8": float8
e4m3 weights and activations, either with per-expert weight scales and one dynamic scale per
activation tensor, or with block_shape [bn, bk] weight scales and dynamic activation scales per
token and group of bk columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tuning.config_files import REQUIRED_FIELDS
from tuning.moe_ops import (
    FP8_DTYPE,
    SCALES_BLOCK,
    SCALES_TENSOR,
    full_config,
    quantize_activations,
    scales_mode,
    silu_and_mul,
    sort_and_pad,
)

UNQUANTIZED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@triton.jit(do_not_specialize=["num_m_blocks", "group_size_m"])
def _expert_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_pair_ids_ptr,
    block_experts_ptr,
    block_rows_ptr,
    num_padded_ptr,
    N,
    K,
    num_m_blocks,
    group_size_m,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    PAIRS_PER_A_ROW: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    SCALES: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """C[pair] = A[pair // PAIRS_PER_A_ROW] @ B[expert]ᵀ on one BLOCK_SIZE_M × BLOCK_SIZE_N tile."""
    pid_m, pid_n = _grouped_tile(
        tl.program_id(0), num_m_blocks, tl.cdiv(N, BLOCK_SIZE_N), group_size_m
    )
    if pid_m * BLOCK_SIZE_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_SIZE_M)
    row_mask = offs_m < tl.load(block_rows_ptr + pid_m)
    pair_ids = tl.load(sorted_pair_ids_ptr + pid_m * BLOCK_SIZE_M + offs_m, mask=row_mask, other=0)
    a_rows = pair_ids // PAIRS_PER_A_ROW
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    # columns past N wrap onto real ones so that B loads need no mask; the store drops them
    b_cols = offs_n % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + b_cols[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_SIZE_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_mask = offs_k < K - k_start
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)
        if SCALES == 2:
            k_group = k_start // GROUP_K
            a_s = tl.load(
                a_scale_ptr + a_rows * stride_asm + k_group * stride_ask, mask=row_mask, other=0.0
            )
            b_s = tl.load(
                b_scale_ptr
                + expert * stride_bse
                + (b_cols // GROUP_N) * stride_bsn
                + k_group * stride_bsk
            )
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if SCALES == 1:
        acc = acc * tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert)
    if MUL_ROUTED_WEIGHT:
        weights = tl.load(topk_weights_ptr + pair_ids, mask=row_mask, other=0.0)
        acc = acc * weights.to(tl.float32)[:, None]
    c_ptrs = c_ptr + pair_ids[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[:, None] & (offs_n < N)[None, :])


@triton.jit
def _sum_topk_kernel(
    y_ptr,
    out_ptr,
    H,
    stride_ym,
    stride_yk,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out[token] = Σ_slot y[token, slot] in float32."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        y = tl.load(y_ptr + token * stride_ym + slot * stride_yk + cols, mask=mask, other=0.0)
        acc += y.to(tl.float32)
    tl.store(out_ptr + token * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_tile(pid, num_pid_m, num_pid_n, group_size_m):
    """(pid_m, pid_n) of a program: group_size_m M-blocks sweep the N tiles together (L2 reuse)."""
    tiles_per_group = group_size_m * num_pid_n
    first_m = (pid // tiles_per_group) * group_size_m
    rows_in_group = tl.minimum(num_pid_m - first_m, group_size_m)
    pid_m = first_m + (pid % tiles_per_group) % rows_in_group
    pid_n = (pid % tiles_per_group) // rows_in_group
    return pid_m, pid_n


def default_config(
    M: int,
    E: int,
    N: int,
    H: int,
    top_k: int,
    dtype: str = "bf16",
    block_shape: list[int] | None = None,
) -> dict[str, int]:
    """The config the engines fall back to when no tuned file exists (SGLang's rules).

    M tokens, E experts, N intermediate per shard, H hidden; N, H and top_k do not change it.
    """
    if dtype == "fp8_w8a8" and block_shape:
        return full_config(
            {
                "BLOCK_SIZE_M": 64,
                "BLOCK_SIZE_N": block_shape[0],
                "BLOCK_SIZE_K": block_shape[1],
                "GROUP_SIZE_M": 32,
                "num_warps": 4,
                "num_stages": 3,
            }
        )
    if dtype == "fp8_w8a8":
        if M <= E:
            return full_config(
                {
                    "BLOCK_SIZE_M": 64,
                    "BLOCK_SIZE_N": 128,
                    "BLOCK_SIZE_K": 128,
                    "GROUP_SIZE_M": 1,
                    "num_stages": 4,
                }
            )
        return full_config(
            {
                "BLOCK_SIZE_M": 128,
                "BLOCK_SIZE_N": 256,
                "BLOCK_SIZE_K": 128,
                "GROUP_SIZE_M": 32,
                "num_warps": 8,
                "num_stages": 4,
            }
        )
    if M <= E:
        return full_config(
            {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
        )
    return full_config(
        {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    )


def fused_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: dict | None = None,
    down_config: dict | None = None,
    dtype: str = "bf16",
    block_shape: list[int] | None = None,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One MoE layer: out [M, H] = Σ_slot weight · w2[e] · (silu(w1[e]_gate · x) · w1[e]_up · x).

    x [M, H]; w1 [E, 2N, H] (gate rows then up rows); w2 [E, H, N]; topk_weights [M, top_k]
    float; topk_ids [M, top_k] int in [0, E). config: one entry of an engine config file
    (default_config when None); down_config: GEMM 2's entry (SGLang's `_down` file; config when
    None), with config's BLOCK_SIZE_M. dtype "bf16"/"fp16"/"fp32": x, w1 and w2 all of that
    dtype. dtype "fp8_w8a8": w1, w2 float8_e4m3fn and x bf16/fp16, quantised here; without
    block_shape w1_scale and w2_scale are [E] (one scale per expert); with block_shape [bn, bk]
    they are [E, ⌈rows/bn⌉, ⌈cols/bk⌉]. out, when given, receives the result (shape [M, H],
    x's dtype).
    """
    M, H = x.shape
    E, two_n, _ = w1.shape
    N = two_n // 2
    top_k = topk_ids.shape[1]
    _check_operands(x, w1, w2, topk_weights, topk_ids, dtype, block_shape, w1_scale, w2_scale)
    config = full_config(config or default_config(M, E, N, H, top_k, dtype, block_shape))
    down_config = config if down_config is None else full_config(down_config)
    for entry in (config, down_config):
        _check_config(entry, dtype, block_shape)
    if down_config["BLOCK_SIZE_M"] != config["BLOCK_SIZE_M"]:
        raise ValueError("down_config must keep config's BLOCK_SIZE_M: both GEMMs share one sort")
    scales = scales_mode(dtype, block_shape)
    if scales == SCALES_TENSOR:
        w1_scale, w2_scale = w1_scale.reshape(-1).float(), w2_scale.reshape(-1).float()
    if out is None:
        out = torch.empty_like(x)
    if M == 0:
        return out
    blocks = sort_and_pad(topk_ids, E, config["BLOCK_SIZE_M"])
    num_pairs = M * top_k
    a1, a1_scale = quantize_activations(x, scales, block_shape)
    h = torch.empty((num_pairs, two_n), dtype=x.dtype, device=x.device)
    expert_gemm(a1, w1, h, blocks, config, scales, block_shape, a1_scale, w1_scale, top_k, None)
    a2, a2_scale = silu_and_mul(h, scales, block_shape)
    y = (
        out.view(M, 1, H)
        if top_k == 1
        else torch.empty((M, top_k, H), dtype=x.dtype, device=x.device)
    )
    expert_gemm(
        a2,
        w2,
        y.view(num_pairs, H),
        blocks,
        down_config,
        scales,
        block_shape,
        a2_scale,
        w2_scale,
        1,
        topk_weights.reshape(-1),
    )
    if top_k > 1:
        block_h = min(1024, triton.next_power_of_2(H))
        _sum_topk_kernel[(M, triton.cdiv(H, block_h))](
            y, out, H, y.stride(0), y.stride(1), out.stride(0), TOP_K=top_k, BLOCK_H=block_h
        )
    return out


def expert_gemm(
    a, b, c, blocks, config, scales, block_shape, a_scale, b_scale, pairs_per_a_row, topk_weights
):
    """Launch the grouped GEMM c[pair] = a[pair // pairs_per_a_row] @ b[expert]ᵀ."""
    _, n, k = b.shape
    block_n, block_k = config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    group_n, group_k = block_shape if scales == SCALES_BLOCK else (1, 1)
    a_scale_strides = a_scale.stride() if scales == SCALES_BLOCK else (0, 0)
    b_scale_strides = b_scale.stride() if scales == SCALES_BLOCK else (0, 0, 0)
    grid = (blocks.num_m_blocks * triton.cdiv(n, block_n),)
    _expert_gemm_kernel[grid](
        a,
        b,
        c,
        a if a_scale is None else a_scale,
        b if b_scale is None else b_scale,
        c if topk_weights is None else topk_weights,
        blocks.sorted_pair_ids,
        blocks.block_experts,
        blocks.block_rows,
        blocks.num_padded,
        n,
        k,
        blocks.num_m_blocks,
        config["GROUP_SIZE_M"],
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        *a_scale_strides,
        *b_scale_strides,
        PAIRS_PER_A_ROW=pairs_per_a_row,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        SCALES=scales,
        GROUP_N=group_n,
        GROUP_K=group_k,
        EVEN_K=k % block_k == 0,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=block_n,
        BLOCK_SIZE_K=block_k,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def _check_config(config, dtype, block_shape):
    missing = [key for key in REQUIRED_FIELDS if key not in config]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)}")
    if min(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]) < 16:
        raise ValueError("BLOCK_SIZE_M/N/K must be at least 16 (tl.dot)")
    if dtype == "fp8_w8a8" and block_shape and block_shape[1] % config["BLOCK_SIZE_K"]:
        raise ValueError(
            f"BLOCK_SIZE_K {config['BLOCK_SIZE_K']} must divide the scale block {block_shape[1]}"
        )


def _check_operands(x, w1, w2, topk_weights, topk_ids, dtype, block_shape, w1_scale, w2_scale):
    M, H = x.shape
    E, two_n, h1 = w1.shape
    if h1 != H or two_n % 2 or tuple(w2.shape) != (E, H, two_n // 2):
        raise ValueError(
            f"shapes disagree: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != M:
        raise ValueError("topk_ids and topk_weights must both be [M, top_k]")
    if not (x.is_contiguous() and w1.is_contiguous() and w2.is_contiguous()):
        raise ValueError("x, w1 and w2 must be contiguous")
    if dtype in UNQUANTIZED_DTYPES:
        want = UNQUANTIZED_DTYPES[dtype]
        if {x.dtype, w1.dtype, w2.dtype} != {want}:
            raise ValueError(f"dtype {dtype!r} needs x, w1 and w2 in {want}")
        return
    if dtype != "fp8_w8a8":
        raise ValueError(f"unknown dtype {dtype!r}")
    if w1.dtype != FP8_DTYPE or w2.dtype != FP8_DTYPE or w1_scale is None or w2_scale is None:
        raise ValueError("fp8_w8a8 needs float8_e4m3fn w1, w2 and their scales")
    if block_shape:
        bn, bk = block_shape
        for w, s in ((w1, w1_scale), (w2, w2_scale)):
            want = (E, triton.cdiv(w.shape[1], bn), triton.cdiv(w.shape[2], bk))
            if tuple(s.shape) != want:
                raise ValueError(f"block scales must be {want}, got {tuple(s.shape)}")
    elif w1_scale.numel() != E or w2_scale.numel() != E:
        raise ValueError("per-tensor fp8 needs one scale per expert, [E]")
