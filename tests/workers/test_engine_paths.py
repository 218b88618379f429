"""The worker's engine paths (workers.engine_paths, through engine_info.observe): a managed
stand-in told to log a vLLM fall-back line gives the row and the finding; the real CPU build's
/server_info and log give rows from all three sources; what cannot be read is an unknown row."""

import json
import sys
from pathlib import Path

import pytest

from domain import engine as reports
from moeops.insights.rules import paths as path_rules
from moeops.insights.rules import run_data
from tests.engine import engine_source, ensure_installed
from workers import engine_info
from workers.engine_paths import gpu_capability, managed_log, observe_paths
from workers.engine_supervisor import Recipe

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "moeops" / "examples"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs"
FALLBACK = (
    "(Worker_TP0 pid=7001) WARNING 12-06 05:10:02 [allreduce_rms_fusion.py:1045] Failed to "
    "initialize Flashinfer allreduce workspace. Flashinfer allreduce-norm fusion will be disabled."
)


def test_a_standin_told_to_log_a_fallback_gives_the_row_and_the_finding(supervisor, free_port):
    port = free_port()
    argv = [sys.executable, "-m", "localstack.standin", "--port", str(port)]
    recipe = Recipe(
        deployment=9,
        version=1,
        argv=[*argv, "--log-line", FALLBACK],
        base_url=f"http://127.0.0.1:{port}",
        ready_timeout_s=60,
    )
    supervisor.start(recipe)
    log = managed_log(9, managed=True, supervisor=supervisor)

    observed = engine_info.observe(recipe.base_url, kernel_shape=None, engine_log=log)

    paths = observed["engine_paths"]
    assert paths["engine"] == "standin"
    assert "the stand-in engine has no source to evaluate" in paths["notes"]
    [row] = paths["rows"]
    assert (row["key"], row["state"]) == ("allreduce_rms_fusion", "fell_back")
    assert row["evidence"][0]["text"] == FALLBACK
    assert row["evidence"][0]["where"].startswith(str(log))
    [finding] = path_rules.path_fell_back(run_data.RunData(engine_paths=paths))
    assert finding.evidence["line"] == FALLBACK and finding.evidence["at"] == "12-06 05:10:02"


def test_an_external_engines_log_is_unknown_and_says_why():
    assert managed_log(9, managed=False) is None
    assert managed_log(9, managed=False, external="/var/log/vllm.log") == Path("/var/log/vllm.log")

    paths = observe_paths({"engine": "vllm", "version": "0.32.0"}, python=sys.executable)

    log_rows = [r for r in paths["rows"] if any(e["source"] == "log" for e in r["evidence"])]
    assert log_rows and all(r["state"] == "unknown" for r in log_rows)
    assert "the deployment names none (its engine log field)" in log_rows[0]["reason"]


def test_a_log_that_is_gone_and_a_source_that_cannot_be_read_are_unknown(tmp_path):
    identity = {"engine": "vllm", "version": "0.32.0"}

    paths = observe_paths(identity, log_path=tmp_path / "engine.log", python=sys.executable)

    rows = {r["key"]: r for r in paths["rows"]}
    assert rows["cuda_graphs"]["state"] == "unknown"
    assert "is gone (never written, or removed)" in rows["cuda_graphs"]["reason"]
    # the worker's own Python has no vLLM: the source part says so, it does not guess
    assert rows["allreduce_rms_fusion"]["state"] == "unknown"
    assert "vllm is not installed for" in rows["allreduce_rms_fusion"]["reason"]


def test_the_cpu_builds_report_log_and_source_make_one_row_a_path():
    info = json.loads((LOGS / "vllm-0.32.0-cpu-server_info.json").read_text())
    identity = {
        "engine": "vllm",
        "version": "0.32.0",
        "args": reports.vllm_args(info["vllm_config"]),
        "args_source": "/server_info",
        "env": info["vllm_env"],
    }

    paths = observe_paths(
        identity,
        log_path=LOGS / "vllm-0.32.0-cpu-tp1.log",
        capability=None,
        python=str(ensure_installed()),
    )

    rows = {r["key"]: r for r in paths["rows"]}
    moe = rows["moe_backend"]
    assert (moe["state"], moe["value"]) == ("on", "CPU")
    assert [e["source"] for e in moe["evidence"]] == ["log", "report", "source"]
    fusion = rows["allreduce_rms_fusion"]
    assert {e["source"] for e in fusion["evidence"]} == {"log", "report", "source"}


def test_a_host_without_nvml_has_no_capability():
    class NoNvml:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    capability, why = gpu_capability(nvml=NoNvml())

    assert capability is None and "no CUDA GPU on this host" in why


def test_an_sglang_engine_records_its_own_fusion_decision_for_the_model_it_serves(
    tmp_path, monkeypatch
):
    source = engine_source("sglang", "0.5.23")
    # the engine's Python finds SGLang 0.5.23 (the wheel's files) as an installed package
    monkeypatch.setenv("PYTHONPATH", str(source.parent))
    model = tmp_path / "GLM-5-FP8"
    model.mkdir()
    (model / "config.json").write_text((EXAMPLES / "glm-5-fp8_config.json").read_text())
    identity = {
        "engine": "sglang",
        "version": "0.5.23",
        "args": {
            "model_path": str(model),
            "tp_size": 8,
            "flashinfer_allreduce_fusion_backend": None,
        },
    }

    paths = observe_paths(identity, capability="12.0", python=sys.executable)

    fusion = next(r for r in paths["rows"] if r["key"] == "allreduce_rms_fusion")
    assert (paths["version"], paths["tp"], fusion["state"]) == ("0.5.23", 8, "off")
    words = {e["source"]: e for e in fusion["evidence"]}
    assert words["report"]["where"] == "flashinfer_allreduce_fusion_backend"
    assert words["source"]["where"] == (
        "sglang/srt/arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable, SGLang 0.5.23"
    )
    assert fusion["enabled_on"] == ["9.0", "10.0", "10.3"]


def test_an_sglang_model_path_not_on_this_host_leaves_the_fusion_unknown(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(engine_source("sglang", "0.5.23").parent))
    identity = {"engine": "sglang", "version": "0.5.23", "args": {"model_path": "zai-org/GLM-5"}}

    paths = observe_paths(identity, capability="9.0", tp=8, python=sys.executable)

    fusion = next(r for r in paths["rows"] if r["key"] == "allreduce_rms_fusion")
    source = next(e for e in fusion["evidence"] if e["source"] == "source")
    assert "no config.json at the engine's model_path zai-org/GLM-5" in paths["notes"][0]
    assert "no config.json of the model was given" in source["text"]
