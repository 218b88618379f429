"""The fused-MoE config search space, its pruning, and the searches over it.

Pure Python (no torch): a search proposes rounds of configs, the tuner times them on the GPU and
reports back. Times are µs per MoE layer; None marks a config that failed to compile or launch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from tuning.config_files import REQUIRED_FIELDS

# The grid SGLang's and vLLM's tuners sweep on NVIDIA GPUs.
BLOCK_SIZES_M = (16, 32, 64, 128, 256)
BLOCK_SIZES_N = (32, 64, 128, 256)
BLOCK_SIZES_K = (64, 128, 256)
GROUP_SIZES_M = (1, 16, 32, 64)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4, 5)
# Shared memory one block may opt into on sm90 (H100, H200): 227 KiB.
SM90_SHARED_MEMORY = 232448
# Shared memory a kernel takes beyond its pipelined A and B tiles (barriers, scratch): up to
# 1,088 bytes in vLLM 0.34's kernel on 9.0 and 10.0, 1,024 on 12.0 (compile-check): twice that.
SHARED_MEMORY_SLACK = 2048
# Capabilities whose Triton pipeline keeps num_stages − 1 A and B tiles in shared memory, not
# num_stages (as on 9.0 and 10.0): vLLM 0.34's kernel at 4 stages takes 3/4 of the 4-stage
# figure on 12.0, plus SHARED_MEMORY_SLACK (compile-check).
ONE_TILE_FEWER = (120, 121)
# Launch switches an engine's config entry may carry beyond the grid (vLLM 0.34's USE_TMA, which
# picks how B is read): a config key holds them after the six grid fields, as 0 or 1.
SWITCHES = ("USE_TMA",)
# (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages[, switches])
ConfigKey = tuple[int, ...]


@dataclass(frozen=True)
class KernelShape:
    """One rank's MoE layer: E experts, N intermediate (per shard), H hidden, top_k per token.

    dtype "bf16" or "fp8_w8a8" (also "fp16"/"fp32"); block_shape [bn, bk] for block-scaled fp8.
    """

    E: int
    N: int
    H: int
    top_k: int
    dtype: str = "bf16"
    block_shape: tuple[int, int] | None = None

    @property
    def operand_bytes(self) -> int:
        """Bytes per GEMM operand element (fp8 1, bf16/fp16 2, fp32 4)."""
        return {"fp8_w8a8": 1, "fp32": 4}.get(self.dtype, 2)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return {
            "E": self.E,
            "N": self.N,
            "H": self.H,
            "top_k": self.top_k,
            "dtype": self.dtype,
            "block_shape": list(self.block_shape) if self.block_shape else None,
        }

    @classmethod
    def from_dict(cls, data: dict) -> KernelShape:
        """Inverse of as_dict."""
        block = data.get("block_shape")
        return cls(
            E=data["E"],
            N=data["N"],
            H=data["H"],
            top_k=data["top_k"],
            dtype=data.get("dtype", "bf16"),
            block_shape=tuple(block) if block else None,
        )


def config_key(config: dict) -> ConfigKey:
    """A config entry as a hashable tuple, in the config files' field order, then the switches
    it sets (SWITCHES)."""
    key = tuple(int(config[name]) for name in REQUIRED_FIELDS)
    return key + tuple(int(config[name]) for name in SWITCHES if name in config)


def config_of(key: ConfigKey) -> dict:
    """Inverse of config_key."""
    config = dict(zip(REQUIRED_FIELDS, key[: len(REQUIRED_FIELDS)], strict=True))
    switches = key[len(REQUIRED_FIELDS) :]
    config.update((name, bool(value)) for name, value in zip(SWITCHES, switches, strict=False))
    return config


def _tile(key: ConfigKey) -> tuple[int, ...]:
    """A config's tile (BLOCK_SIZE_M, N, K) and its switches: what round 1 tries one of each."""
    return key[:3] + key[len(REQUIRED_FIELDS) :]


def compile_key(config: dict) -> tuple[int, ...]:
    """What the compiled kernel depends on: GROUP_SIZE_M is a run-time argument of ours."""
    key = config_key(config)
    return key[:3] + key[4:]


