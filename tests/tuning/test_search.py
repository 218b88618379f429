"""The config search space, its pruning, and the searches, on synthetic timing landscapes."""

import math
import random

import pytest

from tuning.search import (
    GROUP_SIZES_M,
    SM90_SHARED_MEMORY,
    CoarseToFineSearch,
    DownProjectionSearch,
    ExhaustiveSearch,
    KernelShape,
    block_sizes_m,
    compile_key,
    config_key,
    config_of,
    down_search_space,
    search_space,
    shared_memory_bytes,
)

GLM5 = KernelShape(E=256, N=256, H=6144, top_k=8)
GLM5_FP8_BLOCK = KernelShape(
    E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
)


def _landscape(M, seed=0):
    """A smooth synthetic µs cost: best tile near M's rows per expert, plus a little noise."""
    rng = random.Random(seed * 1009 + M)
    rows = max(1.0, M * 8 / 256)

    def cost(config):
        bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
        padding = math.ceil(rows / bm) * bm / rows
        tile = 1 + 0.3 * abs(math.log2(bn / 128)) + 0.2 * abs(math.log2(bk / 128))
        pipeline = 1 + 0.05 * abs(config["num_stages"] - 4) + 0.04 * (config["num_warps"] == 8)
        group = 1 + 0.02 * abs(math.log2(config["GROUP_SIZE_M"] + 1) - 4)
        return 100 * padding * tile * pipeline * group * (1 + rng.uniform(-0.005, 0.005))

    return cost


def _run(search, cost, fail=lambda config: False):
    timed = 0
    while (proposal := search.propose()) is not None:
        times, errors = {}, {}
        for config in proposal.configs:
            key = config_key(config)
            timed += 1
            if fail(config):
                times[key], errors[key] = None, "OutOfResources: shared memory"
            else:
                times[key] = cost(config)
        search.observe(times, errors)
    return timed


def test_the_space_fits_shared_memory_and_registers():
    for M in (1, 256, 4096):
        for config in search_space(M, GLM5):
            assert shared_memory_bytes(config, 2) <= SM90_SHARED_MEMORY
            assert config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"] <= 4096 * config["num_warps"]


def test_it_prunes_block_m_by_batch_size():
    assert block_sizes_m(1, 256, 8) == (16,)
    assert 16 not in block_sizes_m(4096, 256, 8)
    assert {c["BLOCK_SIZE_M"] for c in search_space(1, GLM5)} == {16}


def test_block_fp8_keeps_only_k_tiles_inside_a_scale_block():
    assert {c["BLOCK_SIZE_K"] for c in search_space(1024, GLM5_FP8_BLOCK)} == {64, 128}
    # fp8 operands take half the shared memory: deeper pipelines fit
    deepest = max(c["num_stages"] for c in search_space(4096, GLM5_FP8_BLOCK))
    assert deepest == 5


def test_group_size_m_does_not_change_what_is_compiled():
    config = search_space(64, GLM5)[0]
    other = {**config, "GROUP_SIZE_M": 64 if config["GROUP_SIZE_M"] != 64 else 1}

    assert compile_key(config) == compile_key(other)
    assert config_key(config) != config_key(other)
    assert config_of(config_key(config)) == config


@pytest.mark.parametrize("M", [1, 16, 256, 1024, 4096])
def test_coarse_to_fine_lands_within_3_percent_of_exhaustive(M):
    cost = _landscape(M)
    smart, exhaustive = CoarseToFineSearch(M, GLM5), ExhaustiveSearch(M, GLM5)

    smart_tried = _run(smart, cost)
    exhaustive_tried = _run(exhaustive, cost)

    assert cost(smart.best[0]) <= 1.03 * cost(exhaustive.best[0])
    assert smart_tried < exhaustive_tried / 4


def test_it_skips_configs_that_fail_and_never_picks_one():
    def big_tiles_fail(config):
        return config["BLOCK_SIZE_N"] >= 128

    search = CoarseToFineSearch(256, GLM5)
    _run(search, _landscape(256), fail=big_tiles_fail)

    assert search.best[0]["BLOCK_SIZE_N"] < 128
    assert search.state.errors
    assert all(search.state.times[k] is None for k in search.state.errors)


def test_the_final_round_re_times_the_finalists_with_more_replays():
    search = CoarseToFineSearch(64, GLM5, finalists=3, final_replays=25)
    rounds = []
    while (proposal := search.propose()) is not None:
        rounds.append(proposal)
        search.observe({config_key(c): 10.0 + i for i, c in enumerate(proposal.configs)}, {})

    assert rounds[-1].replays == 25 and len(rounds[-1].configs) == 3
    assert all(p.replays < 25 for p in rounds[:-1])
    assert search.best[1] == 10.0


def test_kernel_shape_round_trips_through_json_fields():
    assert KernelShape.from_dict(GLM5_FP8_BLOCK.as_dict()) == GLM5_FP8_BLOCK
    assert GLM5_FP8_BLOCK.operand_bytes == 1 and GLM5.operand_bytes == 2


UP = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 256,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 32,
    "num_warps": 8,
    "num_stages": 3,
}


def test_the_down_space_keeps_gemm_1s_block_size_m():
    space = down_search_space(GLM5, UP)

    assert {c["BLOCK_SIZE_M"] for c in space} == {64}
    assert {c["GROUP_SIZE_M"] for c in space} == set(GROUP_SIZES_M)
    assert {c["BLOCK_SIZE_K"] for c in space} == {64, 128, 256}
    assert {c["BLOCK_SIZE_K"] for c in down_search_space(GLM5_FP8_BLOCK, UP)} == {64, 128}


@pytest.mark.parametrize("M", [16, 1024, 4096])
def test_the_down_search_lands_within_3_percent_of_its_whole_space(M):
    cost = _landscape(M, seed=1)
    search = DownProjectionSearch(M, GLM5, UP)

    tried = _run(search, cost)

    best = min(cost(c) for c in down_search_space(GLM5, UP))
    assert cost(search.best[0]) <= 1.03 * best
    assert tried < len(search.space) / 2


def test_the_down_search_re_times_gemm_1s_config_in_its_final():
    search = DownProjectionSearch(256, GLM5, UP)
    rounds = []
    while (proposal := search.propose()) is not None:
        rounds.append(proposal)
        # every candidate slower than sharing GEMM 1's config
        search.observe({config_key(c): 20.0 - (c == UP) for c in proposal.configs}, {})

    assert UP in rounds[-1].configs
    assert search.best == (UP, 19.0) and search.shared_us == 19.0
