"""The tuner's loop on fake measurements (no GPU): results, failures, resume, merge, files, CLI;
and its compile pool's start-up, with worker set-ups that need no GPU."""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine import ensure_installed
from tests.fakes import HF_CONFIGS, SHAPE, FakeMeasurements, FakeTimer
from tuning import compile_only, compile_pool, tune_results, tuner
from tuning.backends.base import KernelBackend, ShippedConfigs
from tuning.backends.builtin import BuiltinBackend
from tuning.bench import BenchRow, format_table
from tuning.compile_pool import CompilePool, compile_order, compile_owner
from tuning.config_files import TUNED_BATCH_SIZES, config_file_name, loads_config, parse_ints
from tuning.search import (
    SHARED_MEMORY_SLACK,
    CoarseToFineSearch,
    KernelShape,
    compile_key,
    config_key,
    neighbours,
    search_space,
    shared_memory_bytes,
)
from tuning.tune_cli import add_arguments, shape_from_args
from tuning.tune_results import (
    TuneResult,
    merge_results,
    write_config_file,
    write_config_files,
)
from tuning.tuner import DeviceMeasurements, Tuner, round_one_configs

ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 16,
    "num_warps": 4,
    "num_stages": 3,
}
SIZES = [1, 64, 1024, 4096]
FP8_BLOCK = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
# How long the slowest worker of a compile pool test takes to set up (s).
SLOW_SET_UP_S = 1.0
# An H200 as compiling for it needs it (Triton's device properties, shared memory above all).
H200 = compile_only.GpuTarget(90, {"max_shared_mem": 232448, "multiprocessor_count": 132})


def set_up_on_cpu(folder: Path, shape_data: dict) -> None:
    """A compile worker's set-up without a GPU: the first worker takes SLOW_SET_UP_S, the
    others none; each writes time.time() when done to folder/ready-<pid>."""
    try:
        (folder / "slow").touch(exist_ok=False)
        time.sleep(SLOW_SET_UP_S)
    except FileExistsError:
        pass
    (folder / f"ready-{os.getpid()}").write_text(repr(time.time()))


def note_the_imports(folder: Path, shape_data: dict) -> None:
    """A compile worker's set-up that writes which of the heavy modules it found imported."""
    found = [m for m in compile_pool.COMPILE_WORKER_PRELOAD if m in sys.modules]
    (folder / f"imports-{os.getpid()}").write_text(json.dumps(found))


def note_the_gpus(folder: Path, shape_data: dict) -> None:
    """A compile worker's set-up that writes the GPUs torch lets it see."""
    (folder / f"gpus-{os.getpid()}").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))


def set_up_that_fails(shape_data: dict) -> None:
    raise RuntimeError("out of memory")


def _keys(configs):
    return [compile_key(c) for c in configs]


def _default_keys(shape, sizes):
    from tuning.fused_moe import default_config

    block = list(shape.block_shape) if shape.block_shape else None
    return {
        compile_key(default_config(m, shape.E, shape.N, shape.H, shape.top_k, shape.dtype, block))
        for m in sizes
    }


def test_it_tunes_every_batch_size_and_never_picks_a_failure():
    measurements = FakeMeasurements()
    progress = []

    with Tuner(SHAPE, measurements) as tuner:
        result = tuner.tune([1, 64, 1024], progress_callback=lambda *a: progress.append(a))

    assert measurements.closed
    assert sorted(result.batches) == [1, 64, 1024]
    for batch in result.batches.values():
        assert batch.tuned_us <= batch.default_us
        assert not (batch.config["BLOCK_SIZE_N"] == 256 and batch.config["num_stages"] == 5)
        assert not (batch.config["BLOCK_SIZE_M"] == 16 and batch.config["num_warps"] == 8)
        assert batch.floor_us == pytest.approx(5.0 * batch.M**0.5, rel=1e-3)
        assert batch.candidates_tried > 0
    assert any(b.failures for b in result.batches.values())
    assert progress[-1][0] == progress[-1][1]
    assert result.speedup_geomean() >= 1.0


def test_gemm_2_gets_its_own_config_with_gemm_1s_block_size_m():
    result = Tuner(SHAPE, FakeMeasurements()).tune([64, 1024])

    for batch in result.batches.values():
        down, up = batch.down_config, batch.config
        assert down["BLOCK_SIZE_M"] == up["BLOCK_SIZE_M"]
        assert (down["BLOCK_SIZE_N"], down["BLOCK_SIZE_K"]) == (128, 256)
        assert batch.tuned_us < batch.shared_config_us
    assert sorted(result.down_entries()) == [64, 1024]


def test_it_times_a_config_pair_as_asked():
    tuner = Tuner(SHAPE, FakeMeasurements())
    up = {**ENTRY, "BLOCK_SIZE_N": 64}
    down = {**ENTRY, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256}

    shared, paired = tuner.time_configs(64, [up, up], down_configs=[None, down])

    assert paired < shared


def test_the_down_search_can_be_left_out():
    result = Tuner(SHAPE, FakeMeasurements()).tune([64], down=False)

    assert result.batches[64].down_config is None and result.down_entries() == {}


class RtxPro6000Measurements(FakeMeasurements):
    """FakeMeasurements on an sm_120 GPU, whose blocks may opt into 99 KiB of shared memory."""

    device_name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    target = compile_only.target_for(120)


