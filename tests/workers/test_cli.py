import json
import os
import shutil

import httpx
import pytest

from moeops.kernels.models import KernelConfig
from moeops.runs.models import LevelResult, SweepRun, Workload
from moeops.wsgi import application
from tests.api_base import make_world, wsgi_in_test_transaction
from tests.fakes import FIXTURES, python_module
from workers import cli

SGLANG_AGG = FIXTURES / "results" / "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
RTX_FP8 = (
    "E=128,N=2048,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,"
    "dtype=fp8_w8a8,block_shape=[128,128].json"
)


@pytest.fixture
def world(db, monkeypatch):
    monkeypatch.setenv("MOEOPS_URL", "http://testserver")
    with wsgi_in_test_transaction():
        world = make_world()
        monkeypatch.setenv("MOEOPS_TOKEN", world.owner_token)
        yield world


def _run(argv, capsys):
    code = cli.main(argv, transport=httpx.WSGITransport(app=application))
    out, err = capsys.readouterr()
    return code, out, err


def _imported_only_when_told(argv, capsys, measured):
    """An import of a file that measured another model: refused naming what it `measured`,
    nothing stored; then stored with --accept-mismatch. Returns what that import printed."""
    code, out, err = _run(argv, capsys)
    assert code == 1
    assert err.startswith(f"error: 409: content: the file measured {measured}")
    assert not SweepRun.objects.exists()
    code, out, err = _run([*argv, "--accept-mismatch"], capsys)
    assert (code, err) == (0, "")
    return out


