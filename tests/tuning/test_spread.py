"""One tune spread over several GPUs: real worker processes on CPU running the real Tuner on
test_tuner's synthetic timings (`fake_tune`), each recording the GPU it was given."""

import functools
import json
import os
from pathlib import Path

import pytest

from tests.fakes import HF_CONFIGS, SHAPE, FakeMeasurements
from tuning import spread
from tuning.__main__ import main as tuning_main
from tuning.config_files import TUNED_BATCH_SIZES
from tuning.spread import (
    NVLS_OFF,
    SpreadTuneError,
    expected_cost,
    host_compile_workers,
    share_batch_sizes,
    spread_tune,
)
from tuning.tune_results import write_config_files
from tuning.tuner import Tuner

FAKE_TUNE = "tests.tuning.test_spread:fake_tune"
FAIL_AT_M = "SPREAD_TEST_FAIL_AT_M"
RECORD_DIR = "SPREAD_TEST_RECORD_DIR"

fake_spread_tune = functools.partial(spread_tune, tune_function=FAKE_TUNE)


class FailingMeasurements(FakeMeasurements):
    """FakeMeasurements whose GPU "faults" when the timers of batch size fail_at are built."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at = fail_at

    def timer(self, M, routing=None):
        if self.fail_at == M:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (M={M})")
        return super().timer(M, routing)


def fake_tune(
    shape,
    batch_sizes,
    *,
    device_index,
    exhaustive,
    down,
    progress_callback,
    resume_path,
    compile_workers,
    compile_shard,
    engine=None,
    routing=None,
    also_under=None,
):
    """tuning.tuner.tune in a worker process, on synthetic timings: the real Tuner (search,
    chunks, log, resume, timeline) over FakeMeasurements. Records in $SPREAD_TEST_RECORD_DIR
    what this process saw and which batch sizes it timed; fails at M=$SPREAD_TEST_FAIL_AT_M."""
    measurements = FailingMeasurements(int(os.environ.get(FAIL_AT_M, "0")))
    if routing is not None:
        measurements.routing = routing
    try:
        with Tuner(shape, measurements) as tuner:
            return tuner.tune(
                batch_sizes,
                exhaustive=exhaustive,
                down=down,
                progress_callback=progress_callback,
                resume_path=resume_path,
                also_under=also_under,
            )
    finally:
        record = {
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_index": device_index,
            "share": list(batch_sizes),
            "timed": sorted({m for m, _, _ in measurements.timed}),
            "env": {k: os.environ.get(k) for k in [*NVLS_OFF, "CUDA_DEVICE_ORDER"]},
            "compile_workers": compile_workers,
            "compile_shard": compile_shard,
            "routing": routing.as_dict() if routing else None,
        }
        Path(os.environ[RECORD_DIR], f"{os.getpid()}.json").write_text(json.dumps(record))


@pytest.fixture
def records(tmp_path, monkeypatch):
    """The worker processes' records, read back (and cleared) by calling the fixture's value."""
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setenv(RECORD_DIR, str(folder))
    monkeypatch.delenv(FAIL_AT_M, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def read_and_clear():
        paths = sorted(folder.iterdir())
        found = [json.loads(p.read_text()) for p in paths]
        for path in paths:
            path.unlink()
        return sorted(found, key=lambda r: r["visible"])

    return read_and_clear


def _single_process_files(tmp_path, batch_sizes):
    result = Tuner(SHAPE, FakeMeasurements()).tune(batch_sizes)
    paths = write_config_files(result, tmp_path / "single", "sglang")
    return {p.name: p.read_text() for p in paths}


def _spread_sglang_over_two_gpus(out_dir):
    """All the engines' batch sizes over GPUs 0 and 1 on fake_tune; SGLang files in out_dir."""
    return fake_spread_tune(SHAPE, TUNED_BATCH_SIZES, [0, 1], out_dir=out_dir, style="sglang")


def _files(folder):
    """The engine files under folder (not the tuning logs)."""
    return {p.name: p.read_text() for p in folder.rglob("*.json") if "spread-logs" not in p.parts}


def test_batch_sizes_are_shared_out_by_expected_cost():
    assert expected_cost(4096) > expected_cost(1024) > expected_cost(256) > expected_cost(1)

    for gpus in (2, 3, 4, 8):
        shares = share_batch_sizes(TUNED_BATCH_SIZES, gpus)
        assert sorted(m for share in shares for m in share) == sorted(TUNED_BATCH_SIZES)
        loads = [sum(map(expected_cost, share)) for share in shares]
        # longest first, least loaded next: no GPU ends more than one size over another
        assert max(loads) - min(loads) <= expected_cost(4096)
    two = share_batch_sizes(TUNED_BATCH_SIZES, 2)
    assert (4096 in two[0]) != (3072 in two[0])
    assert share_batch_sizes([1, 4096], 3) == [[4096], [1], []]


