"""SGLang's own decisions of its fast paths (tuning.sglang_paths), read from SGLang 0.5.23's wheel
(tests.engine): its FlashInfer all-reduce fusion passes evaluated for GLM-5 at each capability."""

import json
import shutil
from pathlib import Path

import pytest

from tests.engine import engine_source
from tuning.engine_paths import source_paths
from workers.cli import main as cli_main

EXAMPLES = Path(__file__).resolve().parents[2] / "moeops" / "examples"

VERSION = "0.5.23"
GLM5 = json.loads((EXAMPLES / "glm-5-fp8_config.json").read_text())
WHERE = "sglang/srt/arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable, SGLang 0.5.23"


@pytest.fixture(scope="module")
def source():
    return engine_source("sglang", VERSION)


def _fusion(source, capability, *, tp=8, config=GLM5, torch_cuda="12.9"):
    installed = {"torch_cuda": torch_cuda} if torch_cuda else {}
    paths = source_paths(
        "sglang",
        capability=capability,
        tp=tp,
        source_dir=source,
        model_config=config,
        installed=installed,
    )
    assert paths.version == VERSION
    return paths.row("allreduce_rms_fusion")


@pytest.mark.parametrize(
    ("capability", "state", "value"),
    [
        ("9.0", "on", "flashinfer (auto)"),
        ("10.0", "on", "flashinfer (auto)"),
        ("12.0", "off", "off"),
    ],
)
def test_glm5_at_tp8_fuses_allreduce_where_sglangs_own_passes_say(source, capability, state, value):
    fusion = _fusion(source, capability)

    assert (fusion.state, fusion.value) == (state, value)
    assert fusion.enabled_on == ["9.0", "10.0", "10.3"]
    assert fusion.evidence[0].where == WHERE


def test_the_on_reason_states_the_conditions_the_passes_read(source):
    fusion = _fusion(source, "9.0")

    assert "GlmMoeDsaForCausalLM is among the architectures it fuses" in fusion.reason
    for condition in ("tp_size=8", "nnodes=1", "attn_dp_size=1", "moe_a2a_backend='none'"):
        assert condition in fusion.reason


def test_the_sm120_reason_names_the_capabilities_the_passes_enable(source):
    fusion = _fusion(source, "12.0")

    assert fusion.reason == (
        "SGLang 0.5.23 runs each layer's all-reduce and its RMSNorm apart on compute capability "
        "12.0 at TP 8: it is enabled only on compute capability 9.0 and 10.x"
    )


@pytest.mark.parametrize("capability", ["9.0", "10.0", "12.0"])
def test_one_gpu_has_no_allreduce_to_fuse(source, capability):
    fusion = _fusion(source, capability, tp=1)

    assert fusion.state == "off"
    assert fusion.reason.endswith("at TP 1: one GPU: no all-reduce to fuse")


def test_an_architecture_outside_its_list_is_not_fused_anywhere(source):
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}

    fusion = _fusion(source, "9.0", config=mixtral)

    assert (fusion.state, fusion.enabled_on) == ("off", [])


def test_an_unknown_torch_cuda_is_the_stated_condition(source):
    fusion = _fusion(source, "10.0", torch_cuda=None)

    assert fusion.state == "depends"
    assert fusion.value == "on where torch is built for CUDA 12.8 or newer"


def test_without_the_models_config_the_fusion_is_unknown_naming_what_it_reads(source):
    fusion = _fusion(source, "9.0", config=None)

    assert fusion.state == "unknown"
    assert "SGLang 0.5.23's _flashinfer_allreduce_fusion_auto_enable" in fusion.reason
    assert "model_config.hf_config.architectures" in fusion.reason


def _copy(source, tmp_path):
    copy = tmp_path / "sglang"
    shutil.copytree(source, copy)
    for info in source.parent.glob("*.dist-info"):
        shutil.copytree(info, tmp_path / info.name)
    return copy


def test_a_renamed_function_is_unknown_naming_function_and_version(source, tmp_path):
    copy = _copy(source, tmp_path)
    overrides = copy / "srt/arg_groups/overrides.py"
    overrides.write_text(
        overrides.read_text().replace(
            "def _flashinfer_allreduce_fusion_auto_enable(", "def _fusion_auto_enable("
        )
    )

    fusion = _fusion(copy, "12.0")

    assert fusion.state == "unknown"
    assert fusion.reason == (
        "SGLang 0.5.23's _flashinfer_allreduce_fusion_auto_enable (srt/arg_groups/overrides.py) "
        "cannot be evaluated: SGLang 0.5.23's srt/arg_groups/overrides.py defines no "
        "_flashinfer_allreduce_fusion_auto_enable"
    )


def test_a_missing_probe_file_is_unknown_naming_it(source, tmp_path):
    copy = _copy(source, tmp_path)
    (copy / "srt/utils/common.py").unlink()

    fusion = _fusion(copy, "9.0")

    assert fusion.state == "unknown"
    assert "srt/utils/common.py" in fusion.reason


def test_the_cli_answers_for_sglang(source, capsys):
    argv = ["engine-paths", "--engine", "sglang", "--source", str(source), "--tp", "8"]
    argv += ["--model-config", str(EXAMPLES / "glm-5-fp8_config.json"), "--json"]

    assert cli_main([*argv, "--capability", "12.0"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert cli_main([*argv, "--capability", "9.0", "--torch-cuda", "12.9"]) == 0
    on = json.loads(capsys.readouterr().out)

    assert (off["engine"], off["version"], off["capability"]) == ("sglang", VERSION, "12.0")
    assert [row["state"] for row in off["rows"]] == ["off"]
    assert [row["value"] for row in on["rows"]] == ["flashinfer (auto)"]


def test_the_example_datas_engine_paths_are_sglangs_own_answer(source):
    # moeops/examples' GLM-5 sweep stores these rows; they must be what the engine decides
    stored = json.loads((EXAMPLES / "glm-5_sglang-0.5.23_sm120_tp8_engine_paths.json").read_text())

    paths = source_paths("sglang", capability="12.0", tp=8, source_dir=source, model_config=GLM5)

    assert stored == paths.model_dump(mode="json")
