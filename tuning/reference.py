"""Plain PyTorch MoE layer: the specification the Triton kernel is tested against.

Also the fp8 quantisation rules (shared by the reference and the test data), and a baseline built
on `torch._grouped_mm` that the bench compares the kernel with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def moe_reference(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    dtype: str = "bf16",
    block_shape: list[int] | None = None,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """out [M, H] = Σ_slot topk_weights · w2[e] @ (silu(w1[e, :N] @ x) · (w1[e, N:] @ x)).

    Same operands as tuning.fused_moe.fused_moe. Computes in compute_dtype. For "fp8_w8a8" the
    weights are dequantised with their scales and both GEMM inputs go through the kernel's
    dynamic fp8 quantisation (one scale per tensor, or per token and block_shape[1] columns).
    """
    M, H = x.shape
    E, two_n, _ = w1.shape
    N = two_n // 2
    top_k = topk_ids.shape[1]
    fp8 = dtype == "fp8_w8a8"
    a = _fake_quantize(x, block_shape) if fp8 else x
    a = a.to(compute_dtype)
    act = torch.zeros((M, top_k, N), dtype=compute_dtype, device=x.device)
    routed = [int(e) for e in torch.unique(topk_ids)]
    for e in routed:
        tokens, slots = (topk_ids == e).nonzero(as_tuple=True)
        h = a[tokens] @ _expert_weight(w1, w1_scale, e, block_shape, fp8, compute_dtype).T
        act[tokens, slots] = F.silu(h[:, :N]) * h[:, N:]
    if fp8:
        act = _fake_quantize(act.reshape(M * top_k, N), block_shape).reshape(M, top_k, N)
    act = act.to(compute_dtype)
    y = torch.zeros((M, top_k, H), dtype=compute_dtype, device=x.device)
    for e in routed:
        tokens, slots = (topk_ids == e).nonzero(as_tuple=True)
        w2e = _expert_weight(w2, w2_scale, e, block_shape, fp8, compute_dtype)
        y[tokens, slots] = act[tokens, slots] @ w2e.T
    return (y * topk_weights.to(compute_dtype)[:, :, None]).sum(dim=1)


def quantize_fp8_per_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t as float8 e4m3 and its one float32 scale [1]: scale = max|t| / 448."""
    scale = (t.abs().amax().float().clamp(min=1e-10) / FP8_MAX).reshape(1)
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_per_expert(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, R, C] as float8 e4m3 with one float32 scale per expert, [E]."""
    scale = w.abs().float().amax(dim=(1, 2)).clamp(min=1e-10) / FP8_MAX
    q = (w.float() / scale[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize_fp8_blocks(
    w: torch.Tensor, block_shape: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, R, C] as float8 e4m3 with a float32 scale per bn×bk block, [E, ⌈R/bn⌉, ⌈C/bk⌉]."""
    E, R, C = w.shape
    bn, bk = block_shape
    padded = F.pad(w.float(), (0, -C % bk, 0, -R % bn))
    blocks = padded.reshape(E, padded.shape[1] // bn, bn, padded.shape[2] // bk, bk)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-10) / FP8_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(padded.shape)[:, :R, :C].to(FP8_DTYPE)
    return q.contiguous(), scale


def quantize_fp8_token_groups(t: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t [T, C] as float8 e4m3 with a float32 scale per token and group of columns, [T, ⌈C/g⌉]."""
    T, C = t.shape
    padded = F.pad(t.float(), (0, -C % group))
    groups = padded.reshape(T, -1, group)
    scale = groups.abs().amax(dim=2).clamp(min=1e-10) / FP8_MAX
    q = (groups / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(T, -1)[:, :C]
    return q.to(FP8_DTYPE), scale


def dequantize_fp8_blocks(
    q: torch.Tensor, scale: torch.Tensor, block_shape: list[int], dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of quantize_fp8_blocks for q [..., R, C] and scale [..., ⌈R/bn⌉, ⌈C/bk⌉]."""
    bn, bk = block_shape
    R, C = q.shape[-2:]
    full = scale.to(dtype).repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return q.to(dtype) * full[..., :R, :C]


def grouped_mm_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The same bf16 layer from PyTorch ops around torch._grouped_mm (CUDA, sm90+): a baseline.

    x [M, H] bf16, w1 [E, 2N, H], w2 [E, H, N]; returns [M, H] bf16. No host synchronisation,
    so it can be captured in a CUDA graph.
    """
    M, H = x.shape
    E = w1.shape[0]
    N = w2.shape[2]
    top_k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat_ids.long(), torch.ones_like(flat_ids, dtype=torch.int32))
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    h = torch._grouped_mm(x[order // top_k], w1.transpose(1, 2), offs=offsets)
    act = F.silu(h[:, :N]) * h[:, N:]
    y_sorted = torch._grouped_mm(act, w2.transpose(1, 2), offs=offsets)
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted
    weighted = y.view(M, top_k, H).float() * topk_weights[:, :, None].float()
    return weighted.sum(dim=1).to(x.dtype)


def _expert_weight(w, scale, e, block_shape, fp8, compute_dtype):
    """Expert e's weight matrix in compute_dtype, dequantised when fp8."""
    if not fp8:
        return w[e].to(compute_dtype)
    if block_shape:
        return dequantize_fp8_blocks(w[e], scale[e], block_shape, compute_dtype)
    return w[e].to(compute_dtype) * scale.reshape(-1)[e].to(compute_dtype)


def _fake_quantize(t, block_shape):
    """t rounded through the kernel's dynamic fp8 quantisation, back in float32."""
    if block_shape:
        group = block_shape[1]
        q, scale = quantize_fp8_token_groups(t, group)
        return q.float() * scale.repeat_interleave(group, dim=1)[:, : t.shape[1]]
    q, scale = quantize_fp8_per_tensor(t)
    return q.float() * scale
