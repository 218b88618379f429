"""The steps every backend launches around its GEMMs (tuning.moe_ops) against PyTorch.

Without a GPU the kernels run in Triton's interpreter, whose float→fp8 conversion loses a rounding
carry into the exponent: the quantisation is tested on exactly representable values.
"""

import pytest
import torch

from tests.interpreted import GPU, ops
from tuning.reference import quantize_fp8_token_groups

DEVICE = "cuda" if GPU else "cpu"


@pytest.fixture(autouse=True)
def _interpreter_while_testing(monkeypatch):
    """Triton reads TRITON_INTERPRET again while running (e.g. importing its Gluon frontend)."""
    if not GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize(
    ("block_m", "pair_chunk"),
    # one chunk (one launch); 8 chunks; 31 chunks, more than one prefix-sum tile of 16 rows
    [(16, 1024), (32, 1024), (64, 1024), (16, 16), (32, 4), (64, 16)],
)
def test_sort_and_pad_puts_every_pair_once_in_its_experts_blocks(block_m, pair_chunk):
    generator = torch.Generator().manual_seed(block_m)
    E, top_k = 12, 3
    topk_ids = torch.stack([torch.randperm(E, generator=generator)[:top_k] for _ in range(41)])
    # experts 0 and 1 get no pairs
    topk_ids = torch.where(topk_ids < 2, 2 + topk_ids.sum(1, keepdim=True) % 10, topk_ids)
    counts = torch.bincount(topk_ids.reshape(-1), minlength=E)
    assert counts[:2].sum() == 0

    blocks = ops.sort_and_pad(
        topk_ids.to(torch.int32).to(DEVICE), E, block_m, pair_chunk=pair_chunk
    )

    padded = int(blocks.num_padded[0])
    assert padded == int(sum((c + block_m - 1) // block_m * block_m for c in counts.tolist()))
    assert blocks.num_m_blocks * block_m >= padded
    seen = []
    flat = topk_ids.reshape(-1)
    for b in range(padded // block_m):
        rows = int(blocks.block_rows[b])
        pairs = blocks.sorted_pair_ids[b * block_m : b * block_m + rows].tolist()
        assert 1 <= rows <= block_m
        assert all(int(flat[p]) == int(blocks.block_experts[b]) for p in pairs)
        seen += pairs
    assert sorted(seen) == list(range(flat.numel()))


def test_group_quantisation_matches_the_reference_on_representable_values():
    """Values on the fp8 grid, each group holding ±448·2⁻³: the kernel must reproduce both
    the scales and the values exactly (no rounding, which the interpreter gets wrong)."""
    generator = torch.Generator().manual_seed(7)
    grid = torch.randint(-120, 120, (6, 96), generator=generator).to(ops.FP8_DTYPE).float()
    grid[:, ::32] = 448.0
    x = (grid / 8).to(torch.float16).to(DEVICE)

    xq, x_scale = ops.quantize_activations(x, 2, [32, 32])

    ref_q, ref_scale = quantize_fp8_token_groups(x, 32)
    assert torch.equal(x_scale, ref_scale)
    assert torch.equal(xq.float(), ref_q.float())


def test_silu_and_mul_matches_torch():
    h = torch.randn((7, 96), generator=torch.Generator().manual_seed(2)).to(DEVICE)

    act, scale = ops.silu_and_mul(h, 0, None)

    expected = torch.nn.functional.silu(h[:, :48]) * h[:, 48:]
    assert scale is None
    assert torch.allclose(act, expected, rtol=1e-5, atol=1e-6)
