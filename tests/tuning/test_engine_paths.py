"""The engine's own decisions of its fast paths (tuning.engine_paths): the installed vLLM of make
test, and vLLM 0.33 and 0.34 read from their wheels (tests.engine)."""

import json
import shutil

import pytest

from domain.engine_diff_report import checked_report
from tests.engine import engine_source, ensure_installed
from tests.fakes import HF_CONFIGS
from tuning.__main__ import main as tuning_main
from tuning.engine_paths import source_paths
from workers.cli import main as cli_main


@pytest.fixture(scope="module")
def python():
    return str(ensure_installed())


def _paths(capability, *, tp=8, **kwargs):
    return source_paths("vllm", capability=capability, tp=tp, **kwargs)


@pytest.mark.parametrize(
    ("capability", "state", "value"),
    [
        ("9.0", "depends", "on where FlashInfer is installed"),
        ("10.0", "depends", "on where FlashInfer is installed"),
        ("12.0", "off", "off"),
    ],
)
def test_installed_vllm_fuses_allreduce_and_norm_as_its_own_function_says(
    python, capability, state, value
):
    paths = _paths(capability, python=python)

    fusion = paths.row("allreduce_rms_fusion")
    assert paths.version == "0.32.0"
    assert (fusion.state, fusion.value) == (state, value)
    assert fusion.enabled_on == ["9.0", "10.0", "10.3"]
    assert fusion.evidence[0].where == (
        "vllm/config/vllm.py enable_allreduce_rms_fusion, vLLM 0.32.0"
    )


def test_the_sm120_reason_names_the_capabilities_the_function_enables(python):
    fusion = _paths("12.0", python=python).row("allreduce_rms_fusion")

    assert fusion.reason == (
        "vLLM 0.32.0 runs each layer's all-reduce and its RMSNorm apart on compute capability "
        "12.0 at TP 8: it is enabled only on compute capability 9.0 and 10.x"
    )


def test_what_is_known_installed_decides_the_fusion(python):
    with_fi = _paths("9.0", python=python, installed={"flashinfer": True})
    without = _paths("9.0", python=python, installed={"flashinfer": False})

    assert with_fi.row("allreduce_rms_fusion").state == "on"
    assert without.row("allreduce_rms_fusion").state == "off"


def test_one_gpu_has_no_fusion_and_batch_invariance_turns_it_off(python):
    assert _paths("9.0", tp=1, python=python).row("allreduce_rms_fusion").state == "off"
    invariant = _paths("9.0", python=python, env={"VLLM_BATCH_INVARIANT": "1"})
    assert invariant.row("allreduce_rms_fusion").state == "off"


def test_the_moe_and_attention_orders_are_the_engines(python):
    hopper, blackwell = _paths("9.0", python=python), _paths("10.0", python=python)

    assert hopper.row("moe_backend").value == "TRITON"
    assert "'FlashInfer TRTLLM', 'FlashInfer CUTLASS'" in hopper.row("moe_backend").reason
    assert blackwell.row("moe_backend").value == "FlashInfer TRTLLM"
    assert hopper.row("attention_backend").value == "FLASH_ATTN"
    assert blackwell.row("attention_backend").value == "FLASHINFER"


def test_the_cpu_build_has_one_moe_backend_and_no_cuda_paths(python):
    paths = _paths(None, tp=2, python=python)

    assert "no CUDA GPU: the CPU build's paths" in paths.notes
    assert (paths.row("moe_backend").state, paths.row("moe_backend").value) == ("on", "CPU")
    assert paths.row("allreduce_rms_fusion").state == "off"
    assert paths.row("custom_allreduce").state == "off"
    assert paths.row("attention_backend").state == "unknown"


def test_vllm_034_asks_for_nvcc_before_deep_gemm_where_033_did_not():
    old = _paths("9.0", source_dir=engine_source("vllm", "0.33.0")).row("deep_gemm")
    new = _paths("9.0", source_dir=engine_source("vllm", "0.34.0")).row("deep_gemm")

    assert old.value == "on where DeepGEMM is installed"
    assert new.value == (
        "on where DeepGEMM is installed and an nvcc of CUDA 12.9 or newer is found"
    )


def test_mla_attention_is_evaluated_for_the_model(python):
    config = json.loads((HF_CONFIGS / "deepseek-v3_config.json").read_text())

    paths = _paths("10.0", python=python, model_config=config)

    assert paths.row("attention_backend").value == "FLASHINFER_MLA"
    assert "MLA backends" in paths.row("attention_backend").reason