def test_it_searches_within_the_gpus_own_shared_memory_and_records_it(capsys):
    measurements = RtxPro6000Measurements()

    result = Tuner(SHAPE, measurements).tune([64, 1024, 4096])

    engine_own = {config_key(BuiltinBackend().default_config(SHAPE, m)) for m in result.batches}
    searched = [c for _, c, _ in measurements.timed if config_key(c) not in engine_own]
    assert searched
    # one tile fewer in flight on 12.0 than on 9.0, and the slack beside them
    needed = max(shared_memory_bytes(c, 2, 120) for c in searched) + SHARED_MEMORY_SLACK
    assert needed <= 101376
    # on an H100's limit the search goes past it
    h200 = FakeMeasurements()
    Tuner(SHAPE, h200).tune([4096])
    assert max(shared_memory_bytes(c, 2) for _, c, _ in h200.timed) > 101376
    assert result.limits == {"capability": 120, "shared_memory_bytes": 101376}
    assert tune_results.TuneResult.from_dict(result.to_dict()).limits == result.limits
    tune_results.print_summary(result)
    assert "compute capability 12.0's 101376 bytes" in capsys.readouterr().out


def test_it_compiles_each_kernel_once():
    measurements = FakeMeasurements()

    Tuner(SHAPE, measurements).tune([16, 24, 32])

    assert len(measurements.compiled) == len(set(measurements.compiled))


def test_it_resumes_from_its_log(tmp_path):
    log = tmp_path / "log.json"
    Tuner(SHAPE, FakeMeasurements()).tune([1, 2], resume_path=log)
    measurements = FakeMeasurements()

    result = Tuner(SHAPE, measurements).tune([1, 2, 4], resume_path=log)

    assert sorted(result.batches) == [1, 2, 4]
    assert {m for m, _, _ in measurements.timed} == {4}


def test_a_damaged_log_is_named_and_nothing_is_timed(tmp_path):
    log = tmp_path / "log.json"
    log.write_text('{"batches": ')
    measurements = FakeMeasurements()

    with pytest.raises(tune_results.TuningLogError, match=f"{log} is not a tuning log"):
        Tuner(SHAPE, measurements).tune([1, 2], resume_path=log)

    assert measurements.timed == []


def test_a_log_of_another_shape_is_not_resumed(tmp_path):
    log = tmp_path / "log.json"
    Tuner(KernelShape(E=128, N=256, H=6144, top_k=8), FakeMeasurements()).tune([1], resume_path=log)
    measurements = FakeMeasurements()

    Tuner(SHAPE, measurements).tune([1], resume_path=log)

    assert {m for m, _, _ in measurements.timed} == {1}


def test_merged_parts_write_one_engine_file(tmp_path):
    first = Tuner(SHAPE, FakeMeasurements()).tune([1, 2, 4])
    second = Tuner(SHAPE, FakeMeasurements()).tune([8, 16])
    round_trip = TuneResult.from_dict(json.loads(json.dumps(second.to_dict())))

    merged = merge_results([first, round_trip])
    path = write_config_file(merged, tmp_path, "vllm")

    assert path.name == config_file_name(256, 256, "NVIDIA H200")
    version, entries = loads_config(path.read_text())
    assert version == "3.6.0"
    assert sorted(entries) == [1, 2, 4, 8, 16]
    assert entries[8] == second.batches[8].config


def test_sglang_files_go_under_the_triton_folder_without_a_version_key(tmp_path):
    shape = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
    result = Tuner(shape, FakeMeasurements()).tune([1, 4])

    path, down_path = write_config_files(result, tmp_path, "sglang")

    assert path.parent.name == down_path.parent.name == "triton_3_6_0"
    assert path.name.endswith("dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert down_path.name.endswith("dtype=fp8_w8a8,block_shape=[128, 128]_down.json")
    assert loads_config(path.read_text()) == (None, result.entries())
    assert loads_config(down_path.read_text()) == (None, result.down_entries())


def test_vllm_gets_one_file_without_down_configs(tmp_path):
    result = Tuner(SHAPE, FakeMeasurements()).tune([1])

    paths = write_config_files(result, tmp_path, "vllm")

    assert [p.name for p in paths] == [config_file_name(256, 256, "NVIDIA H200")]


def test_merging_different_shapes_is_refused():
    first = Tuner(SHAPE, FakeMeasurements()).tune([1])
    other = Tuner(KernelShape(E=384, N=256, H=7168, top_k=8), FakeMeasurements()).tune([2])

    with pytest.raises(ValueError, match="disagree"):
        merge_results([first, other])


def test_the_cli_reads_the_shape_from_the_model_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8", "--out", "x"]
    )

    shape = shape_from_args(args)

    assert (shape.E, shape.N, shape.H, shape.top_k) == (256, 256, 6144, 8)
    assert (shape.dtype, shape.block_shape) == ("fp8_w8a8", (128, 128))
    args.dtype = "bf16"
    assert shape_from_args(args).block_shape is None


def test_it_rejects_bad_batch_sizes():
    assert parse_ints("1,2,4") == (1, 2, 4)
    with pytest.raises(ValueError):
        parse_ints("1,two")
    with pytest.raises(ValueError):
        parse_ints("0,4")


def _cli_error(capsys, *argv) -> str:
    from tuning.__main__ import main

    assert main(list(argv)) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return out.err


@pytest.mark.parametrize("damage", ["missing", "not json", "not a log"])
def test_merging_a_log_that_cannot_be_read_names_it(tmp_path, capsys, damage):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(Tuner(SHAPE, FakeMeasurements()).tune([1]).to_dict()))
    bad = tmp_path / "bad.json"
    if damage != "missing":
        bad.write_text("{" if damage == "not json" else '{"batches": {}}')

    err = _cli_error(capsys, "tune", "--merge", str(good), str(bad), "--out", str(tmp_path))

    assert f"--merge: {'cannot read' if damage == 'missing' else ''}" in err
    assert str(bad) in err
    assert not list(tmp_path.rglob("E=*.json"))


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_a_model_config_that_cannot_be_read_is_named(tmp_path, capsys, command):
    missing = tmp_path / "config.json"
    out = ["--out", str(tmp_path)] if command == "tune" else []

    err = _cli_error(capsys, command, "--model-config", str(missing), *out)

    assert err.startswith(f"error: --model-config: cannot read {missing}")


