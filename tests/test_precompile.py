"""What a tune compiles before its first timing (round_one_configs), and a Tuner taking a host
precompile's compiles as its own; on fake measurements (no GPU)."""

import threading
import time

import pytest

from tests.test_tuner import SHAPE, FakeMeasurements
from tuning.fused_moe import default_config
from tuning.search import CoarseToFineSearch, KernelShape, compile_key, search_space
from tuning.tuner import HostPrecompile, Tuner, TuneResult, precompile, round_one_configs

SIZES = [1, 64, 1024, 4096]
FP8_BLOCK = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))


def _keys(configs):
    return [compile_key(c) for c in configs]


def _default_keys(shape, sizes):
    block = list(shape.block_shape) if shape.block_shape else None
    return {
        compile_key(default_config(m, shape.E, shape.N, shape.H, shape.top_k, shape.dtype, block))
        for m in sizes
    }


class WatchedMeasurements(FakeMeasurements):
    """FakeMeasurements noting when each compile began."""

    def __init__(self):
        super().__init__()
        self.compile_started = []

    def compile(self, configs):
        self.compile_started.append(time.time())
        return super().compile(configs)


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


def test_a_tune_waits_for_the_host_precompile_and_compiles_none_of_it_again(tmp_path):
    configs = round_one_configs(SHAPE, SIZES)
    precompiled = HostPrecompile(configs, FakeMeasurements().compile(configs), compile_s=0.4)
    path = tmp_path / "precompiled.json"
    writer = threading.Timer(0.4, precompiled.save, args=(path,))
    measurements = WatchedMeasurements()

    writer.start()
    result = Tuner(SHAPE, measurements).tune(SIZES, precompiled_path=path)

    written = path.stat().st_mtime
    assert min(measurements.compile_started) >= written
    assert not set(_keys(configs)) & set(measurements.compiled)
    assert result.timeline.wait_s >= 0.3
    assert 0 <= result.timeline.compile_s < result.timeline.tune_s
    alone = Tuner(SHAPE, FakeMeasurements()).tune(SIZES)
    assert result.entries() == alone.entries()
    assert result.down_entries() == alone.down_entries()


def test_a_failed_host_precompile_leaves_the_tune_to_compile_for_itself(tmp_path):
    path = tmp_path / "precompiled.json"
    HostPrecompile(error="exited with 1: RuntimeError: boom").save(path)
    measurements = FakeMeasurements()

    result = Tuner(SHAPE, measurements).tune(SIZES, precompiled_path=path)

    assert set(_keys(round_one_configs(SHAPE, SIZES))) <= set(measurements.compiled)
    assert result.entries() == Tuner(SHAPE, FakeMeasurements()).tune(SIZES).entries()


def test_the_timeline_is_not_in_the_log():
    result = Tuner(SHAPE, FakeMeasurements()).tune([1, 64])

    assert result.timeline.tune_s > 0
    data = result.to_dict()
    assert "timeline" not in data
    assert TuneResult.from_dict(data).timeline is None
    assert TuneResult.from_dict(data) == result


def test_the_precompile_fails_loudly_where_its_compile_processes_cannot_start():
    # no CUDA here: the compile processes die in their set-up, and nothing was compiled
    with pytest.raises(RuntimeError, match="the compile processes died"):
        precompile(SHAPE, round_one_configs(SHAPE, [1]), workers=1)