def _shell(*args, env=None):
    return python_module("workers.cli", *args, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", ["import-results", "push-config", "export-config", "runs"])
def test_every_command_has_help(command):
    result = _shell(command, "--help")
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: python -m workers.cli {command}")


def test_a_usage_error_is_one_line():
    result = _shell("import-results", "x.jsonl", "--deployment", "d")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--format" in result.stderr


def test_it_says_when_no_token_is_set():
    env = {key: value for key, value in os.environ.items() if key != "MOEOPS_TOKEN"}
    result = python_module("workers.cli", "runs", "--deployment", "d", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("error: MOEOPS_TOKEN is not set")


def test_an_unreachable_server_is_one_line():
    env = {"MOEOPS_URL": "http://127.0.0.1:9", "MOEOPS_TOKEN": "moe_x"}
    result = _shell("runs", "--deployment", "d", env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: GET http://127.0.0.1:9/api/v1/runs: ConnectError")


def test_it_imports_sglang_results_of_another_model_only_when_told_to(world, capsys):
    argv = ["import-results", str(SGLANG_AGG), "--format", "sglang", "--deployment", "glm-5-sglang"]
    out = _imported_only_when_told(argv, capsys, "Qwen/Qwen2.5-3B-Instruct at TP1")
    run = SweepRun.objects.get()
    assert out == f"1 level(s) in run {run.pk} ({run.uuid}) of glm-5-sglang\n"
    assert run.label == SGLANG_AGG.name
    assert LevelResult.objects.get().output_throughput == pytest.approx(710.7638973941176)
    assert _run([*argv, "--accept-mismatch"], capsys)[0] == 0
    assert SweepRun.objects.count() == 1


def test_it_imports_an_aiperf_summary_of_another_model_only_when_told_to(world, capsys):
    path = FIXTURES / "results" / "aiperf" / "concurrency_4" / "profile_export_aiperf.json"
    argv = ["import-results", str(path), "--format", "aiperf", "--deployment", "glm-5-sglang"]
    _imported_only_when_told(argv, capsys, "tiny-moe; the deployment")
    level = LevelResult.objects.get()
    summary = json.loads(path.read_text())
    assert level.concurrency == 4
    assert level.output_throughput == summary["output_token_throughput"]["avg"]
    assert not level.request_logs.exists()
    # with its per-request records beside it: another import, the records its requests
    records = path.parent / "profile_export.jsonl"
    code, out, err = _run([*argv, "--accept-mismatch", "--requests", str(records)], capsys)
    assert (code, err) == (0, "")
    logged = LevelResult.objects.exclude(pk=level.pk).get()
    assert logged.request_logs.get().count == len(records.read_text().splitlines())


def test_it_imports_an_inference_perf_stage_with_its_config_as_the_model_it_names(world, capsys):
    folder = FIXTURES / "results" / "inference-perf"
    path = folder / "stage_1_lifecycle_metrics.json"
    argv = ["import-results", str(path), "--format", "inference-perf"]
    argv += ["--deployment", "glm-5-sglang", "--config", str(folder / "config.yml")]
    _imported_only_when_told(argv, capsys, "tiny-moe on vLLM; the deploy")
    run = SweepRun.objects.get()
    assert run.other_model == "tiny-moe" and run.levels.get().concurrency == 4


def test_it_reports_the_bad_lines_of_a_file(world, capsys):
    broken = FIXTURES / "results" / "sglang_broken.jsonl"
    argv = ["import-results", str(broken), "--format", "sglang", "--deployment", "glm-5-sglang"]
    code, out, err = _run(argv, capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: 400: content: line 2: not JSON")
    assert err.count("\n") == 1
    assert not SweepRun.objects.exists()


def test_it_reports_unreadable_files(world, capsys, tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"tag": "caf\xe9"}\n')
    code, _, err = _run(
        ["import-results", str(latin), "--format", "vllm", "--deployment", "x"], capsys
    )
    assert code == 1 and err == f"error: {latin}: not UTF-8 text (byte 12)\n"
    code, _, err = _run(["push-config", str(tmp_path / "nope.json")], capsys)
    assert code == 1 and err == f"error: {tmp_path / 'nope.json'}: no such file\n"


def test_it_pushes_and_exports_a_config(world, capsys, tmp_path):
    code, out, _ = _run(["push-config", str(FIXTURES / "kernel_configs" / RTX_FP8)], capsys)
    assert code == 0
    config = KernelConfig.objects.get()
    assert out.startswith(f"kernel config {config.pk}: NVIDIA RTX PRO 6000")
    code, out, _ = _run(
        ["export-config", str(config.pk), "--style", "vllm", "--out", str(tmp_path)], capsys
    )
    assert code == 0
    written = tmp_path / RTX_FP8
    assert out == f"{written}\n"
    assert written.read_text() == (FIXTURES / "kernel_configs" / RTX_FP8).read_text()
    code, out, _ = _run(
        ["export-config", str(config.pk), "--style", "sglang", "--out", str(tmp_path)], capsys
    )
    sglang = tmp_path / "triton_3_6_0" / RTX_FP8.replace("[128,128]", "[128, 128]")
    assert out == f"{sglang}\n"
    assert "triton_version" not in json.loads(sglang.read_text())


def test_it_reads_the_triton_version_from_an_sglang_folder(world, capsys, tmp_path):
    folder = tmp_path / "triton_3_4_0"
    folder.mkdir()
    name = "E=128,N=1024,device_name=AMD_Instinct_MI300X.json"
    shutil.copy(FIXTURES / "kernel_configs" / name, folder / name)
    assert _run(["push-config", str(folder / name)], capsys)[0] == 0
    config = KernelConfig.objects.get()
    assert config.triton_version == "3.4.0"
    assert config.original_file_name == f"triton_3_4_0/{name}"


def test_it_refuses_a_config_with_a_wrong_name(world, capsys, tmp_path):
    wrong = tmp_path / "tuned.json"
    wrong.write_text("{}")
    code, _, err = _run(["push-config", str(wrong)], capsys)
    assert code == 1
    assert err.startswith("error: 400: file_name: 'tuned.json' is not a fused-MoE config file name")


def test_it_lists_runs_as_a_table(world, capsys):
    _run(
        ["import-results", str(SGLANG_AGG), "--format", "sglang", "--deployment", "glm-5-sglang"]
        + ["--accept-mismatch"],
        capsys,
    )
    world.run(label="queued sweep")
    world.run(deployment=world.other_deployment, label="elsewhere")
    code, out, _ = _run(["runs", "--deployment", "glm-5-sglang"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "UUID",
        "STATUS",
        "SOURCE",
        "LEVELS",
        "PEAK",
        "TOK/S",
        "CREATED",
        "LABEL",
    ]
    assert len(lines) == 3
    assert "queued sweep" in lines[1] and lines[1].split()[2:5] == ["queued", "worker", "0"]
    assert lines[2].split()[2:6] == ["succeeded", "import", "1", "710.8"]
    code, out, _ = _run(["runs", "--deployment", "glm-5-sglang", "--limit", "1"], capsys)
    assert out.splitlines()[-1] == "(1 of 2 runs; --limit shows more)"


def test_an_unknown_deployment_is_one_line(world, capsys):
    code, _, err = _run(["runs", "--deployment", "nope"], capsys)
    assert code == 0
    argv = ["import-results", str(SGLANG_AGG), "--format", "sglang", "--deployment", "nope"]
    code, _, err = _run(argv, capsys)
    assert code == 1 and err == "error: 404: deployment 'nope' not found\n"


def test_push_workload_stores_a_dataset_and_names_a_bad_file(world, capsys, tmp_path):
    good = tmp_path / "chats.jsonl"
    good.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n')
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01\x02")

    code, out, _ = _run(["push-workload", "chats", "--dataset", str(good)], capsys)
    refused, _, err = _run(["push-workload", "blob", "--dataset", str(binary)], capsys)

    assert code == 0 and out.strip() == "workload chats v1 (dataset, 1 prompts)"
    assert refused == 1
    assert "weights.bin, line 1: a NUL byte: the file is binary, not text" in err
    assert list(Workload.objects.values_list("name", flat=True)) == ["chats"]


def test_sweep_queues_a_run_that_names_the_workload(world, capsys, tmp_path):
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save()
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "kind": "random",
                "input": {"distribution": "uniform", "low": 100, "high": 300},
                "output": {"distribution": "fixed", "value": 64},
            }
        )
    )
    assert _run(["push-workload", "spread", "--spec", str(spec)], capsys)[0] == 0

    code, out, err = _run(
        ["sweep", "--deployment", "glm-5-sglang", "--levels", "8,16", "--workload", "spread"],
        capsys,
    )

    assert code == 0, err
    run = SweepRun.objects.get()
    assert out.strip() == f"run {run.pk} ({run.uuid}) queued on rtx-pro-6000"
    assert run.parameters["workload"]["name"] == "spread"
    assert run.snapshot["workload"]["version"] == 1


def test_sweep_asks_for_a_profiled_level_and_a_level_it_does_not_run_is_refused(world, capsys):
    world.deployment.endpoint_url = "http://127.0.0.1:30000"
    world.deployment.save()
    base = ["sweep", "--deployment", "glm-5-sglang", "--levels", "8,16"]

    code, _, err = _run([*base, "--profile-levels", "16", "--profile-steps", "25"], capsys)
    refused, _, refusal = _run([*base, "--profile-levels", "32"], capsys)

    assert code == 0, err
    assert SweepRun.objects.get().parameters["profile"] == {"levels": [16], "steps": 25}
    assert refused == 1 and "profile" in refusal and "32" in refusal
    assert len(refusal.strip().splitlines()) == 1


def test_push_workload_stores_a_trace_with_its_block_size_and_speed(world, capsys, tmp_path):
    trace = tmp_path / "day.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 9, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}\n'
    )
    argv = ["push-workload", "day", "--trace", str(trace), "--block-size", "16", "--speed", "2"]

    code, out, _ = _run(argv, capsys)
    refused, _, err = _run(["push-workload", "day", "--trace", str(trace)], capsys)

    assert code == 0 and out.strip() == "workload day v1 (trace, 2 requests)"
    assert Workload.objects.get().spec == {"kind": "trace", "block_size": 16, "speed": 2.0}
    # 512-token blocks: the first line's 40 tokens do not reach its third block
    assert refused == 1 and "day.jsonl, line 1: input_length: 40 tokens" in err
    assert Workload.objects.count() == 1
