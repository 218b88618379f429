"""What an engine says of itself (domain.engine, workers.engine_info) and where it looks for
its kernel config. The real vLLM's answers are tested in tests/e2e/test_real_vllm.py; here: SGLang's
real server info as its benchmark files embed it, the stand-in, and config folders laid out as
the engines lay them out."""

import json

import pytest

from domain import engine as reports
from localstack.standin import StandinConfig, start_standin_in_thread
from tests import fakes
from workers import engine_info
from workers.engine_info import identify_engine, kernel_config_in_effect, locate_engine_package

FIXTURES = fakes.FIXTURES / "engine_metrics"
AGG = "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
PD = "TonyLi15-sglang-benchmark__pd_1p2d_n100_in512_out128_c64.jsonl"
H200_FP8 = {
    "E": 256,
    "N": 256,
    "device_name": "NVIDIA H200",
    "dtype": "fp8_w8a8",
    "block_shape": [128, 128],
}


def _sglang_server_info(name: str) -> dict:
    # SGLang's benchmark writes a bare Infinity for request_rate; json accepts it.
    return json.loads((FIXTURES / name).read_text().splitlines()[0])["server_info"]


def test_sglangs_server_info_gives_its_version_arguments_and_flags():
    identity = reports.from_sglang_server_info(_sglang_server_info(AGG), source="result file")

    assert (identity["engine"], identity["version"]) == ("sglang", "0.5.5.post3")
    assert identity["args"]["attention_backend"] == "fa3"
    assert identity["args"]["tp_size"] == 1
    assert identity["allreduce_fusion"] is False
    # SGLang left its cap unset (None): nothing is made up
    assert identity["max_running_requests"] is None
    assert "internal_states" not in identity["args"] and "version" not in identity["args"]
    json.dumps(identity, allow_nan=False)


def test_the_cap_is_found_in_the_schedulers_state_and_behind_a_router():
    info = _sglang_server_info(AGG)
    info["internal_states"][0]["max_running_requests"] = 256
    identity = reports.from_sglang_server_info(info, source="/get_server_info")
    assert identity["max_running_requests"] == 256

    pd = reports.from_sglang_server_info(_sglang_server_info(PD), source="/get_server_info")
    assert pd["engine"] == "sglang" and pd["max_running_requests"] is None


def test_a_set_flag_and_cap_are_read_from_the_arguments():
    info = {**_sglang_server_info(AGG), "max_running_requests": 64}
    info["enable_flashinfer_allreduce_fusion"] = True
    identity = reports.from_sglang_server_info(info, source="/get_server_info")

    assert identity["max_running_requests"] == 64
    assert identity["max_running_requests_source"] == "/get_server_info max_running_requests"
    assert identity["allreduce_fusion"] is True


@pytest.fixture(scope="module")
def standin():
    url, stop = start_standin_in_thread(StandinConfig(model="m", max_running_requests=4))
    yield url
    stop()


def test_the_stand_in_says_it_is_a_stand_in(standin):
    identity = identify_engine(standin)

    assert identity["reachable"] and identity["engine"] == "standin"
    assert identity["max_running_requests"] == 4
    assert [m["id"] for m in identity["models"]] == ["m"]
    assert reports.label(identity) == "stand-in"


def test_nothing_answering_is_said_plainly(free_port):
    identity = identify_engine(f"http://127.0.0.1:{free_port()}")

    assert identity["reachable"] is False
    assert "Connection refused" in identity["error"] or "ConnectError" in identity["error"]


@pytest.fixture
def vllm_whose_server_info_fails():
    """A vLLM-like server on a free port whose /server_info answers what the test sets."""
    answer = {}

    def answering(path):
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "m", "owned_by": "vllm"}]})
        if path == "/version":
            return 200, json.dumps({"version": "0.11.0"})
        if path.startswith("/server_info"):
            return answer["status"], answer["body"], answer.get("after_s", 0)
        return 404, json.dumps({"detail": "Not Found"})

    with fakes.scripted_http_server(answering) as url:
        yield url, answer


def test_a_failing_server_info_keeps_the_engines_words_or_only_the_status_line(
    vllm_whose_server_info_fails,
):
    url, answer = vllm_whose_server_info_fails
    # an answer that is not the engine's (a proxy's page): its body is not kept
    answer.update(status=502, body="<html><body>upstream 10.0.0.7:8000 token=s3cr3t</body></html>")
    (note,) = identify_engine(url)["notes"]
    assert note == "vLLM's /server_info answered 502: Bad Gateway"

    # the engine's own OpenAI-style error is its words
    answer.update(status=500, body=json.dumps({"error": {"message": "EngineCore died"}}))
    (note,) = identify_engine(url)["notes"]
    assert note == "vLLM's /server_info answered 500: EngineCore died"


