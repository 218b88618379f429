"""An engine's paths from its start-up log and its report (domain.engine_paths): the real CPU
build's logs at TP 1 and 2 and its /server_info (tests/fixtures/engine_logs), one row a path."""

import json
from pathlib import Path

from domain import engine as reports
from domain.engine_paths import (
    EnginePaths,
    Evidence,
    PathRow,
    decision_changes,
    log_rows,
    merge_paths,
    path_changes,
    report_rows,
    sglang_report_rows,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs"
FALLBACK = (
    "(Worker_TP0 pid=7001) WARNING 12-06 05:10:02 [allreduce_rms_fusion.py:1045] Failed to "
    "initialize Flashinfer allreduce workspace. Flashinfer allreduce-norm fusion will be disabled."
)


def _log(name: str) -> str:
    # as the worker reads it: bytes, so that a progress bar's carriage return ends no line
    return (LOGS / name).read_bytes().decode()


def _rows(text, **kwargs) -> dict[str, PathRow]:
    return {row.key: row for row in log_rows(text, **kwargs)}


def test_the_cpu_builds_moe_lines_become_rows_with_their_time():
    rows = _rows(_log("vllm-0.32.0-cpu-tp1.log"))

    backend, kernel = rows["moe_backend"], rows["moe_kernel"]
    assert (backend.state, backend.value) == ("on", "CPU")
    assert backend.evidence[0].text.endswith(
        "Using CPU Unquantized MoE backend out of potential backends: ['CPU']."
    )
    assert (backend.evidence[0].at, backend.evidence[0].where) == (
        "12-06 04:52:23",
        "engine.log line 29",
    )
    assert (kernel.value, kernel.evidence[0].where) == (
        "CPUUnquantizedExperts",
        "engine.log line 38",
    )


def test_the_config_line_gives_graphs_compile_prefill_and_dtypes():
    rows = _rows(_log("vllm-0.32.0-cpu-tp1.log"))

    assert (rows["cuda_graphs"].state, rows["cuda_graphs"].value) == ("off", "NONE")
    assert (rows["compile"].state, rows["compile"].value) == ("off", "NONE")
    assert rows["chunked_prefill"].state == "on"
    assert (rows["kv_cache_dtype"].value, rows["quantization"].value) == ("auto", "None")
    assert (rows["allreduce_rms_fusion"].state, rows["allreduce"].state) == ("off", "off")
    # the Inductor line agrees with the config line and adds its evidence
    assert len(rows["compile"].evidence) == 2


def test_the_cpu_builds_allreduce_at_tp2_is_shared_memory():
    rows = _rows(_log("vllm-0.32.0-cpu-tp2.log"))

    allreduce = rows["allreduce"]
    assert (allreduce.state, allreduce.value) == ("on", "shared memory (CPU build)")
    assert "over 2 ranks" in allreduce.reason
    assert rows["custom_allreduce"].state == "off"
    assert rows["moe_backend"].evidence[0].text.startswith("(Worker_TP0 pid=6074) INFO")


def test_the_cpu_builds_shared_memory_all_reduce_that_fell_back_names_its_group():
    # vLLM 0.32's CPU build on a CPU without AVX-512 (its kernel library there has no SHM ops)
    line = (
        "(Worker_TP0 pid=6074) INFO 12-06 04:57:40 [cpu_communicator.py:57] CPU SHM communicator "
        "disabled for group tp:0: ranks do not share the same SHM group name, falling back to "
        "torch.distributed."
    )
    rows = _rows(_log("vllm-0.32.0-cpu-tp2.log") + line + "\n")

    allreduce = rows["allreduce"]
    assert (allreduce.state, allreduce.value) == ("fell_back", "tp:0")
    assert "off for group tp:0: torch.distributed runs it" in allreduce.reason
    assert line in [e.text for e in allreduce.evidence]


def test_a_fusion_that_turned_itself_off_fell_back_over_the_config():
    text = _log("vllm-0.32.0-cpu-tp2.log").replace(
        "'fuse_allreduce_rms': False", "'fuse_allreduce_rms': True"
    )
    rows = _rows(text + FALLBACK + "\n")

    fusion = rows["allreduce_rms_fusion"]
    assert fusion.state == "fell_back"
    assert fusion.evidence[0].text == FALLBACK and fusion.evidence[0].at == "12-06 05:10:02"
    assert "turned itself off" in fusion.reason
    assert fusion.evidence[1].text.startswith("(EngineCore pid=6058) INFO 12-06 04:53:35")


def test_the_default_moe_config_line_falls_back():
    line = (
        "(Worker pid=1) WARNING 12-06 05:00:00 [fused_moe.py:1163] Using default MoE config. "
        "Performance might be sub-optimal! Config file not found at /x/E=8,N=64.json"
    )

    rows = _rows(_log("vllm-0.32.0-cpu-tp1.log") + line)

    assert rows["moe_config"].state == "fell_back"
    assert rows["moe_config"].evidence[0].at == "12-06 05:00:00"


def test_a_missing_log_is_unknown_with_the_reason():
    rows = log_rows(None, missing="the engine's start-up log /x/engine.log is gone")

    assert rows and {row.state for row in rows} == {"unknown"}
    assert all(row.reason == "the engine's start-up log /x/engine.log is gone" for row in rows)


def test_a_rotated_log_without_the_start_is_unknown_not_a_guess():
    tail = "\n".join(_log("vllm-0.32.0-cpu-tp1.log").split("\n")[60:])

    rows = _rows(tail)

    assert rows["cuda_graphs"].state == "unknown"
    assert "cut or rotated" in rows["cuda_graphs"].reason


def test_a_key_the_config_line_no_longer_reports_is_unknown():
    text = _log("vllm-0.32.0-cpu-tp1.log").replace("kv_cache_dtype=auto, ", "")

    row = _rows(text)["kv_cache_dtype"]

    assert row.state == "unknown"
    assert row.reason == "the start-up config line no longer reports kv_cache_dtype"


def _server_info() -> dict:
    info = json.loads((LOGS / "vllm-0.32.0-cpu-server_info.json").read_text())
    return reports.vllm_args(info["vllm_config"])


def test_the_report_rows_read_server_info():
    rows = {row.key: row for row in report_rows(_server_info(), version="0.32.0")}

    assert rows["allreduce_rms_fusion"].state == "off"
    assert rows["allreduce_rms_fusion"].evidence[0].where == (
        "compilation_config.pass_config.fuse_allreduce_rms"
    )
    assert (rows["cuda_graphs"].state, rows["compile"].state) == ("off", "off")
    assert rows["chunked_prefill"].state == "on"
    assert rows["custom_allreduce"].state == "off"


def test_a_key_the_engine_no_longer_reports_is_unknown_naming_it():
    args = _server_info()
    del args["compilation_config.pass_config.fuse_allreduce_rms"]

    rows = {row.key: row for row in report_rows(args, version="0.35.0")}

    assert rows["allreduce_rms_fusion"].state == "unknown"
    assert rows["allreduce_rms_fusion"].reason == (
        "vLLM 0.35.0's /server_info no longer reports "
        "compilation_config.pass_config.fuse_allreduce_rms"
    )


def test_one_row_a_path_keeps_every_sources_evidence():
    source = PathRow(
        key="allreduce_rms_fusion",
        state="depends",
        reason="on where FlashInfer is installed",
        enabled_on=["9.0", "10.0"],
        evidence=[Evidence(source="source", text="True with FlashInfer")],
    )
    report = report_rows(_server_info(), version="0.32.0")
    log = log_rows(_log("vllm-0.32.0-cpu-tp1.log"))

    merged = {row.key: row for row in merge_paths(report, log, [source])}

    fusion = merged["allreduce_rms_fusion"]
    assert fusion.state == "off"
    assert [e.source for e in fusion.evidence] == ["log", "report", "source"]
    assert fusion.enabled_on == ["9.0", "10.0"]


def test_what_changed_names_a_path_whose_state_differs():
    def paths(state):
        row = PathRow(key="allreduce_rms_fusion", state=state, reason="")
        return EnginePaths(rows=[row, PathRow(key="compile", state="unknown", reason="")])

    assert path_changes(paths("on"), paths("off")) == ["all-reduce + RMSNorm fusion on → off"]
    assert path_changes(paths("on"), paths("on")) == []
    assert path_changes(None, paths("on")) == []


def test_sglangs_report_gives_its_switches_and_a_missing_one_is_unknown():
    args = {
        "enable_flashinfer_allreduce_fusion": True,
        "disable_custom_all_reduce": False,
        "attention_backend": "fa3",
        "moe_runner_backend": "auto",
        "disable_cuda_graph": False,
        "enable_torch_compile": False,
        "chunked_prefill_size": 8192,
        "kv_cache_dtype": "auto",
    }

    rows = {row.key: row for row in sglang_report_rows(args, version="0.5.23")}

    assert rows["allreduce_rms_fusion"].state == "on"
    assert (rows["attention_backend"].state, rows["attention_backend"].value) == ("on", "fa3")
    assert rows["moe_backend"].state == "depends"
    assert (rows["cuda_graphs"].state, rows["compile"].state) == ("on", "off")
    assert rows["chunked_prefill"].state == "on"
    assert rows["quantization"].reason == (
        "SGLang 0.5.23's /get_server_info no longer reports quantization"
    )


def test_decision_changes_name_what_changed_and_why_one_side_is_unknown():
    def row(state, value, text="f → x", reason=""):
        evidence = [Evidence(source="source", text=text)]
        return PathRow(
            key="deep_gemm", state=state, value=value, reason=reason, evidence=evidence
        ).model_dump()

    assert decision_changes([row("on", "on")], [row("on", "on")]) == []
    assert decision_changes([row("on", "on")], [row("off", "off")]) == ["DeepGEMM: on → off"]
    assert decision_changes([row("on", "on")], [row("unknown", None, reason="uses nvcc_path")]) == [
        "DeepGEMM: on → unknown (uses nvcc_path)"
    ]
    assert decision_changes(
        [row("depends", "a", "f → [1, 2]")], [row("depends", "a", "f → [2, 1]")]
    ) == ["DeepGEMM: [1, 2] → [2, 1]"]


def test_sglangs_resolved_fusion_backend_outranks_its_old_switch():
    # SGLang 0.5.23 auto-enables the fusion as a backend and leaves the deprecated switch False
    on = {
        "flashinfer_allreduce_fusion_backend": "auto",
        "enable_flashinfer_allreduce_fusion": False,
    }
    off = {"flashinfer_allreduce_fusion_backend": None, "enable_flashinfer_allreduce_fusion": False}

    fused = {row.key: row for row in sglang_report_rows(on, version="0.5.23")}
    apart = {row.key: row for row in sglang_report_rows(off, version="0.5.23")}

    row = fused["allreduce_rms_fusion"]
    assert (row.state, row.value) == ("on", "flashinfer (auto)")
    assert row.evidence[0].where == "flashinfer_allreduce_fusion_backend"
    assert apart["allreduce_rms_fusion"].state == "off"
    # the snapshot's fusion flag, which the incompatibility rules read, says the same
    assert reports.identity("sglang", args=on)["allreduce_fusion"] is True
    assert reports.identity("sglang", args=off)["allreduce_fusion"] is False