def shared_memory_bytes(config: dict, operand_bytes: int, capability: int = 90) -> int:
    """Shared memory of the pipelined A and B tiles: stages · (BM + BN) · BK · bytes (stages − 1
    on the capabilities of ONE_TILE_FEWER, 120 for 12.0); the kernel takes up to
    SHARED_MEMORY_SLACK more."""
    stages = config["num_stages"] - (capability in ONE_TILE_FEWER)
    return (
        stages
        * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"])
        * config["BLOCK_SIZE_K"]
        * operand_bytes
    )


def block_sizes_m(M: int, E: int, top_k: int) -> tuple[int, ...]:
    """BLOCK_SIZE_M values worth trying at batch size M: around the mean rows per expert.

    Mean rows a = M·top_k/E; keep a/4 ≤ BM ≤ 4a (rounded to powers of two), at least 16.
    A block much taller than an expert's rows multiplies padding; much shorter re-reads weights.
    """
    rows = M * top_k / E
    low = max(16, 2 ** math.floor(math.log2(max(rows / 4, 1))))
    high = max(16, 2 ** math.ceil(math.log2(max(rows * 4, 1))))
    return tuple(b for b in BLOCK_SIZES_M if low <= b <= high)


def is_viable(
    config: dict,
    shape: KernelShape,
    shared_memory: int = SM90_SHARED_MEMORY,
    capability: int = 90,
) -> bool:
    """Whether a config can run well on a GPU of compute capability `capability` (90 for 9.0)
    whose blocks may have shared_memory bytes: fits, sane registers, block-scale tiles."""
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    needed = shared_memory_bytes(config, shape.operand_bytes, capability) + SHARED_MEMORY_SLACK
    if needed > shared_memory:
        return False
    # float32 accumulators per thread: past 128 they spill, under 4 the warps sit idle
    accumulators = bm * bn / (config["num_warps"] * 32)
    if not 4 <= accumulators <= 128:
        return False
    # a K tile must stay inside one block of weight scales
    return not (shape.dtype == "fp8_w8a8" and shape.block_shape and shape.block_shape[1] % bk)


def search_space(
    M: int,
    shape: KernelShape,
    shared_memory: int = SM90_SHARED_MEMORY,
    switches=None,
    capability: int = 90,
) -> list[dict]:
    """Every viable config for batch size M: the engines' grid pruned by M and the GPU's
    resources (is_viable), with each value of each switch ({name: values}, the engine's
    default first) where given."""
    configs = []
    for bm in block_sizes_m(M, shape.E, shape.top_k):
        for bn in BLOCK_SIZES_N:
            for bk in BLOCK_SIZES_K:
                for group in GROUP_SIZES_M:
                    for warps in NUM_WARPS:
                        for stages in NUM_STAGES:
                            config = config_of((bm, bn, bk, group, warps, stages))
                            if is_viable(config, shape, shared_memory, capability):
                                configs += with_switches(config, switches)
    return configs


def with_switches(config: dict, switches) -> list[dict]:
    """config once per combination of the switches' values ({name: values}; none: config)."""
    found = [config]
    for name, values in (switches or {}).items():
        found = [{**c, name: value} for c in found for value in values]
    return found


def switched(config: dict, switches) -> dict:
    """config with each switch it leaves unset at the engine's default (the first value)."""
    defaults = {name: values[0] for name, values in (switches or {}).items()}
    return config_of(config_key({**defaults, **config}))


# The axes a neighbourhood step moves along, one at a time, to the next value either side.
AXES = {
    "BLOCK_SIZE_M": BLOCK_SIZES_M,
    "BLOCK_SIZE_N": BLOCK_SIZES_N,
    "BLOCK_SIZE_K": BLOCK_SIZES_K,
    "GROUP_SIZE_M": GROUP_SIZES_M,
    "num_warps": NUM_WARPS,
    "num_stages": NUM_STAGES,
}


