"""The parts of a fused-MoE layer every backend launches around its expert GEMMs.

Each backend (tuning.backends) runs its engine's own grouped-GEMM kernel, and around it the
steps the engines share: sort_and_pad groups the M·top_k token–expert pairs by expert, padded to
BLOCK_SIZE_M; silu_and_mul and quantize_activations make the GEMMs' inputs (fp8 with their scales
when the weights are fp8); full_config fills a config entry with Triton's launch defaults.

scales, the fp8 scheme of a layer (scales_mode): SCALES_NONE (no fp8), SCALES_TENSOR (one dynamic
scale per activation tensor), SCALES_BLOCK (one per token and group of block_shape[1] columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tuning.config_files import TRITON_LAUNCH_DEFAULTS

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
_FP8_MAX = tl.constexpr(FP8_MAX)
SCALES_NONE, SCALES_TENSOR, SCALES_BLOCK = 0, 1, 2
# Pairs one program of sort-and-pad counts and places; up to one chunk, one program does it all.
PAIR_CHUNK = 1024
# Chunk rows the single program of sort-and-pad sums at a time (a [16, experts] tile).
_CHUNK_ROWS = 16


@triton.jit(do_not_specialize=["num_pairs"])
def _count_experts_kernel(
    topk_ids_ptr,
    chunk_counts_ptr,
    num_pairs,
    EXPERT_BINS: tl.constexpr,
    PAIR_CHUNK: tl.constexpr,
):
    """chunk_counts[chunk, expert] = pairs of this program's chunk routed to expert."""
    chunk = tl.program_id(0)
    counts = _chunk_histogram(topk_ids_ptr, chunk, num_pairs, EXPERT_BINS, PAIR_CHUNK)
    tl.store(chunk_counts_ptr + chunk * EXPERT_BINS + tl.arange(0, EXPERT_BINS), counts)


@triton.jit(do_not_specialize=["num_pairs", "num_chunks"])
def _expert_blocks_kernel(
    topk_ids_ptr,
    chunk_counts_ptr,
    chunk_cursor_ptr,
    sorted_pair_ids_ptr,
    block_experts_ptr,
    block_rows_ptr,
    num_padded_ptr,
    num_pairs,
    num_chunks,
    num_experts,
    BLOCK_SIZE_M: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    PAIR_CHUNK: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
    SINGLE_CHUNK: tl.constexpr,
):
    """One program: expert totals, padded segments, each M-block's expert and rows, and each
    chunk's first slot per expert (chunk_cursor). SINGLE_CHUNK: also counts and places the pairs."""
    experts = tl.arange(0, EXPERT_BINS)
    if SINGLE_CHUNK:
        counts = _chunk_histogram(topk_ids_ptr, 0, num_pairs, EXPERT_BINS, PAIR_CHUNK)
    else:
        counts = tl.zeros((EXPERT_BINS,), dtype=tl.int32)
        for first in range(0, num_chunks, CHUNK_ROWS):
            tile = _chunk_counts_tile(chunk_counts_ptr, first, num_chunks, EXPERT_BINS, CHUNK_ROWS)
            counts += tl.sum(tile, 0)
    counts = tl.where(experts < num_experts, counts, 0)
    num_blocks = tl.cdiv(counts, BLOCK_SIZE_M)
    starts = tl.cumsum(num_blocks, 0) - num_blocks
    tl.store(num_padded_ptr, tl.sum(num_blocks, 0) * BLOCK_SIZE_M)
    for j in range(0, tl.max(num_blocks, 0)):
        owned = j < num_blocks
        rows = tl.minimum(counts - j * BLOCK_SIZE_M, BLOCK_SIZE_M)
        tl.store(block_experts_ptr + starts + j, experts, mask=owned)
        tl.store(block_rows_ptr + starts + j, rows, mask=owned)
    # a chunk's pairs of an expert follow those of the earlier chunks in the expert's segment
    cursor = starts * BLOCK_SIZE_M
    if SINGLE_CHUNK:
        tl.store(chunk_cursor_ptr + experts, cursor)
        # the placing atomics below read cursors other threads of this program stored
        tl.debug_barrier()
        _place_chunk(topk_ids_ptr, chunk_cursor_ptr, sorted_pair_ids_ptr, 0, num_pairs, PAIR_CHUNK)
    else:
        for first in range(0, num_chunks, CHUNK_ROWS):
            tile = _chunk_counts_tile(chunk_counts_ptr, first, num_chunks, EXPERT_BINS, CHUNK_ROWS)
            chunks = first + tl.arange(0, CHUNK_ROWS)
            tl.store(
                chunk_cursor_ptr + chunks[:, None] * EXPERT_BINS + experts[None, :],
                tl.cumsum(tile, 0) - tile + cursor[None, :],
                mask=chunks[:, None] < num_chunks,
            )
            cursor += tl.sum(tile, 0)


