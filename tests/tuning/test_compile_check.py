"""`python -m tuning compile-check`: the configs a tune would propose for a GPU that is not here,
compiled for it in vLLM 0.34's own kernel on this CPU (tuning.compile_check).

A whole grid is a thousand configs or more (GLM-5 fp8 block: 1,016 on 12.0, 2,224 with vLLM's
TMA switch on 9.0 and 10.0), some 1.5 s each on one CPU, so `make test` compiles the riskiest of
each capability (--sample 1: the deepest pipeline and the biggest tile, the configs nearest the
limit) and the engine's own, and the CLI compiles the whole grid.
"""

import json

import pytest

import tests.interpreted  # noqa: F401  (before anything imports Triton: see the module)
from tests.engine import engine_source
from tests.fakes import HF_CONFIGS
from tuning.__main__ import main
from tuning.compile_check import compile_check, proposed_configs
from tuning.compile_only import target_for
from tuning.search import (
    SHARED_MEMORY_SLACK,
    KernelShape,
    config_key,
    search_space,
    shared_memory_bytes,
)

GLM5_FP8_BLOCK = KernelShape(
    E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
)
# A small batch size and a large one: their spaces and climbs span the grid's BLOCK_SIZE_M.
SIZES = [64, 4096]
# The engine's defaults (vLLM 0.34's get_default_config for this shape) seed every search.
VLLM_DEFAULT = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 32,
    "num_warps": 4,
    "num_stages": 3,
}


@pytest.fixture(autouse=True)
def _compiled(tmp_path, monkeypatch):
    """Compiled for the target, not interpreted, into an empty cache of the test's own."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))


@pytest.fixture(scope="module")
def vllm_034():
    return str(engine_source("vllm", "0.34.0"))


@pytest.mark.parametrize("capability", [120, 100, 90], ids=["12.0", "10.0", "9.0"])
def test_the_riskiest_proposed_configs_compile_within_the_gpus_limit(vllm_034, capability):
    target = target_for(capability)

    check = compile_check(
        GLM5_FP8_BLOCK,
        target,
        engine="vllm",
        source_dir=vllm_034,
        batch_sizes=SIZES,
        sample=1,
        workers=2,
    )

    assert check.kernel["version"] == "0.34.0"
    assert check.failed == []
    assert check.compiled == len(check.configs) == 2
    assert check.max_shared_bytes <= target.shared_memory
    # the config the search's estimate puts nearest the limit is among them
    switches = {"USE_TMA": (True, False)} if capability in (90, 100) else {}
    proposed = proposed_configs(GLM5_FP8_BLOCK, SIZES, target, switches, {})
    assert check.proposed >= len(proposed)
    nearest = max(shared_memory_bytes(c, 1, capability) for c, _ in proposed.values())
    assert max(c.estimate_bytes for c in check.configs) == nearest
    # the search's estimate, with its slack, is not below what the GEMMs take
    for checked in check.configs:
        gemm = checked.kernels["fused_moe_kernel"]
        assert checked.estimate_bytes <= gemm <= checked.estimate_bytes + SHARED_MEMORY_SLACK
    # the engine's own configs are compiled beside, each once
    assert [c.error for c in check.engine_configs] == [None] * len(check.engine_configs)
    defaults = [config_key(c.config) for c in check.engine_configs]
    assert len(defaults) == len(set(defaults)) and config_key(VLLM_DEFAULT) in defaults


def test_what_is_proposed_fits_the_limit_and_reaches_as_far_as_the_climbs():
    sm120 = target_for(120)
    limit = sm120.shared_memory
    sm90 = proposed_configs(GLM5_FP8_BLOCK, [64], target_for(90), {}, {})
    seeded = proposed_configs(GLM5_FP8_BLOCK, [64], sm120, {}, {64: [VLLM_DEFAULT]})
    alone = proposed_configs(GLM5_FP8_BLOCK, [64], sm120, {}, {})

    needed = [shared_memory_bytes(c, 1, 120) + SHARED_MEMORY_SLACK for c, _ in seeded.values()]
    assert max(needed) <= limit
    assert set(alone) < set(sm90)
    # M=64's space holds BLOCK_SIZE_M 16 to 64; a climb from it steps to 128, and from there to
    # 256 where the shared memory allows it
    sizes = {c["BLOCK_SIZE_M"] for c, _ in alone.values()}
    space = search_space(64, GLM5_FP8_BLOCK, limit, capability=120)
    assert {c["BLOCK_SIZE_M"] for c in space} < sizes
    assert set(alone) <= set(seeded)
    assert {m for _, m in seeded.values()} == {64}


def test_the_cli_reports_the_engines_own_configs_that_do_not_fit_in_json(vllm_034, capsys):
    # a made-up GPU of 40 KiB per block: vLLM's default at M = 4096 needs 48 KiB
    status = main(
        [
            "compile-check",
            "--engine", "vllm", "--source", vllm_034, "--capability", "12.0",
            "--shared-memory", "40960",
            "--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8",
            "--batch-sizes", "4096", "--sample", "1", "--workers", "2", "--json",
        ]
    )  # fmt: skip

    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert (report["capability"], report["limit_bytes"]) == ("12.0", 40960)
    assert report["compiled"] == report["checked"] == 2 and report["failed"] == []
    assert report["proposed"] > 2
    assert 0 < report["max_shared_bytes"] <= 40960
    ((default,),) = [report["engine_configs"]]
    assert default["config"] == VLLM_DEFAULT
    assert "shared memory" in default["error"] and default["shared_bytes"] > 40960


def test_the_cli_refuses_a_capability_it_knows_no_limit_for(capsys):
    status = main(
        [
            "compile-check", "--capability", "11.0",
            "--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"),
        ]
    )  # fmt: skip

    assert status == 2
    assert "no shared-memory limit known for compute capability 11.0" in capsys.readouterr().err