def neighbours(
    config: dict,
    shape: KernelShape,
    *,
    fixed: Iterable[str] = (),
    shared_memory: int = SM90_SHARED_MEMORY,
    switches=None,
    capability: int = 90,
) -> list[dict]:
    """The viable configs one step from config along one axis (AXES and the switches
    {name: values}; not the `fixed` ones).

    A step goes to the next grid value either side, also from a value off the grid (an engine's
    shipped BLOCK_SIZE_M 8, say), and may leave the batch size's pruned space: the pruning is a
    guess about where the best lies, and the best of the engine's own may sit at its edge.
    """
    found = []
    for name, grid in {**AXES, **(switches or {})}.items():
        if name in fixed:
            continue
        values = sorted({*grid, config[name]})
        at = values.index(config[name])
        for step in (-1, 1):
            if 0 <= at + step < len(values) and values[at + step] in grid:
                moved = {**config, name: values[at + step]}
                if is_viable(moved, shape, shared_memory, capability):
                    found.append(config_of(config_key(moved)))
    return found


def down_search_space(
    shape: KernelShape, up_config: dict, shared_memory: int = SM90_SHARED_MEMORY, capability=90
) -> list[dict[str, int]]:
    """Every viable config for GEMM 2 (the down projection) given GEMM 1's config: the grid with
    up_config's BLOCK_SIZE_M, which SGLang requires (both GEMMs run on one sort-and-pad)."""
    configs = []
    for bn in BLOCK_SIZES_N:
        for bk in BLOCK_SIZES_K:
            for group in GROUP_SIZES_M:
                for warps in NUM_WARPS:
                    for stages in NUM_STAGES:
                        key = (up_config["BLOCK_SIZE_M"], bn, bk, group, warps, stages)
                        config = config_of(key)
                        if is_viable(config, shape, shared_memory, capability):
                            configs.append(config)
    return configs


@dataclass
class Proposal:
    """One round of a search: configs to time, and how many graph replays to time each with."""

    configs: list[dict[str, int]]
    replays: int


@dataclass
class SearchState:
    """What a search has measured: µs per config (None: failed), and the errors."""

    times: dict[ConfigKey, float | None] = field(default_factory=dict)
    errors: dict[ConfigKey, str] = field(default_factory=dict)
    final: dict[ConfigKey, float] = field(default_factory=dict)

    def ranked(self, keys: Iterable[ConfigKey] | None = None) -> list[ConfigKey]:
        """Measured configs fastest first (failures dropped)."""
        pool = self.times if keys is None else keys
        timed = [k for k in pool if self.times.get(k) is not None]
        return sorted(timed, key=lambda k: self.times[k])


