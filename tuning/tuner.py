"""Tune the fused-MoE kernel for a MoE shape on this GPU: per batch size the fastest config.

Library: `tune(shape, batch_sizes, ...) -> TuneResult` (tuning.tune_results), or a `Tuner` kept
open over several tunes of one shape; the CLI is tuning.tune_cli, several GPUs tuning.spread.

Compiles run ahead of timing in a pool of processes (tuning.compile_pool), which start first
thing when the Tuner is built. The searches propose only configs that fit the GPU's own shared
memory per block (measurements.target: Triton's device properties), which the result records.
The GPU's ceilings are measured once, or read from this GPU's cache
(tuning.timing.cached_ceilings). Each chunk of batch sizes first compiles
`round_one_configs` (the first round of its searches) and the engine's own configs; every
round's configs are compiled batch size by batch size (an engine's kernel at the size it is
timed at), and one batch size's are timed while the next one's compile. The next chunk's first
round compiles while this chunk's head-to-heads are timed.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from tuning.compile_pool import CompilePool, default_workers, one_line
from tuning.config_files import REQUIRED_FIELDS, TUNED_BATCH_SIZES
from tuning.routing import UNIFORM
from tuning.search import (
    SM90_SHARED_MEMORY,
    CoarseToFineSearch,
    DownProjectionSearch,
    ExhaustiveSearch,
    KernelShape,
    config_key,
    config_of,
)
from tuning.tune_results import BatchResult, ProcessTimeline, TuneResult, load_log, save_log

ProgressCallback = Callable[[int, int, str], None]
# Batch sizes searched side by side: their compiles share one parallel batch.
CHUNK_BATCH_SIZES = 6
FINAL_REPLAYS = 20
# Rounds of a CoarseToFineSearch at most: tiles, warps and stages, group sizes, two
# neighbourhoods, final; of a DownProjectionSearch: tiles, three neighbourhoods, final.
SEARCH_ROUNDS = 6
DOWN_ROUNDS = 5


class DeviceMeasurements:
    """The GPU side of a tune: weights, measured ceilings, compile workers, layer timers.

    compile_workers processes compile candidate kernels in parallel ahead of timing (0: compile
    in this process as each is first timed); they start first, before the weights. The ceilings
    are measured when first asked for, or read where this GPU's were measured within
    CEILINGS_MAX_AGE_S (tuning.timing.cached_ceilings). compile_shard (i, n): this is process i
    of n tuning on one host (tuning.spread); see compile_order. seconds: where the set-up's and
    the ceilings' seconds went (ProcessTimeline's parts). engine: whose kernel is timed
    ({"engine", "source_dir", "python", "launch"}: tuning.backends.load_backend's arguments;
    None: moeops' builtin kernel).
    """

    def __init__(
        self,
        shape: KernelShape,
        *,
        device_index: int = 0,
        compile_workers: int | None = None,
        ceilings: dict | None = None,
        compile_shard: tuple[int, int] = (0, 1),
        engine: dict | None = None,
        routing=None,
    ):
        workers = default_workers() if compile_workers is None else compile_workers
        # before importing torch: the workers' start-up overlaps this process's set-up
        self._pool = (
            CompilePool(shape, workers, shard=compile_shard, backend=engine)
            if workers > 0
            else None
        )
        self.shape = shape
        self.device_index = device_index
        # the routing every timing draws its router choices under (tuning.routing)
        self.routing = routing or UNIFORM
        self.seconds: dict[str, float] = {}
        try:
            started = time.monotonic()
            import torch
            import triton

            from tuning import timing
            from tuning.backends import load_backend
            from tuning.compile_only import gpu_target

            imported = time.monotonic()
            torch.cuda.set_device(device_index)
            self.device_name = torch.cuda.get_device_name(device_index)
            self.triton_version = triton.__version__
            self.target = gpu_target()
            spec = engine or {"engine": "builtin"}
            self.backend = load_backend(
                spec["engine"],
                source_dir=spec.get("source_dir"),
                python=spec.get("python"),
                capability=self.target.capability,
                launch=spec.get("launch"),
            )
            context = time.monotonic()
            self.weights = timing.make_weights(shape)
            torch.cuda.synchronize()
            self.seconds.update(
                import_s=imported - started,
                cuda_s=context - imported,
                weights_s=time.monotonic() - context,
            )
        except BaseException:
            self.close()
            raise
        self._ceilings = ceilings

    @property
    def ceilings(self) -> dict:
        """The measured bandwidth_tbps, bf16_tflops and fp8_tflops (on first use: from this GPU's
        cache, else measured)."""
        if self._ceilings is None:
            from tuning import timing

            def measure():
                started = time.monotonic()
                measured = timing.measure_ceilings()
                self.seconds["ceilings_s"] = time.monotonic() - started
                return measured

            key = timing.gpu_key(self.device_index)
            self._ceilings = vars(timing.cached_ceilings(key, measure))
        return self._ceilings

    def wait_for_compile_workers(self) -> float:
        """Wait until the compile workers have all started; seconds from their creation until
        then (0 without workers)."""
        return self._pool.wait_started() if self._pool is not None else 0.0

    def start_compiles(self, configs: list[dict], batch_sizes=(None,)) -> list:
        """Start compiling configs ahead of timing (an engine's kernel: at each of
        batch_sizes); per config a handle for finish_compiles."""
        if self._pool is None:
            return [None] * len(configs)
        return self._pool.submit(configs, self.target, batch_sizes)

    def finish_compiles(self, handles: list) -> list[str | None]:
        """Wait for compiles start_compiles began; per handle None or why it failed."""
        if self._pool is None:
            return [None] * len(handles)
        return self._pool.collect(handles)

    def timer(self, M: int, routing=None):
        """A tuning.timing.LayerTimer at batch size M (time_config(config, replays) -> µs),
        under routing (default: the tune's)."""
        import torch

        from tuning.timing import LayerTimer

        # hand back the graph memory of timers already dropped
        torch.cuda.empty_cache()
        return LayerTimer(
            self.shape, self.weights, M, backend=self.backend, routing=routing or self.routing
        )

    def floor_us(self, M: int) -> float:
        """The layer's floor at batch size M, from the measured ceilings (µs)."""
        from tuning.timing import DeviceCeilings, moe_floor_us

        return moe_floor_us(self.shape, M, DeviceCeilings(**self.ceilings))

    def close(self) -> None:
        """Stop the compile workers."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class Tuner:
    """Tunes one shape; measurements default to DeviceMeasurements on GPU device_index.

    Use as a context manager, or call close().
    """

    def __init__(self, shape: KernelShape, measurements=None, **device_kwargs):
        self.shape = shape
        started = time.monotonic()
        self.measurements = measurements or DeviceMeasurements(shape, **device_kwargs)
        # what the searches prune with: this GPU's, not the H100's
        target = self.measurements.target
        self.search_limits = {
            "shared_memory": target.shared_memory,
            "capability": target.capability,
        }
        # building the measurements: compile workers launched, imports, weights (the workers'
        # start-up runs on meanwhile; the ceilings come with the tune)
        self.setup_s = time.monotonic() - started
        self.compile_s = 0.0
        # seconds timing configs on the GPU (their first launch here included) and how many
        self.timing_s = 0.0
        self.timings = 0
        self._compile_errors: dict[tuple, str | None] = {}
        # compiles started and not yet waited for: {backend's compile key: handle}
        self._compiling: dict[tuple, object] = {}

    def __enter__(self) -> Tuner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the measurements (compile workers)."""
        self.measurements.close()

    def tune(
        self,
        batch_sizes: Iterable[int] = TUNED_BATCH_SIZES,
        *,
        exhaustive: bool = False,
        down: bool = True,
        progress_callback: ProgressCallback | None = None,
        resume_path: str | Path | None = None,
        also_under=None,
    ) -> TuneResult:
        """Search each batch size M; per M the config, tuned/default/floor µs, tries, failures.

        also_under: another routing (tuning.routing.Routing) to time the written config, the
        default and the shipped entry under once each M is decided (BatchResult.also_under);
        default: uniform for a tune under a skewed routing, none for a uniform one.

        down: then search GEMM 2's own config with GEMM 1's fixed (DownProjectionSearch; also
        coarse-to-fine when exhaustive). resume_path: a tuning log; batch sizes it already holds
        (same shape, GPU, Triton and search) are kept, and the log is rewritten after every
        chunk of batch sizes. result.timeline: a ProcessTimeline.
        """
        started = time.monotonic()
        compile_before, timing_before, timings_before = self.compile_s, self.timing_s, self.timings
        batch_sizes = sorted(set(batch_sizes))
        backend = self.backend
        # vLLM reads a _down file on its sorted-A path only: elsewhere no down search for it
        down = down and backend.down_config_applies(self.shape)
        shipped = backend.shipped_configs(self.shape, self.measurements.device_name)
        shipped_down = (
            backend.shipped_configs(self.shape, self.measurements.device_name, down=True)
            if down and shipped is not None
            else None
        )
        result = TuneResult(
            shape=self.shape,
            device_name=self.measurements.device_name,
            triton_version=self.measurements.triton_version,
            search="exhaustive" if exhaustive else "coarse-to-fine",
            ceilings=self.measurements.ceilings,
            kernel={**backend.describe(), "path": backend.kernel_path(self.shape)},
            limits=self.measurements.target.limits(),
            routing=getattr(self.measurements, "routing", UNIFORM).as_dict(),
        )
        earlier_wall = 0.0
        also_under = self._other_routing(also_under)
        previous = load_log(resume_path)
        if previous is not None and previous.same_run_as(result):
            result.batches = {m: b for m, b in previous.batches.items() if m in batch_sizes}
            earlier_wall = previous.wall_s
        remaining = [m for m in batch_sizes if m not in result.batches]
        search_class = _search_class(exhaustive)
        # rounds per M, each reported once, one report per finished search, one per final
        steps = (2 if exhaustive else SEARCH_ROUNDS) + 1 + (DOWN_ROUNDS + 1 if down else 0) + 1
        total = len(remaining) * steps
        step = 0

        def report(message: str) -> None:
            nonlocal step
            step += 1
            if progress_callback is not None:
                progress_callback(min(step, total), total, message)

        chunks = [
            remaining[first : first + CHUNK_BATCH_SIZES]
            for first in range(0, len(remaining), CHUNK_BATCH_SIZES)
        ]
        for i, chunk in enumerate(chunks):
            timers = {m: self.measurements.timer(m) for m in chunk}
            own = {m: self._engine_configs(m, shipped) for m in chunk}
            switches = backend.search_switches(self.shape)
            searches = {
                m: search_class(
                    m,
                    self.shape,
                    seeds=own[m],
                    switches=switches,
                    **self.search_limits,
                )
                for m in chunk
            }
            # (most started during the chunk before, if any) the first round waits for these
            # size by size: one size is timed while the next compiles
            for m, configs in self._first_compiles(chunk, shipped, exhaustive).items():
                self._start_compiles(configs, m)
            self._run_searches(searches, timers, report)
            for m in chunk:
                result.batches[m] = self._finish(m, searches[m])
                report(f"M={m}: {result.batches[m].tuned_us:.1f} µs")
            if down:
                up_configs = {m: result.batches[m].config for m in chunk}
                # an entry of only {"USE_TMA": false} seeds nothing: it is the path turned off
                shipped_entries = shipped_down.entries.values() if shipped_down else ()
                down_seeds = [e for e in shipped_entries if _is_config(e)]
                down_searches = {
                    m: DownProjectionSearch(
                        m,
                        self.shape,
                        up_configs[m],
                        seeds=_with_m(down_seeds, up_configs[m]),
                        switches=backend.down_switches(self.shape),
                        **self.search_limits,
                    )
                    for m in chunk
                }
                self._run_searches(down_searches, timers, report, up_configs)
                for m in chunk:
                    _finish_down(result.batches[m], down_searches[m])
                    report(f"M={m}: {result.batches[m].tuned_us:.1f} µs with its down config")
            if i + 1 < len(chunks):
                # the next chunk's first batch compiles while this one's head-to-heads are timed
                for m, configs in self._first_compiles(chunks[i + 1], shipped, exhaustive).items():
                    self._start_compiles(configs, m)
            for m in chunk:
                self._head_to_head(result.batches[m], timers[m], shipped, shipped_down)
                report(f"M={m}: {result.batches[m].picked} {result.batches[m].tuned_us:.1f} µs")
                if also_under is not None:
                    self._time_under(result.batches[m], also_under, shipped, shipped_down)
            del timers
            result.wall_s = earlier_wall + time.monotonic() - started
            save_log(resume_path, result)
        result.wall_s = earlier_wall + time.monotonic() - started
        result.timeline = ProcessTimeline(
            setup_s=self.setup_s,
            # by now they have started: the first compile waited for them
            pool_start_s=self.measurements.wait_for_compile_workers(),
            compile_s=self.compile_s - compile_before,
            timing_s=self.timing_s - timing_before,
            timings=self.timings - timings_before,
            tune_s=time.monotonic() - started,
            **self.measurements.seconds,
        )
        if progress_callback is not None:
            progress_callback(total, total, "done")
        return result

    def _first_compiles(self, chunk, shipped, exhaustive) -> dict[int, list[dict]]:
        """What a chunk compiles before its first timing, per batch size: its search's first
        round and the engine's own configs (round_one_configs, size by size)."""
        return {
            m: round_one_configs(
                self.shape,
                [m],
                exhaustive=exhaustive,
                backend=self.backend,
                **self.search_limits,
            )
            + self._engine_configs(m, shipped)
            for m in chunk
        }

    def time_configs(
        self,
        M: int,
        configs: list[dict],
        replays: int = FINAL_REPLAYS,
        down_configs: list[dict | None] | None = None,
    ):
        """µs per layer of each config at batch size M (None where it fails), same routing;
        down_configs: GEMM 2's config beside each (None: the config itself)."""
        down_configs = down_configs or [None] * len(configs)
        self._compile([*configs, *(d for d in down_configs if d is not None)], M)
        timer = self.measurements.timer(M)
        times = []
        for config, down_config in zip(configs, down_configs, strict=True):
            if down_config is None:
                measured, _ = self._time_configs(timer, [config], replays)
                times.append(measured[config_key(config)])
            else:
                measured, _ = self._time_configs(timer, [down_config], replays, config)
                times.append(measured[config_key(down_config)])
        return times

    def _run_searches(self, searches, timers, report, up_configs=None) -> None:
        """Propose, compile and time the rounds of searches {M: search} side by side; with
        up_configs {M: config} the candidates are GEMM 2's configs beside those."""
        while True:
            proposals = {m: s.propose() for m, s in searches.items() if not s.done}
            proposals = {m: p for m, p in proposals.items() if p is not None}
            if not proposals:
                return
            # one batch size's compiles after another: each is timed while the next compile
            for m, proposal in proposals.items():
                self._start_compiles(proposal.configs, m)
            for m, proposal in proposals.items():
                self._finish_compiles(proposal.configs, m)
                up_config = up_configs[m] if up_configs else None
                times, errors = self._time_configs(
                    timers[m], proposal.configs, proposal.replays, up_config
                )
                searches[m].observe(times, errors)
                kind = "down " if up_config else ""
                report(f"M={m}: timed {len(proposal.configs)} {kind}configs")

    @property
    def backend(self):
        """Whose kernel the tune times (tuning.backends); moeops' own unless the measurements
        say otherwise."""
        backend = getattr(self.measurements, "backend", None)
        if backend is None:
            from tuning.backends.builtin import BuiltinBackend

            backend = BuiltinBackend()
        return backend

    def _engine_configs(self, M, shipped) -> list[dict]:
        """The engine's own configs at M: its default, then every entry of its shipped file."""
        configs = [self.backend.default_config(self.shape, M)]
        if shipped is not None:
            configs += list(shipped.entries.values())
        return configs

    def _finish(self, M, search) -> BatchResult:
        best = search.best
        if best is None:
            raise RuntimeError(f"M={M}: no config ran, not even the engine's default")
        failures = [
            {"config": config_of(k), "error": e} for k, e in sorted(search.state.errors.items())
        ]
        return BatchResult(
            M=M,
            config=best[0],
            tuned_us=round(best[1], 2),
            default_us=None,
            floor_us=round(self.measurements.floor_us(M), 2),
            candidates_tried=search.candidates_tried,
            failures=failures,
        )

    def _candidates(self, batch: BatchResult, shipped, shipped_down) -> dict:
        """{"tuned", "default", and "shipped" where the engine ships a file: (config,
        down_config)} at batch.M, as head_to_head times them."""
        M = batch.M
        candidates = {
            "tuned": (batch.config, batch.down_config),
            "default": (self.backend.default_config(self.shape, M), None),
        }
        if shipped is not None:
            down = shipped_down.entry_for(M) if shipped_down is not None else None
            candidates["shipped"] = (shipped.entry_for(M), down)
        return candidates

    def _head_to_head(self, batch: BatchResult, timer, shipped, shipped_down) -> None:
        """Time the search's pick against the engine's default and shipped configs in turn and
        keep the search's only when it is faster by more than the noise (see pick)."""
        M = batch.M
        candidates = self._candidates(batch, shipped, shipped_down)
        self._compile((c for pair in candidates.values() for c in pair if _is_config(c)), M)
        started = time.monotonic()
        measured = head_to_head(timer, candidates)
        self.timing_s += time.monotonic() - started
        self.timings += HEAD_TO_HEAD_ROUNDS * len(candidates)
        picked = pick(measured)
        if picked is None:
            raise RuntimeError(f"M={M}: no config ran, not even the engine's default")
        batch.picked = picked
        batch.config, batch.down_config = candidates[picked]
        batch.search_us = _rounded(measured.get("tuned"))
        batch.tuned_us = _rounded(measured[picked])
        batch.default_us = _rounded(measured.get("default"))
        batch.shipped_us = _rounded(measured.get("shipped"))

    def _other_routing(self, asked):
        """The routing to time the written configs under besides the tune's: asked, else
        uniform for a skewed tune; None where that is the tune's own."""
        own = getattr(self.measurements, "routing", UNIFORM)
        if asked is None and own.kind != "uniform":
            asked = UNIFORM
        return None if asked == own else asked

    def _time_under(self, batch: BatchResult, routing, shipped, shipped_down) -> None:
        """Time the written config, the default and the shipped entry at batch.M head to head
        under routing (not the tune's): how the file does under other traffic."""
        M = batch.M
        candidates = self._candidates(batch, shipped, shipped_down)
        timer = self.measurements.timer(M, routing=routing)
        started = time.monotonic()
        measured = head_to_head(timer, candidates)
        self.timing_s += time.monotonic() - started
        self.timings += HEAD_TO_HEAD_ROUNDS * len(candidates)
        batch.also_under = {
            "routing": routing.as_dict(),
            **{f"{name}_us": _rounded(measured.get(name)) for name in candidates},
        }

    def _compile(self, configs: Iterable[dict], M: int) -> None:
        """Compile configs for batch size M and wait for them."""
        configs = list(configs)
        self._start_compiles(configs, M)
        self._finish_compiles(configs, M)

    def _start_compiles(self, configs: Iterable[dict], M: int) -> None:
        """Start compiling for batch size M, in the compile processes, whichever of configs is
        neither compiled nor compiling."""
        todo = {}
        for config in configs:
            key = self.backend.compile_key(config, M)
            if key not in self._compile_errors and key not in self._compiling:
                todo.setdefault(key, config)
        if todo:
            handles = self.measurements.start_compiles(list(todo.values()), (M,))
            self._compiling.update(zip(todo, handles, strict=True))

    def _finish_compiles(self, configs: Iterable[dict], M: int) -> None:
        """Wait for the compiles of configs for batch size M started earlier; their errors are
        then known."""
        keys = dict.fromkeys(self.backend.compile_key(c, M) for c in configs)
        keys = [key for key in keys if key in self._compiling]
        if keys:
            started = time.monotonic()
            errors = self.measurements.finish_compiles([self._compiling.pop(k) for k in keys])
            self.compile_s += time.monotonic() - started
            self._compile_errors.update(zip(keys, errors, strict=True))

    def _time_configs(self, timer, configs, replays, up_config=None):
        """{key: µs or None}, {key: error} of configs; beside up_config they are GEMM 2's."""
        times, errors = {}, {}
        started = time.monotonic()
        for config in configs:
            key = config_key(config)
            error = self._compile_errors.get(self.backend.compile_key(config, timer.M))
            if error is None:
                self.timings += 1
                try:
                    # screening rounds capture 2 calls per graph, the final rounds 4
                    calls = 4 if replays >= FINAL_REPLAYS else 2
                    if up_config is None:
                        times[key] = timer.time_config(config, replays, calls)
                    else:
                        times[key] = timer.time_config(
                            up_config, replays, calls, down_config=config
                        )
                    continue
                except Exception as exc:
                    error = one_line(exc)
            times[key] = None
            errors[key] = error
        self.timing_s += time.monotonic() - started
        return times, errors


def tune(
    shape: KernelShape,
    batch_sizes: Iterable[int] = TUNED_BATCH_SIZES,
    *,
    device_index: int = 0,
    exhaustive: bool = False,
    down: bool = True,
    progress_callback: ProgressCallback | None = None,
    resume_path: str | Path | None = None,
    compile_workers: int | None = None,
    compile_shard: tuple[int, int] = (0, 1),
    engine: dict | None = None,
    routing=None,
    also_under=None,
) -> TuneResult:
    """Tune shape at batch_sizes on GPU device_index (see Tuner.tune); compile_shard: see
    compile_order; engine: whose kernel, routing: what the timings draw their router choices
    under (DeviceMeasurements)."""
    with Tuner(
        shape,
        device_index=device_index,
        compile_workers=compile_workers,
        compile_shard=compile_shard,
        engine=engine,
        routing=routing,
    ) as tuner:
        return tuner.tune(
            batch_sizes,
            exhaustive=exhaustive,
            down=down,
            progress_callback=progress_callback,
            resume_path=resume_path,
            also_under=also_under,
        )


def round_one_configs(
    shape: KernelShape,
    batch_sizes: Iterable[int],
    *,
    exhaustive: bool = False,
    backend=None,
    shared_memory: int = SM90_SHARED_MEMORY,
    capability: int = 90,
) -> list[dict[str, int]]:
    """What a tune of batch_sizes compiles before its first timing, one config per compile key:
    every size's first proposal (coarse-to-fine: one config per tile; exhaustive: the whole
    space) and the engine's default config (backend's; moeops' builtin kernel's by default).
    shared_memory, capability: the GPU's (bytes per block; 90 for 9.0), which the search prunes
    with.
    Tuner.tune compiles it per chunk, so that the defaults go through the compile pool with the
    first round."""
    if backend is None:
        from tuning.backends.builtin import BuiltinBackend

        backend = BuiltinBackend()
    search_class = _search_class(exhaustive)
    configs: dict[tuple, dict[str, int]] = {}
    switches = backend.search_switches(shape)
    for m in sorted(set(batch_sizes)):
        proposal = search_class(
            m, shape, switches=switches, shared_memory=shared_memory, capability=capability
        ).propose()
        for config in [*(proposal.configs if proposal else []), backend.default_config(shape, m)]:
            configs.setdefault(backend.compile_key(config, m), config)
    return list(configs.values())


# Rounds of the head-to-head between the search's pick and the engine's own configs.
HEAD_TO_HEAD_ROUNDS = 5
# The search's pick replaces the engine's own configs only when faster in every round and by
# more than this in the median of the rounds' ratios: a file must never make the engine slower.
# Each round times the candidates back to back, so what slows a whole round (clocks, the host)
# slows them alike and cancels in the ratio, where it would swamp a comparison of medians.
MIN_GAIN = 0.01


class Measured(NamedTuple):
    """A candidate's head-to-head: median µs, (max − min) / median, and µs per round."""

    us: float
    spread: float
    rounds: list[float]


def head_to_head(timer, candidates: dict) -> dict[str, Measured]:
    """{name: Measured} of candidates {name: (config, down_config or None)}, each timed
    HEAD_TO_HEAD_ROUNDS times in turns (order reversed every other round). A candidate that
    fails is left out."""
    rounds: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(HEAD_TO_HEAD_ROUNDS):
        for name in names if r % 2 == 0 else reversed(names):
            if rounds[name] is None:
                continue
            config, down = candidates[name]
            try:
                rounds[name].append(timer.time_config(config, FINAL_REPLAYS, down_config=down))
            except Exception:
                rounds[name] = None
    measured = {}
    for name, times in rounds.items():
        if times:
            middle = statistics.median(times)
            measured[name] = Measured(middle, (max(times) - min(times)) / middle, times)
    return measured


def pick(measured: dict[str, Measured]) -> str | None:
    """Which candidate's config to write: "tuned" only when faster than the best of the engine's
    own ("default", "shipped") in every round, by more than MIN_GAIN in the median ratio; else
    that best."""
    own = {name: m for name, m in measured.items() if name != "tuned"}
    if not own:
        return "tuned" if "tuned" in measured else None
    best = min(own, key=lambda name: own[name].us)
    if "tuned" not in measured:
        return best
    ratios = [t / o for t, o in zip(measured["tuned"].rounds, own[best].rounds, strict=True)]
    faster = max(ratios) < 1 and statistics.median(ratios) < 1 - MIN_GAIN
    return "tuned" if faster else best


def _rounded(measured) -> float | None:
    return None if measured is None else round(measured[0], 2)


def _is_config(entry: dict | None) -> bool:
    """Whether entry is a whole config (not None, nor vLLM's `{"USE_TMA": false}` entry)."""
    return entry is not None and all(field in entry for field in REQUIRED_FIELDS)


def _with_m(configs, up_config: dict) -> list[dict]:
    """configs with up_config's BLOCK_SIZE_M, which GEMM 2 must share with GEMM 1."""
    return [{**c, "BLOCK_SIZE_M": up_config["BLOCK_SIZE_M"]} for c in configs]


def _search_class(exhaustive: bool):
    return ExhaustiveSearch if exhaustive else CoarseToFineSearch


def _finish_down(batch: BatchResult, search: DownProjectionSearch) -> None:
    """Record a finished down search in batch: down config, tuned and shared-config µs."""
    batch.candidates_tried += search.candidates_tried
    batch.failures += [
        {"config": config_of(k), "error": e, "down": True}
        for k, e in sorted(search.state.errors.items())
    ]
    best = search.best
    if best is None:
        return
    batch.down_config = best[0]
    batch.tuned_us = round(best[1], 2)
    if search.shared_us is not None:
        batch.shared_config_us = round(search.shared_us, 2)


def progress_bar(stream=sys.stderr, width: int = 30) -> ProgressCallback:
    """A progress callback drawing `[#####.....] 12/40 1m05s M=64: …` on one line of stream."""
    started = time.monotonic()

    def draw(done: int, total: int, message: str) -> None:
        filled = width * done // max(total, 1)
        elapsed = int(time.monotonic() - started)
        bar = "#" * filled + "." * (width - filled)
        stream.write(f"\r[{bar}] {done}/{total} {elapsed // 60}m{elapsed % 60:02d}s {message:<40}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return draw
