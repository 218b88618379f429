"""`python -m tuning compile-check`: the configs a tune would propose for a GPU that is not here,
compiled for it in vLLM 0.34's own kernel on this CPU (tuning.compile_check).

A whole grid is a thousand configs or more (GLM-5 fp8 block: 1,016 on 12.0, 2,224 with vLLM's
TMA switch on 9.0 and 10.0), some 1.5 s each on one CPU, so `make test` compiles the riskiest of
each capability (--sample 1: the deepest pipeline and the biggest tile, the configs nearest the
limit) and the engine's own, and the CLI compiles the whole grid.
"""

import json
from pathlib import Path

import pytest

import tests.interpreted  # noqa: F401  (before anything imports Triton: see the module)
from tests.engine import engine_source
from tests.fakes import HF_CONFIGS, KERNEL_ENTRY
from tuning.__main__ import main
from tuning.backends import load_backend
from tuning.compile_check import compile_check, proposed_configs
from tuning.compile_only import target_for
from tuning.config_files import config_file_name, dumps_config, loads_config
from tuning.devices import RTX_PRO_6000_BLACKWELL, capability_of
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
VLLM_DEFAULT = {**KERNEL_ENTRY, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "GROUP_SIZE_M": 32}


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


# A file tuned on another GPU: M=4096's 5-stage 128 × 128 × 128 tile holds four A and B tile
# pairs on 12.0 (131,072 bytes) and cannot fit 101,376; M=1's small tile fits as it is.
ELSEWHERE = {
    1: {**VLLM_DEFAULT, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_stages": 5},
    4096: {**VLLM_DEFAULT, "BLOCK_SIZE_M": 128, "num_warps": 8, "num_stages": 5},
}


@pytest.fixture(scope="module")
def sglang_0523():
    return str(engine_source("sglang", "0.5.23"))


def test_a_file_from_another_gpu_is_fitted_and_written_under_the_rtx_pro_6000_names(
    vllm_034, tmp_path, capsys
):
    entries = tmp_path / "h200.json"
    entries.write_text(dumps_config(ELSEWHERE, "3.6.0"))
    out = tmp_path / "sm120"

    status = main(
        [
            "compile-check",
            "--engine", "vllm", "--source", vllm_034, "--capability", "12.0",
            "--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8",
            "--entries", str(entries), "--write", str(out), "--workers", "2", "--json",
        ]
    )  # fmt: skip

    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["fits"]
    small, big = report["entries"]
    assert (small["M"], small["changed"], small["written"]) == (1, False, ELSEWHERE[1])
    assert (big["M"], big["changed"]) == (4096, True)
    assert big["written"] == {**ELSEWHERE[4096], "num_stages": 4}
    assert big["shared_bytes"] <= 101376 < shared_memory_bytes(ELSEWHERE[4096], 1, 120)
    written = {(f["device_name"], f["style"]): Path(f["path"]) for f in report["files"]}
    assert {device for device, _ in written} == set(RTX_PRO_6000_BLACKWELL)
    triton_version = report["compile_checked"]["triton_version"]
    for (_, style), path in written.items():
        version, file_entries = loads_config(path.read_text())
        assert file_entries == {1: ELSEWHERE[1], 4096: big["written"]}
        # vLLM's file says its Triton inside, SGLang's by its folder
        assert version == (triton_version if style == "vllm" else None)
        if style == "sglang":
            assert path.parent.name == f"triton_{triton_version.replace('.', '_')}"
    imports = json.loads((out / "moeops-imports.json").read_text())
    assert len(imports) == len(RTX_PRO_6000_BLACKWELL)
    record = imports[0]["compile_checked"]
    assert record["capability"] == "12.0" and record["fewer_stages"] == [4096]
    assert record["kernel"]["version"] == "0.34.0"
    assert record["max_shared_bytes"] == big["shared_bytes"]


def test_an_entry_that_fits_at_no_stage_count_writes_nothing(vllm_034, tmp_path, capsys):
    # a made-up 9.0 GPU of 16 KiB per block: one 128 × 128 A and B tile pair is 32 KiB
    entries = tmp_path / "big.json"
    entries.write_text(dumps_config({4096: {**ELSEWHERE[4096], "num_stages": 2}}, None))
    out = tmp_path / "out"

    status = main(
        [
            "compile-check",
            "--engine", "vllm", "--source", vllm_034, "--capability", "9.0",
            "--shared-memory", "16384",
            "--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8",
            "--entries", str(entries), "--write", str(out), "--for-device", "NVIDIA H200",
            "--workers", "2",
        ]
    )  # fmt: skip

    said = capsys.readouterr().out
    assert status == 1
    assert "M=4096 128x128x128 g32 w8 s2: fits at no stage count" in said
    assert "out of resource: shared memory" in said and "nothing written" in said
    assert not out.exists()


def test_the_cli_refuses_entries_it_cannot_read_and_gpus_it_knows_no_names_for(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"64": {"BLOCK_SIZE_M": 48}}')
    glm5 = ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]

    assert main(["compile-check", "--capability", "12.0", *glm5, "--entries", str(bad)]) == 2
    said = capsys.readouterr().err
    assert f"--entries {bad}: batch size 64: BLOCK_SIZE_N is missing" in said
    assert "BLOCK_SIZE_M must be a power of two, got 48" in said
    argv = ["compile-check", "--capability", "8.0", *glm5, "--entries", str(bad), "--write", "x"]
    assert main(argv) == 2
    assert "no GPU names known for compute capability 8.0" in capsys.readouterr().err
    assert main(["compile-check", "--capability", "12.0", *glm5, "--write", "x"]) == 2
    assert "--write and --for-device go with --entries FILE" in capsys.readouterr().err


def test_the_files_are_named_as_both_engines_name_them_on_an_rtx_pro_6000(vllm_034, sglang_0523):
    vllm = load_backend("vllm", source_dir=vllm_034, capability=120)
    sglang = load_backend("sglang", source_dir=sglang_0523, capability=120)
    for device in RTX_PRO_6000_BLACKWELL:
        assert capability_of(device) == 120
        for backend in (vllm, sglang):
            own = backend.file_name(GLM5_FP8_BLOCK, device)
            ours = config_file_name(256, 256, device, "fp8_w8a8", (128, 128), backend.engine)
            assert own == ours


def test_the_tuning_gpus_limits_are_torchs_and_must_agree_with_tritons():
    from types import SimpleNamespace

    from tuning.compile_only import device_target

    sm120 = SimpleNamespace(major=12, minor=0, shared_memory_per_block_optin=101376)
    triton_says = {"max_shared_mem": 101376, "multiprocessor_count": 188}

    target = device_target(sm120, 120, triton_says)

    assert target.limits() == {"capability": 120, "shared_memory_bytes": 101376}
    assert target.properties["multiprocessor_count"] == 188
    with pytest.raises(RuntimeError, match="torch reads compute capability 12.0 with 101376"):
        device_target(sm120, 90, {"max_shared_mem": 232448})
