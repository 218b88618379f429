"""`python -m tuning engine-diff` between vLLM versions read from their wheels (tests.engine)."""

from tests.engine import engine_source
from tests.fakes import HF_CONFIGS
from tuning.__main__ import main

GLM5_FP8 = ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]
UP = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]"


def _diff(capsys, old, new, *extra):
    status = main(["engine-diff", "--engine", "vllm", "--from", old, "--to", new, *extra])
    return status, capsys.readouterr()


def test_it_names_the_launch_vllm_034_changed_and_its_down_file(capsys):
    old, new = str(engine_source("vllm", "0.33.0")), str(engine_source("vllm", "0.34.0"))

    status, out = _diff(capsys, old, new, *GLM5_FP8)

    assert status == 0
    lines = out.out.splitlines()
    assert lines[0] == "engine-diff 0.33.0 → 0.34.0"
    assert "launcher parameters: +A_is_sorted, +C_is_sorted" in lines
    assert any(line.startswith("kernel source: ") and "→" in line for line in lines)
    assert "entry switches: none → {'USE_TMA': [True, False]}" in lines
    assert f"_down file: none → {UP}_down.json" in lines
    assert "  M=512: USE_TMA=False" in lines
    assert "default rule: the same at every batch size" in lines


def test_a_version_against_itself_changes_nothing(capsys):
    source = str(engine_source("vllm", "0.34.0"))

    status, out = _diff(capsys, source, source, *GLM5_FP8, "--batch-sizes", "1,64")

    assert status == 0
    assert "launcher parameters: unchanged" in out.out and "kernel source: unchanged" in out.out
    assert "shipped file: the same at every batch size" in out.out


def test_a_folder_that_is_no_engine_is_said_in_a_sentence(capsys, tmp_path):
    status, out = _diff(capsys, str(tmp_path), str(engine_source("vllm", "0.34.0")), *GLM5_FP8)

    assert status == 2
    assert out.err.startswith("error: ") and "Traceback" not in out.err