def test_a_hosts_compile_processes_are_shared_out_over_its_gpu_processes(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    # one process alone gets the tuner's 32 at most
    assert [host_compile_workers(n) for n in (1, 2, 4, 8)] == [32, 32, 31, 15]
    # the CPUs per GPU process, one of them left for timing, and at least one
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [host_compile_workers(n) for n in (1, 2, 8, 16)] == [15, 7, 1, 1]


def test_every_batch_size_is_tuned_once_each_process_on_its_own_gpu(tmp_path, records):
    progress = []

    result = fake_spread_tune(
        SHAPE,
        TUNED_BATCH_SIZES,
        [0, 1, 3],
        out_dir=tmp_path / "out",
        progress_callback=lambda *a: progress.append(a),
    )

    seen = records()
    shares = share_batch_sizes(TUNED_BATCH_SIZES, 3)
    assert [r["visible"] for r in seen] == ["0", "1", "3"]
    for record, share in zip(seen, shares, strict=True):
        assert record["device_index"] == 0
        assert record["share"] == record["timed"] == share
        assert record["env"] == {**NVLS_OFF, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert record["compile_workers"] >= 1
    assert [r["compile_shard"] for r in seen] == [[0, 3], [1, 3], [2, 3]]
    timed = [m for r in seen for m in r["timed"]]
    assert sorted(timed) == sorted(TUNED_BATCH_SIZES)
    assert sorted(result.batches) == sorted(TUNED_BATCH_SIZES)
    assert progress[-1] == (progress[-1][1], progress[-1][1], "done")
    assert all(done < total for done, total, _ in progress[:-1])
    assert {message.split(":")[0] for _, _, message in progress[:-1]} == {"GPU 0", "GPU 1", "GPU 3"}


def test_a_spread_tune_under_skewed_routing_keeps_logs_of_its_own(tmp_path, records):
    from tuning.routing import parse_routing

    zipf = parse_routing("zipf:1.2")

    skewed = fake_spread_tune(SHAPE, [1, 64], [0, 1], out_dir=tmp_path, routing=zipf)

    assert [r["routing"] for r in records()] == [zipf.as_dict()] * 2
    assert skewed.routing == zipf.as_dict()
    assert [p.name for p in (tmp_path / "spread-logs").glob("*_zipf-1.2.json")]
    # timed under uniform routing too, in each process
    assert {b.also_under["routing"]["kind"] for b in skewed.batches.values()} == {"uniform"}
    # a uniform tune of the same shape resumes nothing of it; asked, it checks itself under zipf
    uniform = fake_spread_tune(SHAPE, [1, 64], [0, 1], out_dir=tmp_path, also_under=zipf)
    assert sorted(m for r in records() for m in r["timed"]) == [1, 64]
    assert uniform.routing == {"kind": "uniform"}
    assert [b.also_under["routing"] for b in uniform.batches.values()] == [zipf.as_dict()] * 2


def test_the_timeline_says_where_each_gpus_seconds_went(tmp_path, records):
    result = fake_spread_tune(SHAPE, [1, 64, 1024], [0, 2], log_dir=tmp_path)

    assert sorted(result.timeline) == [0, 2]
    for process in result.timeline.values():
        # set-up counted from the launch: Python's start and the imports at least
        assert process.setup_s > 0.05
        assert process.pool_start_s == FakeMeasurements.pool_start_s
        assert 0 <= process.compile_s < process.tune_s


def test_the_merged_file_equals_a_single_process_tune(tmp_path, records):
    _spread_sglang_over_two_gpus(tmp_path / "spread")

    files = _files(tmp_path / "spread")
    assert files == _single_process_files(tmp_path, TUNED_BATCH_SIZES)
    assert any(name.endswith("_down.json") for name in files)


def test_gpu_indices_are_positions_in_this_processs_visible_devices(tmp_path, records, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")

    fake_spread_tune(SHAPE, [1, 64], [0, 2], log_dir=tmp_path)

    assert [r["visible"] for r in records()] == ["4", "6"]
    with pytest.raises(ValueError, match="not among CUDA_VISIBLE_DEVICES"):
        fake_spread_tune(SHAPE, [1, 64], [0, 3], log_dir=tmp_path, fresh=True)


def _spread_with_gpu_0_failing(tmp_path, monkeypatch):
    """A 2-GPU tune whose GPU 0 faults at M=4096, after its first chunk of 6 sizes."""
    monkeypatch.setenv(FAIL_AT_M, "4096")
    with pytest.raises(SpreadTuneError) as raised:
        _spread_sglang_over_two_gpus(tmp_path / "out")
    monkeypatch.delenv(FAIL_AT_M)
    return raised.value


def test_a_failing_process_is_reported_with_its_sizes_and_the_rest_kept(
    tmp_path, records, monkeypatch
):
    error = _spread_with_gpu_0_failing(tmp_path, monkeypatch)

    gpu_0, gpu_1 = share_batch_sizes(TUNED_BATCH_SIZES, 2)
    missing = gpu_0[6:]
    assert 4096 in missing
    (failure,) = error.failures
    assert (failure.gpu_index, failure.batch_sizes) == (0, missing)
    assert failure.returncode != 0
    assert "illegal memory access" in failure.stderr_tail
    assert "GPU 0 (batch sizes 512, 1536, 4096)" in str(error)
    assert sorted(error.result.batches) == sorted(set(TUNED_BATCH_SIZES) - set(missing))
    assert not (tmp_path / "out" / "triton_3_6_0").exists()
    assert [r["timed"] for r in records()] == [gpu_0[:6], gpu_1]


def test_a_rerun_tunes_only_the_missing_sizes(tmp_path, records, monkeypatch):
    _spread_with_gpu_0_failing(tmp_path, monkeypatch)
    records()
    missing = share_batch_sizes(TUNED_BATCH_SIZES, 2)[0][6:]

    result = _spread_sglang_over_two_gpus(tmp_path / "out")

    seen = records()
    assert sorted(m for r in seen for m in r["timed"]) == missing
    assert len(seen) == 2
    assert sorted(result.batches) == sorted(TUNED_BATCH_SIZES)
    assert _files(tmp_path / "out") == _single_process_files(tmp_path, TUNED_BATCH_SIZES)

    again = fake_spread_tune(SHAPE, TUNED_BATCH_SIZES, [0, 1], out_dir=tmp_path / "out")

    assert records() == []
    assert again.entries() == result.entries()


def test_the_cli_spreads_when_given_several_gpus(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_spread(shape, batch_sizes, gpu_indices, **kwargs):
        calls.append((shape, batch_sizes, gpu_indices, kwargs["log_dir"]))
        return Tuner(shape, FakeMeasurements()).tune(batch_sizes)

    monkeypatch.setattr(spread, "spread_tune", fake_spread)
    config = str(HF_CONFIGS / "glm-5-fp8_config.json")
    argv = ["tune", "--model-config", config, "--tp", "8", "--dtype", "bf16"]
    argv += ["--out", str(tmp_path), "--batch-sizes", "1,64"]

    assert tuning_main([*argv, "--gpus", "0,2"]) == 0

    ((shape, sizes, gpus, log_dir),) = calls
    assert (shape, sizes, gpus, log_dir) == (SHAPE, (1, 64), (0, 2), tmp_path / "spread-logs")
    out = capsys.readouterr().out
    assert "E=256,N=256,device_name=NVIDIA_H200.json" in out
    assert "M=   64  tuned" in out
    assert tuning_main([*argv, "--gpus", "0,0"]) == 2
    assert "distinct GPU indices" in capsys.readouterr().err


def test_the_cli_reports_a_failed_gpu(tmp_path, monkeypatch, capsys):
    def failing_spread(*args, **kwargs):
        failure = spread.ProcessFailure(1, [4096], 1, "RuntimeError: boom", tmp_path / "e.txt")
        raise SpreadTuneError([failure], None, tmp_path)

    monkeypatch.setattr(spread, "spread_tune", failing_spread)
    config = str(HF_CONFIGS / "glm-5-fp8_config.json")

    code = tuning_main(
        ["tune", "--model-config", config, "--tp", "8", "--out", str(tmp_path), "--gpus", "0,1"]
    )

    assert code == 1
    err = capsys.readouterr().err
    assert "GPU 1 (batch sizes 4096) exited with 1: RuntimeError: boom" in err
    assert "run again to tune only the missing ones" in err


@pytest.mark.parametrize(
    ("gpu_indices", "processes"),
    [
        ([2, 3], [("2", [4096]), ("3", [1, 64, 1024])]),
        # one GPU too: a process of its own, which may start compile processes
        ([1], [("1", [1, 64, 1024, 4096])]),
    ],
)
def test_the_worker_task_tunes_in_a_process_per_gpu(
    tune_client, tmp_path, records, gpu_indices, processes
):
    from moeops.kernels import services as kernel_services
    from workers import kernel_tune

    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=256, N=256, hidden_size=6144, topk=8
    )

    outcome = kernel_tune.tune_kernel(
        str(tuning_run.uuid),
        client=client,
        E=256,
        N=256,
        hidden_size=6144,
        topk=8,
        batch_sizes=[1, 64, 1024, 4096],
        gpu_indices=gpu_indices,
        spread=fake_spread_tune,
    )

    assert outcome == "succeeded"
    assert [(r["visible"], r["timed"]) for r in records()] == processes
    tuning_run.refresh_from_db()
    assert tuning_run.status == "succeeded"
    assert sorted(t.batch_size for t in tuning_run.timings.all()) == [1, 64, 1024, 4096]
    assert sorted(tuning_run.result.entries, key=int) == ["1", "64", "1024", "4096"]
    assert (tmp_path / "tune" / str(tuning_run.uuid)).is_dir()