def test_a_tune_needs_a_model_config_unless_it_merges(tmp_path, capsys):
    err = _cli_error(capsys, "tune", "--out", str(tmp_path))

    assert "--model-config is required (except with --merge)" in err


@pytest.mark.parametrize("option", ["--config", "--down-config"])
@pytest.mark.parametrize("content", [None, "[1, 2]", '{"64": {"BLOCK_SIZE_M": 3}}'])
def test_the_bench_names_the_config_file_it_cannot_use(tmp_path, capsys, option, content):
    path = tmp_path / "tuned.json"
    if content is not None:
        path.write_text(content)

    err = _cli_error(
        capsys,
        "bench",
        "--model-config",
        str(HF_CONFIGS / "glm-5-fp8_config.json"),
        option,
        str(path),
    )

    assert err.startswith(f"error: {option}: ")
    assert str(path) in err


def test_the_cli_modules_import_without_torch():
    code = "import sys, tuning.tune_cli, tuning.bench; print('torch' in sys.modules)"

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "False"


def test_the_bench_table_shows_the_one_config_and_shipped_times_where_there_are_some():
    rows = [
        BenchRow(64, 490.0, 545.0, 490.0, 880.0, ENTRY),
        BenchRow(4096, 593.0, 1921.0, 900.0, 3866.0, ENTRY, shared_config_us=1000.0),
    ]
    rows[1].layout_floor_us = 790.0
    rows[1].shipped_us = 990.0

    lines = format_table(rows).splitlines()

    assert "1-config µs" in lines[0] and lines[0].split()[-2:] == ["%", "layout"]
    assert lines[1].split()[3] == "n/a" and lines[2].split()[3] == "990.0"
    assert lines[1].split()[5] == "n/a" and lines[2].split()[5] == "1000.0"
    assert lines[2].split()[8] == f"{990 / 900:.2f}x"
    assert lines[1].split()[-1] == "n/a"
    assert lines[2].split()[-2:] == [f"{100 * 593 / 900:.1f}", f"{100 * 790 / 900:.1f}"]


@pytest.mark.parametrize("shape", [SHAPE, FP8_BLOCK])
def test_round_one_is_every_sizes_first_proposal_and_default_once_per_compile_key(shape):
    configs = round_one_configs(shape, SIZES)

    keys = _keys(configs)
    assert len(keys) == len(set(keys))
    proposals = [CoarseToFineSearch(m, shape).propose() for m in SIZES]
    proposed = {compile_key(c) for proposal in proposals for c in proposal.configs}
    assert set(keys) == proposed | _default_keys(shape, SIZES)
    # coarse-to-fine's first round is one config per tile
    assert len(proposed) == len({key[:3] for key in proposed})


def test_round_one_of_an_exhaustive_tune_is_the_whole_space():
    configs = round_one_configs(SHAPE, SIZES, exhaustive=True)

    keys = _keys(configs)
    assert len(keys) == len(set(keys))
    space = {compile_key(c) for m in SIZES for c in search_space(m, SHAPE)}
    assert set(keys) == space | _default_keys(SHAPE, SIZES)
    assert len(keys) > len(round_one_configs(SHAPE, SIZES))


def test_a_tune_compiles_round_one_first_with_the_defaults():
    measurements = FakeMeasurements()

    Tuner(SHAPE, measurements).tune(SIZES)

    first = _keys(round_one_configs(SHAPE, SIZES))
    assert measurements.compiled[: len(first)] == first
    assert len(measurements.compiled) == len(set(measurements.compiled))


def test_the_timeline_says_where_the_seconds_went_and_is_not_in_the_log():
    result = Tuner(SHAPE, FakeMeasurements()).tune([1, 64])

    timeline = result.timeline
    assert timeline.pool_start_s == FakeMeasurements.pool_start_s
    assert timeline.setup_s >= 0
    # the measurements' own parts of set-up and tune
    assert (timeline.import_s, timeline.cuda_s, timeline.weights_s) == (1.5, 0.75, 0.25)
    assert timeline.ceilings_s == 1.25
    assert 0 <= timeline.compile_s < timeline.tune_s
    data = result.to_dict()
    assert "timeline" not in data
    assert TuneResult.from_dict(data).timeline is None
    assert TuneResult.from_dict(data) == result


class RecordedPool:
    """CompilePool's stand-in: notes its creation and the wait for its workers in events."""

    def __init__(self, events, workers):
        self.events = events
        events.append(("compile pool", workers))

    def wait_started(self):
        self.events.append("compile workers started")
        return 3.0

    def close(self):
        pass


def recorded_measurements(monkeypatch, events, ceilings):
    """DeviceMeasurements on GPU 1 with 3 compile workers, with torch's CUDA calls, the
    weights, the pool and the ceilings' measurement noting themselves in events instead."""
    # here, not at the top: the pool tests' worker processes import this module
    import torch

    from tuning import timing

    monkeypatch.setattr(
        tuner, "CompilePool", lambda s, workers, shard, backend: RecordedPool(events, workers)
    )
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: events.append(("set_device", i)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "gpu_key", lambda i: f"NVIDIA H200 GPU-{i} torch cuda")
    monkeypatch.setattr(compile_only, "gpu_target", lambda: H200)
    monkeypatch.setattr(timing, "make_weights", lambda shape: events.append("weights"))
    monkeypatch.setattr(timing, "measure_ceilings", lambda: events.append("ceilings") or ceilings)
    return DeviceMeasurements(SHAPE, device_index=1, compile_workers=3)