@triton.jit(do_not_specialize=["num_pairs"])
def _place_pairs_kernel(
    topk_ids_ptr,
    chunk_cursor_ptr,
    sorted_pair_ids_ptr,
    num_pairs,
    EXPERT_BINS: tl.constexpr,
    PAIR_CHUNK: tl.constexpr,
):
    """Write each pair of this program's chunk into the next free slot of its expert's segment."""
    chunk = tl.program_id(0)
    _place_chunk(
        topk_ids_ptr,
        chunk_cursor_ptr + chunk * EXPERT_BINS,
        sorted_pair_ids_ptr,
        chunk,
        num_pairs,
        PAIR_CHUNK,
    )


@triton.jit
def _chunk_histogram(topk_ids_ptr, chunk, num_pairs, EXPERT_BINS, PAIR_CHUNK):
    """Per-expert pair counts [EXPERT_BINS] of one chunk of pairs."""
    offs = chunk * PAIR_CHUNK + tl.arange(0, PAIR_CHUNK)
    # the tail of the last chunk lands in a spare bin past the experts
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=EXPERT_BINS - 1)
    return tl.histogram(ids.to(tl.int32), EXPERT_BINS)


@triton.jit
def _chunk_counts_tile(chunk_counts_ptr, first, num_chunks, EXPERT_BINS, CHUNK_ROWS):
    """Rows first … first + CHUNK_ROWS − 1 of chunk_counts (zeros past the last chunk)."""
    chunks = first + tl.arange(0, CHUNK_ROWS)
    experts = tl.arange(0, EXPERT_BINS)
    return tl.load(
        chunk_counts_ptr + chunks[:, None] * EXPERT_BINS + experts[None, :],
        mask=chunks[:, None] < num_chunks,
        other=0,
    )


@triton.jit
def _place_chunk(topk_ids_ptr, cursor_ptr, sorted_pair_ids_ptr, chunk, num_pairs, PAIR_CHUNK):
    """sorted_pair_ids[cursor[expert]++] = pair, for every pair of one chunk."""
    offs = chunk * PAIR_CHUNK + tl.arange(0, PAIR_CHUNK)
    mask = offs < num_pairs
    ids = tl.load(topk_ids_ptr + offs, mask=mask, other=0)
    slots = tl.atomic_add(cursor_ptr + ids, 1, mask=mask, sem="relaxed")
    tl.store(sorted_pair_ids_ptr + slots, offs, mask=mask)


