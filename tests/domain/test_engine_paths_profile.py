"""A profiled window's word on an engine's paths (domain.engine_paths.with_profile): the kernels
the window ran confirm or contradict what the report, the log and the source say. The real CPU
build's start-up logs beside its real traces of the same TP (tests/fixtures)."""

from pathlib import Path

from domain.engine_paths import EnginePaths, PathRow, log_rows, with_profile
from domain.step_trace import read_breakdown
from tests import step_breakdowns as sb

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WHERE = "profile at concurrency 8"


def _paths(log_name, trace_folder) -> dict[str, PathRow]:
    text = (FIXTURES / "engine_logs" / log_name).read_bytes().decode()
    paths = EnginePaths(engine="vllm", version="0.32.0", rows=log_rows(text))
    seen = with_profile(paths, read_breakdown(FIXTURES / "traces" / trace_folder), WHERE)
    return {row.key: row for row in seen.rows}


def _profile_word(row):
    (word,) = [e for e in row.evidence if e.source == "profile"]
    return word


def test_the_shared_memory_all_reduce_at_tp_2_is_confirmed_by_the_kernels_it_ran():
    rows = _paths("vllm-0.32.0-cpu-tp2.log", "vllm-cpu-tp2")

    word = _profile_word(rows["allreduce"])
    assert word.verdict == "confirms"
    assert "_C::shm_allreduce" in word.text and word.where == WHERE
    assert word.text.startswith("the window's communication in a decode step: ")
    moe = _profile_word(rows["moe_backend"])
    assert moe.verdict == "confirms" and "_C::cpu_fused_moe" in moe.text


def test_no_all_reduce_at_tp_1_is_confirmed_by_no_communication_kernel():
    rows = _paths("vllm-0.32.0-cpu-tp1.log", "vllm-cpu-tp1")

    word = _profile_word(rows["allreduce"])
    assert (rows["allreduce"].state, word.verdict) == ("off", "confirms")
    assert "no kernel (0% of the step)" in word.text
    # a path the window cannot see keeps its evidence as it was
    assert all(e.source != "profile" for e in rows["cuda_graphs"].evidence)


def _fusion(state):
    return EnginePaths(
        engine="vllm",
        rows=[PathRow(key="allreduce_rms_fusion", state=state, reason="as the config says")],
    )


def _window(communication, norm):
    top = {"communication": [(communication, 3000.0)], "norm": [(norm, 800.0)]}
    return sb.breakdown(kinds=[sb.kind(top=top)])


def test_a_fusion_said_on_is_contradicted_by_an_all_reduce_and_a_separate_norm_kernel():
    window = _window("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "vllm::rms_norm_kernel<bf16>")

    (on,) = with_profile(_fusion("on"), window, WHERE).rows
    (off,) = with_profile(_fusion("off"), window, WHERE).rows

    assert (_profile_word(on).verdict, _profile_word(off).verdict) == ("contradicts", "confirms")


def test_a_fused_all_reduce_kernel_confirms_the_fusion_on():
    window = _window("flashinfer::trtllm_allreduce_fusion_kernel", "act_and_mul_kernel")

    (on,) = with_profile(_fusion("on"), window, WHERE).rows

    assert _profile_word(on).verdict == "confirms"