def test_the_compile_workers_start_first_and_the_ceilings_are_measured_once(monkeypatch, tmp_path):
    from tuning import timing

    monkeypatch.setenv("MOEOPS_CACHE_DIR", str(tmp_path))
    events = []
    ceilings = timing.DeviceCeilings(4.24, 689.0, None)

    measurements = recorded_measurements(monkeypatch, events, ceilings)

    assert events == [("compile pool", 3), ("set_device", 1), "weights"]
    assert measurements.target == H200
    assert measurements.ceilings == measurements.ceilings == vars(ceilings)
    # the workers touch no GPU: the measurement does not wait for them
    assert events[3:] == ["ceilings"]
    assert measurements.wait_for_compile_workers() == 3.0
    assert set(measurements.seconds) == {"import_s", "cuda_s", "weights_s", "ceilings_s"}


def test_a_second_tune_on_the_gpu_reads_its_ceilings_from_the_cache(monkeypatch, tmp_path):
    from tuning import timing

    monkeypatch.setenv("MOEOPS_CACHE_DIR", str(tmp_path))
    ceilings = timing.DeviceCeilings(4.24, 689.0, 1310.0)
    first = recorded_measurements(monkeypatch, [], ceilings).ceilings
    events = []

    second = recorded_measurements(monkeypatch, events, timing.DeviceCeilings(1.0, 1.0, None))

    assert first == second.ceilings == vars(ceilings)
    # not measured again
    assert events == [("compile pool", 3), ("set_device", 1), "weights"]
    assert "ceilings_s" not in second.seconds


def measure_once(calls, figures=(4.24, 689.0, None)):
    from tuning import timing

    def measure():
        calls.append(time.time())
        return timing.DeviceCeilings(*figures)

    return measure


def test_cached_ceilings_are_per_gpu_and_expire(tmp_path):
    from tuning import timing

    calls = []
    key = "NVIDIA H200 GPU-aaa torch 2.11 cuda 12.8"
    first = timing.cached_ceilings(key, measure_once(calls), folder=tmp_path)
    again = timing.cached_ceilings(key, measure_once(calls, (9, 9, 9)), folder=tmp_path)
    other = timing.cached_ceilings(
        key.replace("aaa", "bbb"), measure_once(calls, (4.1, 650.0, None)), folder=tmp_path
    )
    expired = timing.cached_ceilings(
        key, measure_once(calls, (4.3, 700.0, None)), folder=tmp_path, max_age_s=-1
    )

    assert again == first == timing.DeviceCeilings(4.24, 689.0, None)
    assert other == timing.DeviceCeilings(4.1, 650.0, None)
    assert expired == timing.DeviceCeilings(4.3, 700.0, None)
    assert len(calls) == 3


@pytest.mark.parametrize("damage", ["not json", '{"key": "x"}', '{"ceilings": 1}'])
def test_a_damaged_or_unwritable_ceilings_cache_is_measured_past(tmp_path, damage):
    from tuning import timing

    calls = []
    key = "NVIDIA H200 GPU-aaa torch 2.11 cuda 12.8"
    timing.cached_ceilings(key, measure_once(calls), folder=tmp_path)
    for path in tmp_path.glob("*.json"):
        path.write_text(damage)
    blocked = tmp_path / "a-file"
    blocked.write_text("")

    assert timing.cached_ceilings(key, measure_once(calls), folder=tmp_path).bf16_tflops == 689.0
    # a folder that cannot be made: measured, not an error
    assert timing.cached_ceilings(key, measure_once(calls), folder=blocked / "x").bf16_tflops
    assert len(calls) == 3


def test_a_compile_pool_starts_its_workers_at_once_and_waits_for_the_slowest(tmp_path):
    created = time.time()
    pool = CompilePool(SHAPE, 3, set_up=functools.partial(set_up_on_cpu, tmp_path))
    try:
        # nothing asked of the pool: its workers set up all the same
        deadline = time.time() + 60
        while len(list(tmp_path.glob("ready-*"))) < 3 and time.time() < deadline:
            time.sleep(0.05)
        ready = [float(p.read_text()) for p in tmp_path.glob("ready-*")]
        start_s = pool.wait_started()
    finally:
        pool.close()

    assert len(ready) == 3
    # one start-up task per worker: the fast ones did not take the slow one's
    assert created + start_s > max(ready) - 0.2
    assert start_s >= SLOW_SET_UP_S
    assert pool.wait_started() == start_s


def test_compile_workers_start_with_torch_imported_once_for_all(tmp_path):
    pool = CompilePool(SHAPE, 3, set_up=functools.partial(note_the_imports, tmp_path))
    try:
        pool.wait_started()
    finally:
        pool.close()

    found = [json.loads(p.read_text()) for p in tmp_path.glob("imports-*")]
    # forked from the server that imported them; spawned workers would import them each
    assert found == [compile_pool.COMPILE_WORKER_PRELOAD] * 3


def test_compile_workers_see_no_gpu(tmp_path, monkeypatch):
    # CUDA started in each compile process costs seconds and slows the timing process's own
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pool = CompilePool(SHAPE, 2, set_up=functools.partial(note_the_gpus, tmp_path))
    try:
        pool.wait_started()
    finally:
        pool.close()

    assert [p.read_text() for p in tmp_path.glob("gpus-*")] == ["", ""]


SLOW_SERVER_IMPORT_S = 2.0
SLOW_MODULE = f"""
import time
time.sleep({SLOW_SERVER_IMPORT_S})


def set_up(shape_data):
    pass
"""
POOL_SCRIPT = """
import json, time
from tuning import compile_only, compile_pool
from tuning.search import KernelShape
import slow_server_import

compile_pool.COMPILE_WORKER_PRELOAD = ["slow_server_import"]
created = time.monotonic()
shape = KernelShape(E=8, N=64, H=128, top_k=2)
pool = compile_pool.CompilePool(shape, 2, set_up=slow_server_import.set_up)
created_s = time.monotonic() - created
start_s = pool.wait_started()
pool.close()
print(json.dumps({"created_s": created_s, "start_s": start_s}))
"""