def test_a_source_that_cannot_be_read_is_unknown_with_the_reason(tmp_path):
    paths = _paths("12.0", source_dir=tmp_path / "nowhere")

    assert {row.state for row in paths.rows} == {"unknown"}
    assert "is not a folder of the vllm package" in paths.rows[0].reason


def test_a_function_whose_shape_changed_is_unknown_naming_it(tmp_path):
    package = tmp_path / "vllm"
    shutil.copytree(engine_source("vllm", "0.34.0"), package)
    config = package / "config" / "vllm.py"
    text = config.read_text().replace(
        "        cfg.parallel_config.tensor_parallel_size > 1\n        and current_platform",
        "        cfg.parallel_config.tensor_parallel_size > 1\n        and nvlink_mesh()\n"
        "        and current_platform",
    )
    config.write_text(text)

    fusion = _paths("9.0", source_dir=package).row("allreduce_rms_fusion")

    assert fusion.state == "unknown"
    # the copy has no dist-info beside it: its version is unknown, and the row says so
    assert fusion.reason.startswith("vLLM unknown's enable_allreduce_rms_fusion")
    assert "uses nvlink_mesh" in fusion.reason


def test_a_function_gone_from_its_file_is_unknown(tmp_path):
    package = tmp_path / "vllm"
    shutil.copytree(engine_source("vllm", "0.34.0"), package)
    config = package / "config" / "vllm.py"
    config.write_text(config.read_text().replace("def enable_allreduce_rms_fusion", "def _gone"))

    fusion = _paths("9.0", source_dir=package).row("allreduce_rms_fusion")

    assert fusion.state == "unknown"
    assert "defines no enable_allreduce_rms_fusion" in fusion.reason


def test_the_cli_answers_without_a_token(monkeypatch, capsys, python):
    monkeypatch.delenv("MOEOPS_TOKEN", raising=False)
    monkeypatch.setenv("MOEOPS_VLLM_PYTHON", python)

    status = cli_main(["engine-paths", "--engine", "vllm", "--capability", "12.0", "--tp", "8"])
    text = capsys.readouterr().out
    status_json = cli_main(
        ["engine-paths", "--engine", "vllm", "--capability", "12.0", "--tp", "8", "--json"]
    )
    answer = json.loads(capsys.readouterr().out)

    assert status == status_json == 0
    assert text.startswith("vllm 0.32.0 on compute capability 12.0, TP 8")
    fusion = next(r for r in answer["rows"] if r["key"] == "allreduce_rms_fusion")
    assert fusion["state"] == "off"


def test_the_cli_refuses_a_capability_it_cannot_read(capsys):
    status = cli_main(["engine-paths", "--engine", "vllm", "--capability", "hopper"])

    assert status == 1
    assert "is not a compute capability" in capsys.readouterr().err


def test_engine_diff_names_the_path_decisions_033_and_034_differ_in(capsys):
    old, new = str(engine_source("vllm", "0.33.0")), str(engine_source("vllm", "0.34.0"))
    config = str(HF_CONFIGS / "glm-5-fp8_config.json")

    status = tuning_main(
        ["engine-diff", "--engine", "vllm", "--from", old, "--to", new, "--model-config", config]
        + ["--tp", "8", "--batch-sizes", "1", "--capability", "90"]
    )
    lines = capsys.readouterr().out.splitlines()

    assert status == 0
    at = lines.index("path decisions (compute capability 9.0, TP 8):")
    assert lines[at + 1 :] == [
        "  DeepGEMM: on where DeepGEMM is installed → on where DeepGEMM is installed and an "
        "nvcc of CUDA 12.9 or newer is found"
    ]


def test_engine_diff_of_one_version_changes_no_decision(capsys, tmp_path):
    source = str(engine_source("vllm", "0.34.0"))
    config = str(HF_CONFIGS / "deepseek-v3_config.json")
    record = tmp_path / "diff.json"

    tuning_main(
        ["engine-diff", "--engine", "vllm", "--from", source, "--to", source]
        + ["--model-config", config, "--tp", "8", "--batch-sizes", "1", "--capability", "120"]
        + ["--json", str(record)]
    )

    assert "path decisions (compute capability 12.0, TP 8): unchanged" in capsys.readouterr().out
    written = json.loads(record.read_text())
    assert checked_report(written)["new"]["paths"]["capability"] == "12.0"
