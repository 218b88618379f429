"""The step breakdown of real H100 windows (tests/fixtures/traces/torch-gpu-h100-step, written by
the gpu test): vLLM 0.34's fused-MoE kernel, flash attention, an RMSNorm kernel and NCCL's
one-rank all-reduce each land in their class, eagerly and as CUDA graphs, and the host's pause
in each step is idle."""

import pytest

from domain.step_trace import read_breakdown
from tests.fakes import ROOT

STEPS = ROOT / "tests" / "fixtures" / "traces" / "torch-gpu-h100-step"
TOP = {
    "moe": "fused_moe_kernel",
    "attention": "flash_fwd_kernel",
    "norm": "rms_norm_kernel",
    "communication": "oneRankReduce",
}


@pytest.mark.parametrize("window", ["eager", "graphs"])
def test_each_part_of_a_real_gpu_step_lands_in_its_class(window):
    breakdown = read_breakdown(STEPS / f"{window}.pt.trace.json.gz")

    (rank,) = breakdown.ranks
    assert (rank.device, breakdown.engine_version) == ("gpu", "0.34.0")
    assert [k.kind for k in rank.kinds] == ["decode"]
    decode = rank.kind("decode")
    assert decode.steps >= 28
    for name, kernel in TOP.items():
        top = next(c for c in decode.classes if c.name == name).top
        assert kernel in top[0].name, (name, top)
    # the 0.5 ms the host slept in each ~2.3 ms step, and the launches after it
    assert 0.2 < decode.share("idle") < 0.45
    assert decode.share("other") < 0.01
    assert sum(c.share for c in decode.classes) == pytest.approx(1, abs=0.05)
    for step in rank.steps:
        assert sum(step.classes.values()) == pytest.approx(step.wall_us, rel=0.05)