def test_building_a_compile_pool_does_not_wait_for_its_server_to_import(tmp_path):
    # a fresh process, so that its fork server is new and imports what it is told to
    (tmp_path / "slow_server_import.py").write_text(SLOW_MODULE)
    path = os.pathsep.join([str(tmp_path), str(Path(compile_pool.__file__).parent.parent)])
    env = {**os.environ, "PYTHONPATH": path}

    out = subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT], capture_output=True, text=True, env=env, check=True
    )

    figures = json.loads(out.stdout)
    # this process went on (to import torch, say) while the server imported
    assert figures["created_s"] < SLOW_SERVER_IMPORT_S / 2
    # the workers came from the server once it had imported the module
    assert figures["start_s"] >= SLOW_SERVER_IMPORT_S


# 5 stages of 256×128 tiles of both operands: 320 KB in fp8, more than an H200's 227 KB
TOO_BIG = {
    "BLOCK_SIZE_M": 256,
    "BLOCK_SIZE_N": 256,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 8,
    "num_stages": 5,
}


@pytest.mark.parametrize(
    "shape",
    [
        KernelShape(E=64, N=128, H=512, top_k=4),
        KernelShape(E=64, N=128, H=512, top_k=4, dtype="fp8_w8a8", block_shape=(128, 128)),
    ],
    ids=["bf16", "fp8-block"],
)
def test_compile_workers_compile_for_the_gpu_with_no_gpu_here(tmp_path, monkeypatch, shape):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    config = {**ENTRY, "BLOCK_SIZE_K": 128}
    pool = CompilePool(shape, 2)
    try:
        errors = pool.compile([config, TOO_BIG], H200)
    finally:
        pool.close()

    assert errors[0] is None
    # checked against the H200's shared memory, as a launch there would check it
    assert "shared memory" in errors[1] and "232448" in errors[1]
    binaries = {p.name for p in tmp_path.rglob("*.cubin")}
    layer = {"_expert_gemm_kernel", "_activation_kernel", "_sum_topk_kernel"}
    assert {f"{name}.cubin" for name in layer} <= binaries
    # built for sm_90, the target named, not for whatever this machine is
    targets = {
        json.loads(p.read_text()).get("target", {}).get("arch")
        for p in tmp_path.rglob("_expert_gemm_kernel.json")
    }
    assert targets == {90}


def compile_in_a_pool(results) -> None:
    pool = CompilePool(SHAPE, 2)
    try:
        results.put(pool.compile([ENTRY, TOO_BIG], H200))
    finally:
        pool.close()