def test_a_server_info_slower_than_the_checks_timeout_is_still_read(
    vllm_whose_server_info_fails, monkeypatch
):
    # vLLM's first /server_info after a start collects the system's environment: 10.4 s on 2
    # busy cores, past the 10 s the other questions get; the cap is read all the same
    url, answer = vllm_whose_server_info_fails
    config = {"scheduler_config": {"max_num_seqs": 4}}
    answer.update(status=200, body=json.dumps({"vllm_config": config, "vllm_env": {}}), after_s=1)
    identity = identify_engine(url, timeout_s=0.5)
    assert identity["max_running_requests"] == 4
    assert identity["notes"] == []

    # past its own limit: the note says it did not answer, not "answered None"
    monkeypatch.setattr(engine_info, "SERVER_INFO_TIMEOUT_S", 0.2)
    (note,) = identify_engine(url, timeout_s=0.1)["notes"]
    assert note.startswith("vLLM's /server_info did not answer: ReadTimeout")
    assert identify_engine(url, timeout_s=0.1)["max_running_requests"] is None


def _package(tmp_path, engine, triton="3.7.1"):
    return {"package_dir": str(tmp_path / engine), "triton": triton, "error": ""}


def test_vllm_reads_the_tuned_folder_it_reports_before_its_own(tmp_path):
    name = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    shipped = tmp_path / "vllm/model_executor/layers/fused_moe/configs"
    shipped.mkdir(parents=True)
    (shipped / name).write_text('{"1": {}}')
    package = _package(tmp_path, "vllm")

    found = kernel_config_in_effect(engine="vllm", shape=H200_FP8, package=package)
    assert (found["state"], found["shipped"]) == ("file", True)
    assert found["path"] == str(shipped / name)

    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / name).write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(tuned)}
    found = kernel_config_in_effect(
        engine="vllm", shape=H200_FP8, reported_env=env, package=package
    )
    assert (found["state"], found["shipped"], found["folder"]) == (
        "file",
        False,
        "VLLM_TUNED_CONFIG_FOLDER",
    )
    assert len(found["sha256"]) == 64


def test_without_a_file_the_engine_runs_its_default(tmp_path):
    (tmp_path / "vllm/model_executor/layers/fused_moe/configs").mkdir(parents=True)
    shape = {**H200_FP8, "E": 8, "N": 64, "dtype": "bf16", "block_shape": None}

    found = kernel_config_in_effect(engine="vllm", shape=shape, package=_package(tmp_path, "vllm"))

    assert found["state"] == "engine_default"
    assert found["file_name"] == "E=8,N=64,device_name=NVIDIA_H200.json"


def test_sglang_reads_its_tritons_folder_then_the_newest_other(tmp_path):
    name = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    configs = tmp_path / "sglang/srt/layers/moe/moe_runner/triton_utils/configs"
    for folder in ("triton_3_1_0", "triton_3_4_0"):
        (configs / folder).mkdir(parents=True)
        (configs / folder / name).write_text("{}")
    package = _package(tmp_path, "sglang", triton="3.7.1")

    found = kernel_config_in_effect(engine="sglang", shape=H200_FP8, package=package)
    assert found["state"] == "file" and found["path"].endswith(f"triton_3_4_0/{name}")
    assert "fallback" in found["folder"]

    (configs / "triton_3_7_1").mkdir()
    (configs / "triton_3_7_1" / name).write_text("{}")
    found = kernel_config_in_effect(engine="sglang", shape=H200_FP8, package=package)
    assert found["path"].endswith(f"triton_3_7_1/{name}") and "fallback" not in found["folder"]


def test_no_gpu_or_fp4_weights_mean_no_triton_config_applies(tmp_path):
    package = _package(tmp_path, "vllm")
    no_gpu = kernel_config_in_effect(
        engine="vllm", shape={**H200_FP8, "device_name": None}, package=package
    )
    fp4 = kernel_config_in_effect(
        engine="vllm",
        shape={**H200_FP8, "dtype": None, "reason": "nvfp4 MoE weights run on kernels …"},
        package=package,
    )

    assert no_gpu["state"] == fp4["state"] == "not_applicable"
    assert fp4["reason"].startswith("nvfp4")


def test_an_engine_not_installed_here_is_said_so():
    found = locate_engine_package("sglang")

    assert found["package_dir"] is None
    assert "MOEOPS_SGLANG_PYTHON" in found["error"]