class CoarseToFineSearch:
    """Tiles first, then warps and stages around the best tiles, then GROUP_SIZE_M, then a final.

    Round 1: every viable (BM, BN, BK) tile with one warps/stages guess and GROUP_SIZE_M 16 (with
    switches, every tile at each of their values: how B is read is a tile's matter).
    Round 2: the best `keep_tiles` tiles with every viable warps × stages.
    Round 3: the best `keep_configs` configs with every GROUP_SIZE_M.
    Then up to `climbs` rounds: every untimed neighbour (one step along one axis) of
    `keep_leaders` leaders (the fastest and the fastest of the other kind, seed or own find: see
    _leaders), each round only while the one before found a new best. The rounds before move
    each axis over its whole grid but only around a few tiles, so a joint step they leave out (a
    tile with other warps, the engine's shipped entry with another GROUP_SIZE_M) is found here.
    Final: the best `finalists` re-timed with `final_replays` replays; the fastest wins.
    seeds: configs that round 1 times too (tuning.tuner gives the engine's own).
    shared_memory, capability: the GPU's, which the search prunes with (is_viable).
    """

    # what a neighbourhood step leaves alone (DownProjectionSearch: GEMM 1's BLOCK_SIZE_M)
    fixed_axes: tuple[str, ...] = ()

    def __init__(
        self,
        M: int,
        shape: KernelShape,
        *,
        shared_memory: int = SM90_SHARED_MEMORY,
        capability: int = 90,
        screen_replays: int = 5,
        refine_replays: int = 10,
        final_replays: int = 20,
        keep_tiles: int = 4,
        keep_configs: int = 2,
        keep_leaders: int = 2,
        climbs: int = 2,
        finalists: int = 3,
        seeds: Iterable[dict] = (),
        switches: dict | None = None,
    ):
        self.M = M
        self.shape = shape
        self.shared_memory = shared_memory
        self.capability = capability
        self.switches = switches or {}
        self.space = search_space(M, shape, shared_memory, self.switches, capability)
        # configs timed in the first round beside it (the engine's default and shipped ones):
        # they may lie outside the space, and win all the same
        self.seeds = [switched(c, self.switches) for c in seeds]
        self.state = SearchState()
        self.screen_replays = screen_replays
        self.refine_replays = refine_replays
        self.final_replays = final_replays
        self.keep_tiles = keep_tiles
        self.keep_configs = keep_configs
        self.keep_leaders = keep_leaders
        self.finalists = finalists
        self._rounds = iter(
            (
                self._tiles,
                self._warps_and_stages,
                self._group_sizes,
                *[self._neighbourhood] * climbs,
                self._final,
            )
        )
        # the best config when the last neighbourhood round was proposed
        self._climbed_from: ConfigKey | None = None
        self._final_round = False
        self.done = False

    def propose(self) -> Proposal | None:
        """The next round's configs, or None when the search has finished."""
        for make_round in self._rounds:
            proposal = make_round()
            if proposal.configs:
                return proposal
        self.done = True
        return None

    def observe(self, times: dict[ConfigKey, float | None], errors: dict[ConfigKey, str]) -> None:
        """Record a round's times (µs per layer; None where the config failed)."""
        self.state.errors.update(errors)
        if self._final_round:
            self.state.final.update({k: t for k, t in times.items() if t is not None})
        else:
            self.state.times.update(times)

    @property
    def best(self) -> tuple[dict[str, int], float] | None:
        """(config, µs) of the fastest finalist; before the final round, of the best so far."""
        if self.state.final:
            key = min(self.state.final, key=self.state.final.get)
            return config_of(key), self.state.final[key]
        ranked = self.state.ranked()
        return (config_of(ranked[0]), self.state.times[ranked[0]]) if ranked else None

    @property
    def candidates_tried(self) -> int:
        """Distinct configs timed or attempted."""
        return len(self.state.times)

    def _tiles(self) -> Proposal:
        tiles: dict[tuple[int, ...], dict] = {}
        for config in self.space:
            tile = _tile(config_key(config))
            if tile not in tiles or _guess_rank(config) < _guess_rank(tiles[tile]):
                tiles[tile] = config
        return Proposal(_with_seeds(list(tiles.values()), self.seeds), self.screen_replays)

    def _warps_and_stages(self) -> Proposal:
        best_tiles = []
        for key in self.state.ranked():
            if _tile(key) not in best_tiles:
                best_tiles.append(_tile(key))
        best_tiles = best_tiles[: self.keep_tiles]
        configs = [
            c
            for c in self.space
            if _tile(config_key(c)) in best_tiles
            and c["GROUP_SIZE_M"] == 16
            and config_key(c) not in self.state.times
        ]
        return Proposal(configs, self.refine_replays)

    def _group_sizes(self) -> Proposal:
        leaders = self.state.ranked()[: self.keep_configs]
        configs = [
            c
            for c in self.space
            if compile_key(c) in {k[:3] + k[4:] for k in leaders}
            and config_key(c) not in self.state.times
        ]
        return Proposal(configs, self.refine_replays)

    def _neighbourhood(self) -> Proposal:
        ranked = self.state.ranked()
        if not ranked or ranked[0] == self._climbed_from:
            return Proposal([], self.refine_replays)
        self._climbed_from = ranked[0]
        configs: dict[ConfigKey, dict[str, int]] = {}
        for key in self._leaders(ranked):
            for config in neighbours(
                config_of(key),
                self.shape,
                fixed=self.fixed_axes,
                shared_memory=self.shared_memory,
                switches=self.switches,
                capability=self.capability,
            ):
                if config_key(config) not in self.state.times:
                    configs.setdefault(config_key(config), config)
        return Proposal(list(configs.values()), self.refine_replays)

    def _leaders(self, ranked: list[ConfigKey]) -> list[ConfigKey]:
        """The `keep_leaders` configs a climb starts from: the fastest, then the fastest of the
        other kind (the seeds, or the search's own finds), then the next fastest. The engine's
        shipped entries enter at every batch size and often lead together; climbing only around
        them leaves the search's own best tile's neighbours untimed."""
        seeds = {config_key(c) for c in self.seeds}
        leaders = ranked[:1]
        other = next((k for k in ranked[1:] if (k in seeds) != (ranked[0] in seeds)), None)
        if other is not None:
            leaders.append(other)
        leaders += [k for k in ranked if k not in leaders]
        return leaders[: self.keep_leaders]

    def _final(self) -> Proposal:
        self._final_round = True
        finalists = self.state.ranked()[: self.finalists]
        return Proposal([config_of(k) for k in finalists], self.final_replays)