@triton.jit
def _activation_kernel(
    in_ptr,
    out_ptr,
    scale_ptr,
    n_cols,
    stride_in,
    stride_out,
    stride_scale,
    SILU_AND_MUL: tl.constexpr,
    QUANTIZE: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """out[row] = silu(in[row, :n]) · in[row, n:] (or in[row]), fp8 with one scale per group."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = groups[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    mask = cols < n_cols
    in_row = in_ptr + row * stride_in
    value = tl.load(in_row + cols, mask=mask, other=0.0).to(tl.float32)
    if SILU_AND_MUL:
        up = tl.load(in_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        value = value * tl.sigmoid(value) * up
    if QUANTIZE:
        scale = tl.maximum(tl.max(tl.abs(value), 1), 1e-10) / _FP8_MAX
        value = tl.clamp(value / scale[:, None], -_FP8_MAX, _FP8_MAX)
        tl.store(scale_ptr + row * stride_scale + groups, scale, mask=groups * GROUP_SIZE < n_cols)
    tl.store(out_ptr + row * stride_out + cols, value.to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class ExpertBlocks:
    """Token–expert pairs sorted by expert, each expert's segment padded to block_size_m.

    A pair is token·top_k + slot. sorted_pair_ids [max_padded] int32 (padding slots hold stale
    values; block_rows says how many leading slots of a block are real); block_experts and
    block_rows [num_m_blocks] int32, valid for blocks below num_padded; num_padded [1] int32 on
    the device, so that the launch sizes never wait for the host (graph capture).
    """

    sorted_pair_ids: torch.Tensor
    block_experts: torch.Tensor
    block_rows: torch.Tensor
    num_padded: torch.Tensor
    num_m_blocks: int
    block_size_m: int


def sort_and_pad(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size_m: int,
    *,
    pair_chunk: int = PAIR_CHUNK,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> ExpertBlocks:
    """Group the M·top_k pairs of topk_ids [M, top_k] (ids in [0, E)) by expert, padded to blocks.

    No host synchronisation. Up to pair_chunk pairs (a power of two), one launch; beyond, three:
    per-chunk expert counts over many programs, one program for the prefix sums, and the
    placing over many programs. Buffers are sized for the worst case,
    M·top_k + min(M·top_k, E)·(block_size_m − 1) slots; out = (sorted_pair_ids, block_experts,
    num_padded) are the caller's buffers instead, at least that large (the engines' own sizes).
    """
    ids = topk_ids.reshape(-1)
    num_pairs = ids.numel()
    max_padded = num_pairs + min(num_pairs, num_experts) * (block_size_m - 1)
    num_chunks = triton.cdiv(num_pairs, pair_chunk)
    bins = triton.next_power_of_2(num_experts + 1)
    device = topk_ids.device
    if out is None:
        num_m_blocks = triton.cdiv(max_padded, block_size_m)
        sorted_pair_ids = torch.empty(num_m_blocks * block_size_m, dtype=torch.int32, device=device)
        block_experts = torch.empty(num_m_blocks, dtype=torch.int32, device=device)
        num_padded = torch.empty(1, dtype=torch.int32, device=device)
    else:
        sorted_pair_ids, block_experts, num_padded = out
        num_m_blocks = block_experts.numel()
        if sorted_pair_ids.numel() < max_padded or num_m_blocks * block_size_m < max_padded:
            raise ValueError(f"the buffers hold fewer than the {max_padded} slots needed")
    block_rows = torch.empty(num_m_blocks, dtype=torch.int32, device=device)
    chunk_cursor = torch.empty((num_chunks, bins), dtype=torch.int32, device=device)
    single = num_chunks == 1
    chunk_counts = chunk_cursor if single else torch.empty_like(chunk_cursor)
    if not single:
        _count_experts_kernel[(num_chunks,)](
            ids, chunk_counts, num_pairs, EXPERT_BINS=bins, PAIR_CHUNK=pair_chunk, num_warps=4
        )
    _expert_blocks_kernel[(1,)](
        ids,
        chunk_counts,
        chunk_cursor,
        sorted_pair_ids,
        block_experts,
        block_rows,
        num_padded,
        num_pairs,
        num_chunks,
        num_experts,
        BLOCK_SIZE_M=block_size_m,
        EXPERT_BINS=bins,
        PAIR_CHUNK=pair_chunk,
        CHUNK_ROWS=_CHUNK_ROWS,
        SINGLE_CHUNK=single,
        num_warps=8,
    )
    if not single:
        _place_pairs_kernel[(num_chunks,)](
            ids,
            chunk_cursor,
            sorted_pair_ids,
            num_pairs,
            EXPERT_BINS=bins,
            PAIR_CHUNK=pair_chunk,
            num_warps=4,
        )
    return ExpertBlocks(
        sorted_pair_ids, block_experts, block_rows, num_padded, num_m_blocks, block_size_m
    )


def silu_and_mul(h, scales, block_shape):
    """silu(h[:, :N]) · h[:, N:] for h [P, 2N]; fp8 and its scales when scales say so."""
    rows, two_n = h.shape
    n = two_n // 2
    if scales == SCALES_BLOCK:
        group = block_shape[1]
        act = torch.empty((rows, n), dtype=FP8_DTYPE, device=h.device)
        act_scale = torch.empty((rows, triton.cdiv(n, group)), dtype=torch.float32, device=h.device)
        launch_activation(h, act, act_scale, n, silu_and_mul=True, group=group)
        return act, act_scale
    act = torch.empty((rows, n), dtype=h.dtype, device=h.device)
    launch_activation(h, act, None, n, silu_and_mul=True, group=None)
    if scales == SCALES_TENSOR:
        return quantize_per_tensor(act)
    return act, None


def quantize_activations(x, scales, block_shape):
    """x as the first GEMM reads it: itself, or fp8 and its scale(s)."""
    if scales == SCALES_TENSOR:
        return quantize_per_tensor(x)
    if scales == SCALES_BLOCK:
        rows, cols = x.shape
        group = block_shape[1]
        xq = torch.empty((rows, cols), dtype=FP8_DTYPE, device=x.device)
        x_scale = torch.empty(
            (rows, triton.cdiv(cols, group)), dtype=torch.float32, device=x.device
        )
        launch_activation(x, xq, x_scale, cols, silu_and_mul=False, group=group)
        return xq, x_scale
    return x, None


def launch_activation(src, dst, scale, n_cols, *, silu_and_mul, group):
    """Row-wise activation kernel over n_cols output columns; fp8 with group scales if group."""
    group_size = group or min(128, triton.next_power_of_2(n_cols))
    groups = max(1, min(8, triton.next_power_of_2(triton.cdiv(n_cols, group_size))))
    grid = (src.shape[0], triton.cdiv(n_cols, group_size * groups))
    _activation_kernel[grid](
        src,
        dst,
        dst if scale is None else scale,
        n_cols,
        src.stride(0),
        dst.stride(0),
        0 if scale is None else scale.stride(0),
        SILU_AND_MUL=silu_and_mul,
        QUANTIZE=group is not None,
        GROUP_SIZE=group_size,
        GROUPS=groups,
    )


def quantize_per_tensor(t):
    """t as float8 e4m3 with one dynamic scale [1] (float32) for the whole tensor."""
    scale = (t.abs().amax().float().clamp(min=1e-10) / FP8_MAX).reshape(1)
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def scales_mode(dtype, block_shape):
    if dtype == "fp8_w8a8":
        return SCALES_BLOCK if block_shape else SCALES_TENSOR
    return SCALES_NONE


def full_config(config: dict) -> dict[str, int]:
    """A config entry with Triton's launch defaults (4 warps, 3 stages) filled in."""
    return {**TRITON_LAUNCH_DEFAULTS, **{k: int(v) for k, v in config.items()}}
