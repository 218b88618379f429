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
    is_viable,
    neighbours,
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


def test_a_neighbour_is_one_grid_step_along_one_axis():
    config = config_of((16, 128, 128, 32, 4, 3))

    found = neighbours(config, GLM5_FP8_BLOCK)

    moved = [{name for name in config if n[name] != config[name]} for n in found]
    assert all(len(names) == 1 for names in moved)
    assert {config_key(n) for n in found} == {
        (32, 128, 128, 32, 4, 3),
        (16, 64, 128, 32, 4, 3),
        (16, 256, 128, 32, 4, 3),
        # BLOCK_SIZE_K 256 would straddle two fp8 weight-scale blocks of 128
        (16, 128, 64, 32, 4, 3),
        (16, 128, 128, 16, 4, 3),
        (16, 128, 128, 64, 4, 3),
        (16, 128, 128, 32, 8, 3),
        (16, 128, 128, 32, 4, 2),
        (16, 128, 128, 32, 4, 4),
    }
    assert all(is_viable(n, GLM5_FP8_BLOCK) for n in found)


def test_a_value_off_the_grid_steps_onto_it_and_fixed_axes_stay():
    # vLLM ships BLOCK_SIZE_M 8 entries; the grid starts at 16
    shipped = config_of((8, 64, 128, 1, 4, 4))

    found = neighbours(shipped, GLM5_FP8_BLOCK)
    kept_m = neighbours(shipped, GLM5_FP8_BLOCK, fixed=("BLOCK_SIZE_M",))

    assert {n["BLOCK_SIZE_M"] for n in found} == {8, 16}
    assert all(n["BLOCK_SIZE_M"] == 8 for n in kept_m) and len(kept_m) == len(found) - 1


def _peak_beside(seed, steps):
    """µs: 100 everywhere, the seed 90, then each config of `steps` (one step apart in turn)
    faster still: a climb from the seed that rounds 1–3 cannot see."""
    times = {config_key(seed): 90.0}
    for i, config in enumerate(steps):
        times[config_key(config)] = 80.0 - 10 * i
    return lambda config: times.get(config_key(config), 100.0)


def test_the_neighbourhood_climbs_from_the_engines_entry_while_it_finds_better():
    seed = config_of((16, 64, 128, 1, 4, 4))
    # rounds 2 and 3 vary stages and warps at GROUP_SIZE_M 16 only, groups around the leaders
    one = {**seed, "num_stages": 5}
    two = {**one, "num_warps": 8}
    search = CoarseToFineSearch(24, GLM5_FP8_BLOCK, seeds=[seed], keep_leaders=1)

    _run(search, _peak_beside(seed, [one, two]))

    assert search.best[0] == two


def test_the_second_neighbourhood_round_is_left_out_when_the_first_found_nothing():
    seed = config_of((16, 64, 128, 1, 4, 4))
    search = CoarseToFineSearch(24, GLM5_FP8_BLOCK, seeds=[seed], keep_leaders=1)
    cost = _peak_beside(seed, [])
    rounds = []
    while (proposal := search.propose()) is not None:
        rounds.append(proposal)
        search.observe({config_key(c): cost(c) for c in proposal.configs}, {})

    # tiles, warps and stages, group sizes, one neighbourhood, final
    assert len(rounds) == 5
    assert {config_key(c) for c in rounds[3].configs} == {
        config_key(n) for n in neighbours(seed, GLM5_FP8_BLOCK)
    } - {config_key(c) for r in rounds[:3] for c in r.configs}
    assert search.best[0] == seed


def test_the_climb_leaves_from_the_searchs_own_best_when_the_engines_entries_lead():
    shipped = [config_of((16, 64, 128, 1, 4, 4)), config_of((16, 64, 128, 32, 4, 4))]
    search = CoarseToFineSearch(24, GLM5_FP8_BLOCK, seeds=shipped)
    rounds = [search.propose()]
    own = next(c for c in rounds[0].configs if c["BLOCK_SIZE_N"] == 256)
    times = {config_key(shipped[0]): 50.0, config_key(shipped[1]): 51.0, config_key(own): 60.0}
    while len(rounds) < 4:
        search.observe(
            {config_key(c): times.get(config_key(c), 100.0) for c in rounds[-1].configs}, {}
        )
        rounds.append(search.propose())

    climbed = {config_key(c) for c in rounds[3].configs}
    beside_shipped = {config_key(n) for c in shipped for n in neighbours(c, GLM5_FP8_BLOCK)}
    beside_own = {config_key(n) for n in neighbours(own, GLM5_FP8_BLOCK)} - beside_shipped
    timed = {config_key(c) for r in rounds[:3] for c in r.configs}
    assert beside_own - timed and beside_own - timed <= climbed
    assert climbed & beside_shipped


def test_the_down_search_climbs_with_gemm_1s_block_size_m():
    up = config_of((32, 64, 128, 16, 4, 3))
    seed = config_of((32, 128, 128, 1, 4, 4))
    better = {**seed, "num_stages": 5}
    search = DownProjectionSearch(256, GLM5_FP8_BLOCK, up, seeds=[seed], keep_leaders=1)
    cost = _peak_beside(seed, [better])

    _run(search, cost)

    assert search.best[0] == better
    assert all(k[0] == 32 for k in search.state.times)


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


TMA = {"USE_TMA": (True, False)}


def test_a_switch_is_part_of_a_configs_key_and_round_trips():
    config = config_of((16, 128, 128, 1, 4, 3))
    with_tma, without = {**config, "USE_TMA": True}, {**config, "USE_TMA": False}

    assert len({config_key(config), config_key(with_tma), config_key(without)}) == 3
    assert config_of(config_key(without)) == without
    assert config_of(config_key(config)) == config


def test_with_a_switch_every_config_of_the_space_comes_with_each_value():
    plain = search_space(256, GLM5_FP8_BLOCK)
    switched = search_space(256, GLM5_FP8_BLOCK, switches=TMA)

    assert len(switched) == 2 * len(plain)
    assert {config_key(c)[:6] for c in switched} == {config_key(c) for c in plain}
    assert {c["USE_TMA"] for c in switched} == {True, False}


def test_round_one_times_each_tile_with_and_without_tma_and_the_seeds_at_the_default():
    # the engine's default entry has no USE_TMA: its launcher then reads B by TMA
    seed = config_of((16, 64, 128, 1, 4, 4))
    search = CoarseToFineSearch(256, GLM5_FP8_BLOCK, switches=TMA, seeds=[seed])

    first = search.propose().configs

    tiles = {(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"], c["USE_TMA"]) for c in first}
    with_tma = {t[:3] for t in tiles if t[3]}
    without = {t[:3] for t in tiles if not t[3]}
    assert without and with_tma == without
    assert {**seed, "USE_TMA": True} in first


def test_a_neighbour_step_flips_the_switch():
    config = {**config_of((16, 128, 128, 32, 4, 3)), "USE_TMA": True}

    found = neighbours(config, GLM5_FP8_BLOCK, switches=TMA)

    assert {**config, "USE_TMA": False} in found
    assert all("USE_TMA" in c for c in found)


def test_the_search_finds_the_switch_value_that_wins():
    base = _landscape(256)

    def cost(config):
        # the pointer read wins by 10 % on this landscape
        return base(config) * (0.9 if config["USE_TMA"] is False else 1.0)

    search = CoarseToFineSearch(256, GLM5_FP8_BLOCK, switches=TMA)
    _run(search, cost)

    assert search.best[0]["USE_TMA"] is False