class DownProjectionSearch(CoarseToFineSearch):
    """GEMM 2's own config (SGLang's `_down` file) at batch size M, GEMM 1's config fixed.

    Over down_search_space (tiles differ only in BLOCK_SIZE_N and BLOCK_SIZE_K): the tiles
    round, then up to `climbs` neighbourhood rounds with BLOCK_SIZE_M fixed, then the final,
    which re-times the finalists beside up_config itself, so that a down config only wins by
    beating GEMM 2 run with GEMM 1's config. Its space is a fifth of GEMM 1's, and the climb
    from the best tiles and the engine's `_down` entries covers the warps, stages and group
    sizes that CoarseToFineSearch's rounds 2 and 3 sweep, in fewer timings.
    """

    fixed_axes = ("BLOCK_SIZE_M",)

    def __init__(
        self,
        M: int,
        shape: KernelShape,
        up_config: dict,
        *,
        shared_memory: int = SM90_SHARED_MEMORY,
        climbs: int = 3,
        **kwargs,
    ):
        super().__init__(M, shape, shared_memory=shared_memory, climbs=climbs, **kwargs)
        self.up_config = config_of(config_key(up_config))
        self.space = [
            config
            for tile in down_search_space(shape, up_config, shared_memory, self.capability)
            for config in with_switches(tile, self.switches)
        ]
        self._rounds = iter((self._tiles, *[self._neighbourhood] * climbs, self._final))

    @property
    def shared_us(self) -> float | None:
        """µs of the layer with up_config for both GEMMs, from the final round."""
        return self.state.final.get(config_key(self.up_config))

    def _final(self) -> Proposal:
        proposal = super()._final()
        if config_key(self.up_config) not in {config_key(c) for c in proposal.configs}:
            proposal.configs.append(self.up_config)
        return proposal


class ExhaustiveSearch(CoarseToFineSearch):
    """Every viable config timed with the screening replays, then the best re-timed as finalists."""

    def __init__(self, M: int, shape: KernelShape, *, finalists: int = 8, **kwargs):
        super().__init__(M, shape, finalists=finalists, **kwargs)
        self._rounds = iter((self._everything, self._final))

    def _everything(self) -> Proposal:
        return Proposal(_with_seeds(list(self.space), self.seeds), self.screen_replays)


def _with_seeds(configs: list[dict], seeds: list[dict]) -> list[dict]:
    """configs, then each seed not among them (once)."""
    out = list(configs)
    known = {config_key(c) for c in configs}
    for seed in seeds:
        if config_key(seed) not in known:
            known.add(config_key(seed))
            out.append(seed)
    return out


def _guess_rank(config: dict) -> tuple[int, int, bool]:
    """Round 1's one guess per tile (lowest first): GROUP_SIZE_M 16, 3 stages (else 2, 4, 5),
    8 warps for tiles of 8192 elements or more, else 4."""
    warps = 8 if config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"] >= 8192 else 4
    stages = config["num_stages"]
    return (
        abs(config["GROUP_SIZE_M"] - 16),
        abs(stages - 3) * 2 + (stages < 3),
        config["num_warps"] != warps,
    )