def test_a_pool_whose_every_compile_fails_alike_leaves_the_compiles_to_the_timer(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # Triton's device properties without the shared-memory limit: every kernel's check fails
    unknown = compile_only.GpuTarget(90, {})
    pool = CompilePool(KernelShape(E=64, N=128, H=512, top_k=4), 2)
    try:
        first = pool.compile([ENTRY, {**ENTRY, "num_warps": 8}], unknown)
        later = pool.compile([ENTRY, TOO_BIG], H200)
    finally:
        pool.close()

    assert first == later == [None, None]
    assert "max_shared_mem" in pool.broken
    assert "compiling in the tuning process" in capsys.readouterr().err


def set_up_a_driver_that_does_not_fit(shape_data: dict) -> None:
    """The default set-up, in a worker whose compile-only driver cannot be built (as on a
    Triton whose driver API it does not fit)."""

    def no_driver(target):
        raise TypeError("Can't instantiate abstract class CompileOnlyDriver")

    compile_only.compile_only_driver = no_driver
    compile_pool.set_up_compile_worker(shape_data)


def test_a_pool_that_cannot_build_its_driver_leaves_the_compiles_to_the_timer(tmp_path, capsys):
    pool = CompilePool(SHAPE, 2, set_up=set_up_a_driver_that_does_not_fit)
    try:
        errors = pool.compile([ENTRY, {**ENTRY, "num_warps": 8}], H200)
    finally:
        pool.close()

    assert errors == [None, None]
    assert "Can't instantiate" in pool.broken
    assert "compiling in the tuning process" in capsys.readouterr().err


def test_configs_that_fail_each_their_own_way_are_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    too_big = [TOO_BIG, {**TOO_BIG, "num_stages": 4}]
    pool = CompilePool(KernelShape(E=64, N=128, H=512, top_k=4), 2)
    try:
        errors = pool.compile(too_big, H200)
    finally:
        pool.close()

    # the shared memory each needs differs: theirs, not the pool's
    assert all("shared memory" in e for e in errors) and errors[0] != errors[1]
    assert pool.broken is None


def test_a_daemonic_process_compiles_without_a_pool():
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    # as a Celery worker's process is
    process = context.Process(target=compile_in_a_pool, args=(results,), daemon=True)
    process.start()
    process.join(60)

    assert process.exitcode == 0
    # a working pool would have found TOO_BIG's shared memory
    assert results.get(timeout=5) == [None, None]


def test_a_compile_pool_whose_workers_cannot_start_says_so_and_leaves_the_compiles_to_the_timer(
    capfd,
):
    pool = CompilePool(SHAPE, 2, set_up=set_up_that_fails)
    try:
        assert pool.wait_started() >= 0
        # None: each compiles in the timing process at its first launch
        assert pool.compile([ENTRY, {**ENTRY, "num_warps": 8}], H200) == [None, None]
    finally:
        pool.close()

    assert pool.broken == "compile processes could not set up: RuntimeError: out of memory"
    said = capfd.readouterr().err
    assert said.count(f"{pool.broken}; compiling in the tuning process, which is slower") == 1


def test_each_process_of_a_host_compiles_its_own_share_of_the_keys_first():
    configs = round_one_configs(SHAPE, SIZES)
    owners = [compile_owner(c, 3) for c in configs]
    # the keys are shared out over all three processes, each config to one
    assert set(owners) == {0, 1, 2}

    for i in range(3):
        order = compile_order(configs, (i, 3))
        assert sorted(order) == list(range(len(configs)))
        own = owners.count(i)
        assert {owners[j] for j in order[:own]} == {i}
    # one process alone: the biggest tiles and deepest pipelines first
    assert compile_order(configs) == sorted(
        range(len(configs)),
        key=lambda j: (
            -configs[j]["num_stages"]
            * configs[j]["BLOCK_SIZE_M"]
            * configs[j]["BLOCK_SIZE_N"]
            * configs[j]["BLOCK_SIZE_K"]
        ),
    )


@pytest.mark.parametrize(
    "shape",
    [
        KernelShape(E=4, N=64, H=256, top_k=2),
        KernelShape(E=4, N=64, H=256, top_k=2, dtype="fp8_w8a8"),
        KernelShape(E=4, N=64, H=200, top_k=2, dtype="fp8_w8a8", block_shape=(128, 128)),
    ],
    ids=["bf16", "fp8", "fp8-block"],
)
def test_unset_weights_are_the_weights_compiling_sees(shape):
    from tuning import timing

    made, unset = timing.make_weights(shape, device="cpu"), timing.unset_weights(shape)

    for a, b in zip(vars(made).values(), vars(unset).values(), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())


def test_the_floor_counts_the_routed_weights_and_the_layout_floor_the_intermediates_too():
    from tuning import timing

    glm = KernelShape(E=256, N=256, H=6144, top_k=8)
    ceilings = timing.DeviceCeilings(4.0, 800.0, None)
    # one token reaches 8 experts: their weights, x and out, the 8 router ids and weights
    floor_bytes = 8 * 3 * 256 * 6144 * 2 + 2 * 6144 * 2 + 8 * 8
    # gate and up [8, 512] and the activation [8, 256] written and read, the 8 pairs' rows
    # [8, 6144] written and read
    layout_bytes = floor_bytes + 2 * 8 * (512 + 256) * 2 + 2 * 8 * 6144 * 2

    assert timing.moe_floor_us(glm, 1, ceilings) == pytest.approx(floor_bytes / 4e6)
    assert timing.layout_floor_us(glm, 1, ceilings) == pytest.approx(layout_bytes / 4e6)
    # where the matrix rate bounds the layer, the layout's bytes do not move its floor
    slow = timing.DeviceCeilings(1000.0, 1.0, None)
    assert timing.layout_floor_us(glm, 64, slow) == timing.moe_floor_us(glm, 64, slow)
    assert timing.moe_floor_us(glm, 64, slow) == pytest.approx(2 * 64 * 8 * 3 * 256 * 6144 / 1e6)


# -- the engine's own configs: candidates, and never beaten by noise --------------------------


class ScriptedBackend(KernelBackend):
    """An engine whose default and shipped configs are given, timed by ScriptedTimer."""

    engine = "vllm"
    version = "0.32.0"
    source_sha256 = "ab" * 32

    def __init__(self, default, shipped=None):
        self.default, self.shipped = default, shipped

    def default_config(self, shape, M):
        return dict(self.default)

    def shipped_configs(self, shape, device_name, *, down=False):
        if down or self.shipped is None:
            return None
        return ShippedConfigs("/engine/configs/file.json", {1: dict(self.shipped)})


class ScriptedTimer(FakeTimer):
    """FakeTimer's µs, except the configs given in `scripted` ({config key: µs}), with ±noise
    that alternates from call to call."""

    def __init__(self, measurements, M):
        super().__init__(measurements, M)
        self.calls = 0

    def time_config(self, config, replays, calls=None, *, down_config=None):
        us = self.measurements.scripted.get(config_key(config))
        if us is None:
            return super().time_config(config, replays, calls, down_config=down_config)
        self.calls += 1
        self.measurements.timed.append((self.M, dict(config), replays))
        return us * (1 + self.measurements.noise * (-1) ** self.calls)


class ScriptedMeasurements(FakeMeasurements):
    def __init__(self, backend, scripted, noise=0.0):
        super().__init__()
        self.backend, self.scripted, self.noise = backend, scripted, noise

    def timer(self, M):
        return ScriptedTimer(self, M)


SHIPPED = {**ENTRY, "BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 32, "num_stages": 4}
DEFAULT = {**ENTRY, "BLOCK_SIZE_N": 128, "GROUP_SIZE_M": 1}


def _search_best_us(M):
    """What the search finds on FakeTimer's µs alone (no scripted configs)."""
    result = Tuner(SHAPE, FakeMeasurements()).tune([M], down=False)
    return result.batches[M].tuned_us


def _alone(config, us):
    """Scripted µs: config at us, every neighbour of it far slower (a peak of its own)."""
    scripted = {config_key(n): us * 10 for n in neighbours(config, SHAPE)}
    scripted[config_key(config)] = us
    return scripted


def test_the_engines_shipped_entries_and_default_enter_the_search():
    backend = ScriptedBackend(DEFAULT, SHIPPED)
    # the shipped entry, a tile outside the search space, is faster than anything the space has
    best = _search_best_us(64)
    measurements = ScriptedMeasurements(backend, _alone(SHIPPED, best * 0.5))

    batch = Tuner(SHAPE, measurements).tune([64], down=False).batches[64]

    assert batch.config == SHIPPED and batch.picked == "shipped"
    timed_in_round_one = {config_key(c) for m, c, replays in measurements.timed if replays == 5}
    assert {config_key(SHIPPED), config_key(DEFAULT)} <= timed_in_round_one


def test_a_tuned_config_only_replaces_the_engines_when_faster_beyond_the_noise():
    backend = ScriptedBackend(DEFAULT, SHIPPED)
    best = _search_best_us(64)
    # the engine's shipped entry 0.5 % slower than the search's pick, timings ±2 %: a tie
    close = ScriptedMeasurements(backend, _alone(SHIPPED, best * 1.005), noise=0.02)
    far = ScriptedMeasurements(backend, _alone(SHIPPED, best * 1.2), noise=0.02)

    tie = Tuner(SHAPE, close).tune([64], down=False).batches[64]
    win = Tuner(SHAPE, far).tune([64], down=False).batches[64]

    assert (tie.picked, tie.config) == ("shipped", SHIPPED)
    assert win.picked == "tuned" and win.tuned_us < win.shipped_us
    assert win.default_us is not None and win.search_us == win.tuned_us


class SwitchedBackend(ScriptedBackend):
    """An engine whose entries may say USE_TMA (vLLM 0.34 on fp8 block)."""

    def search_switches(self, shape):
        return {"USE_TMA": (True, False)}


class PointerReadFaster(ScriptedMeasurements):
    """FakeTimer's µs, 20 % less for an entry saying `"USE_TMA": false`."""

    def timer(self, M):
        timer = super().timer(M)
        time_config = timer.time_config

        def timed(config, replays, calls=None, *, down_config=None):
            us = time_config(config, replays, calls, down_config=down_config)
            return us * (0.8 if config.get("USE_TMA") is False else 1.0)

        timer.time_config = timed
        return timer


def test_a_backends_switch_is_searched_and_written_where_it_wins(tmp_path):
    backend = SwitchedBackend(DEFAULT)

    result = Tuner(SHAPE, PointerReadFaster(backend, {})).tune([64, 1024], down=False)

    assert all(batch.config["USE_TMA"] is False for batch in result.batches.values())
    assert all(batch.picked == "tuned" for batch in result.batches.values())
    (path,) = tune_results.write_config_files(result, tmp_path, "vllm")
    _, entries = loads_config(path.read_text())
    assert entries[64]["USE_TMA"] is False


def test_a_backend_without_switches_writes_no_use_tma():
    result = Tuner(SHAPE, ScriptedMeasurements(ScriptedBackend(DEFAULT), {})).tune([64], down=False)

    assert "USE_TMA" not in result.batches[64].config


class SortedABackend(ScriptedBackend):
    """vLLM 0.34 for a deployment on its sorted-A path: GEMM 2 reads a `_down` file whose
    shipped entries turn the path off at 512 and on at 1024."""

    version = "0.34.0"

    def kernel_path(self, shape):
        return "sorted_a"

    def down_config_applies(self, shape):
        return True

    def down_switches(self, shape):
        return {"USE_TMA": (True,)}

    def shipped_configs(self, shape, device_name, *, down=False):
        if not down:
            return ShippedConfigs("/engine/configs/file.json", {1: dict(SHIPPED)})
        on = {**ENTRY, "BLOCK_SIZE_N": 128, "USE_TMA": True}
        return ShippedConfigs("/engine/configs/file_down.json", {512: {"USE_TMA": False}, 1024: on})


class SortedAMeasurements(ScriptedMeasurements):
    """As the engine runs it: a `_down` entry not saying USE_TMA true leaves GEMM 2 on GEMM 1's
    config; the down configs timed are kept."""

    def __init__(self, backend):
        super().__init__(backend, {})
        self.down_timed = []

    def timer(self, M):
        timer = super().timer(M)
        time_config = timer.time_config

        def timed(config, replays, calls=None, *, down_config=None):
            if down_config is not None:
                self.down_timed.append((dict(config), dict(down_config)))
                if not down_config.get("USE_TMA"):
                    down_config = None
            return time_config(config, replays, calls, down_config=down_config)

        timer.time_config = timed
        return timer


def test_a_sorted_a_tune_searches_gemm_2_as_the_engine_ties_it_and_writes_both_files(tmp_path):
    measurements = SortedAMeasurements(SortedABackend(DEFAULT, SHIPPED))

    result = Tuner(FP8_BLOCK, measurements).tune([64, 512, 1024])

    assert result.kernel_path == "sorted_a"
    shipped = SortedABackend(DEFAULT).shipped_configs(FP8_BLOCK, "", down=True).entries.values()
    # beside GEMM 1's config itself and the engine's own `_down` entries (head to head), every
    # GEMM 2 candidate takes the path and shares GEMM 1's BLOCK_SIZE_M
    searched = [
        (up, down)
        for up, down in measurements.down_timed
        if down != up and down not in list(shipped)
    ]
    assert len(searched) > 10
    assert all(down["USE_TMA"] is True for _, down in searched)
    assert all(down["BLOCK_SIZE_M"] == up["BLOCK_SIZE_M"] for up, down in searched)
    paths = write_config_files(result, tmp_path, "vllm")
    assert [p.name.endswith("_down.json") for p in paths] == [False, True]
    _, down = loads_config(paths[1].read_text(), vllm_down=True)
    assert sorted(down) == [64, 512, 1024]
    for m, entry in down.items():
        # FakeTimer's GEMM 2 is fastest with its own 128-wide tiles: the path on
        assert entry["USE_TMA"] is True and entry["BLOCK_SIZE_N"] == 128
        assert entry["BLOCK_SIZE_M"] == result.batches[m].config["BLOCK_SIZE_M"]


class RecordingMeasurements(ScriptedMeasurements):
    """Records, in order, each config whose compile was waited for and each one timed."""

    def __init__(self, backend):
        super().__init__(backend, {})
        self.events = []

    def start_compiles(self, configs, batch_sizes=(None,)):
        errors = super().start_compiles(configs, batch_sizes)
        self.events += [("started", config_key(c), batch_sizes) for c in configs]
        return [(config_key(c), batch_sizes, e) for c, e in zip(configs, errors, strict=True)]

    def finish_compiles(self, handles):
        self.events += [("compiled", key, sizes) for key, sizes, _ in handles]
        return [error for *_, error in handles]

    def timer(self, M):
        timer = super().timer(M)
        time_config = timer.time_config

        def recorded(config, replays, calls=None, *, down_config=None):
            self.events.append(("timed", config_key(down_config or config), M))
            return time_config(config, replays, calls, down_config=down_config)

        timer.time_config = recorded
        return timer


def test_an_engines_kernel_is_compiled_ahead_for_every_group_size_and_batch_size_it_is_timed_at():
    # GROUP_SIZE_M is a compile-time constant of the engines' kernels, a run-time one of ours;
    # and their kernels specialise on the batch size, ours does not
    engine = RecordingMeasurements(ScriptedBackend(DEFAULT, SHIPPED))
    builtin = RecordingMeasurements(BuiltinBackend())

    Tuner(SHAPE, engine).tune([64, 256])
    Tuner(SHAPE, builtin).tune([64, 256])

    def compiled_before_timed(events, key_of, with_size):
        compiled = set()
        for what, key, at in events:
            if what == "compiled":
                compiled |= {(key_of(key), m if with_size else None) for m in at}
            elif what == "timed" and (key_of(key), at if with_size else None) not in compiled:
                return False
        return True

    assert compiled_before_timed(engine.events, lambda key: key, with_size=True)
    assert compiled_before_timed(builtin.events, lambda key: key[:3] + key[4:], with_size=False)
    # each compile for the one size it is timed at, never for the others of its chunk
    assert all(len(at) == 1 for what, _, at in engine.events if what == "started")
    # one compile serves every GROUP_SIZE_M of the builtin kernel: not compiled again
    builtin_compiled = [key for what, key, *_ in builtin.events if what == "compiled"]
    assert len({k[:3] + k[4:] for k in builtin_compiled}) == len(builtin_compiled)


def test_the_next_chunks_first_compiles_start_before_this_chunks_last_timings():
    measurements = RecordingMeasurements(ScriptedBackend(DEFAULT, SHIPPED))
    first_chunk = list(TUNED_BATCH_SIZES[: tuner.CHUNK_BATCH_SIZES])
    later = 4096

    Tuner(SHAPE, measurements).tune([*first_chunk, later], down=False)

    events = measurements.events
    # an engine's kernel is compiled at the sizes it is timed at: the later chunk's are its own
    started = [i for i, (what, _, *at) in enumerate(events) if what == "started" and later in at[0]]
    timed = [i for i, (what, _, *at) in enumerate(events) if what == "timed" and at[0] != later]
    assert started[0] < timed[-1]


def test_the_result_names_the_kernel_it_was_tuned_on():
    result = Tuner(SHAPE, ScriptedMeasurements(ScriptedBackend(DEFAULT), {})).tune([1], down=False)

    assert result.kernel == {
        "engine": "vllm",
        "version": "0.32.0",
        "source_sha256": "ab" * 32,
        "path": "default",
    }
    # a log of another kernel is not resumed
    builtin = Tuner(SHAPE, FakeMeasurements()).tune([1], down=False)
    assert not builtin.same_run_as(result)
    assert TuneResult.from_dict(result.to_dict()).kernel == result.kernel


def _measured(*rounds):
    middle = statistics.median(rounds)
    return tuner.Measured(middle, (max(rounds) - min(rounds)) / middle, list(rounds))


@pytest.mark.parametrize(
    ("measured", "picked"),
    [
        ({"tuned": _measured(90, 91, 90), "default": _measured(100, 101, 100)}, "tuned"),
        # 0.5 % faster: within MIN_GAIN
        ({"tuned": _measured(99.5, 99.5, 99.5), "default": _measured(100, 100, 100)}, "default"),
        # faster in the median, slower in one round: noise
        ({"tuned": _measured(95, 95, 99), "default": _measured(100, 100, 98)}, "default"),
        # a slow round slows both: 4 % faster in every round, though the spread is 20 %
        ({"tuned": _measured(96, 115, 96), "default": _measured(100, 120, 100)}, "tuned"),
        (
            {
                "tuned": _measured(90, 90, 90),
                "default": _measured(100, 100, 100),
                "shipped": _measured(90.5, 90.5, 90.5),
            },
            "shipped",
        ),
        ({"default": _measured(100, 100, 100)}, "default"),
        ({"tuned": _measured(100, 100, 100)}, "tuned"),
        ({}, None),
    ],
)
def test_pick_keeps_the_engines_own_config_unless_faster_in_every_round(measured, picked):
    assert tuner.pick(measured) == picked


def test_an_fp4_checkpoint_is_refused_naming_the_kernels_that_run(tmp_path, capsys):
    config = str(HF_CONFIGS / "nvidia-kimi-k2.5-nvfp4_config.json")

    err = _cli_error(capsys, "tune", "--model-config", config, "--tp", "8", "--out", str(tmp_path))

    assert "nvfp4 experts" in err and "CUTLASS, FlashInfer, TRT-LLM" in err
    assert "--force tunes it all the same" in err


def test_a_named_engine_that_is_not_installed_is_refused_naming_what_to_give(tmp_path, capsys):
    config = str(HF_CONFIGS / "glm-5-fp8_config.json")
    argv = ["tune", "--model-config", config, "--tp", "8", "--out", str(tmp_path)]

    err = _cli_error(capsys, *argv, "--engine", "sglang")

    assert "sglang is not installed" in err and "MOEOPS_SGLANG_PYTHON" in err


def test_with_no_engine_named_the_styles_engine_is_timed_where_it_is_installed(tmp_path, capsys):
    from tuning.tune_cli import engine_spec

    assert engine_spec(None, "sglang", None) is None
    assert "timing moeops' builtin kernel" in capsys.readouterr().err
    source = ensure_installed()
    from tuning.engine_source import locate_package

    package = locate_package("vllm", python=str(source))
    spec = engine_spec(None, "vllm", str(package.package_dir))
    assert spec == {"engine": "vllm", "source_dir": str(package.package_dir)}
    assert "timing vLLM 0.32.0's own kernel" in capsys.readouterr().err
