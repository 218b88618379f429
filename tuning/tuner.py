"""Tune the fused-MoE kernel for a model's MoE shape on this GPU; write the engine's config file.

Library: `tune(shape, batch_sizes, ...) -> TuneResult`, or a `Tuner` kept open over several
tunes of one shape. Several GPUs: `tuning.spread.spread_tune` (CLI: `--gpus 0,1,...` or `all`)
runs one process per GPU on a share of the batch sizes and merges their logs with
`merge_results` (by hand: `--merge LOG ...`). The CLI resumes from its log: finished batch sizes
are skipped.

Compiles run in a pool of processes ahead of timing, which compile for this GPU without
touching it (tuning.compile_only). The pool's processes start first thing when the Tuner is
built, forked from a server process that imports torch meanwhile, so that their start-up
overlaps this process's imports and weights instead of the first compile. The GPU's ceilings
are measured once, or read from this GPU's cache (tuning.timing.cached_ceilings). Each chunk of
batch sizes first compiles `round_one_configs` (the first round of its searches and the default
configs) in one batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuning.compile_only import GpuTarget
from tuning.config_files import (
    TUNED_BATCH_SIZES,
    config_file_name,
    config_file_relpath,
    dumps_config,
)
from tuning.search import (
    CoarseToFineSearch,
    DownProjectionSearch,
    ExhaustiveSearch,
    KernelShape,
    compile_key,
    config_key,
    config_of,
)

ProgressCallback = Callable[[int, int, str], None]
# Batch sizes searched side by side: their compiles share one parallel batch.
CHUNK_BATCH_SIZES = 6
FINAL_REPLAYS = 20
# Rounds of a DownProjectionSearch: tiles, warps and stages, group sizes, final.
DOWN_ROUNDS = 4
COMPILE_TIMEOUT_S = 300
# What the compile pool's server process imports once, before forking the workers from it (the
# heavy imports; the server skips silently what it cannot import).
COMPILE_WORKER_PRELOAD = ["torch", "triton"]


@dataclass
class BatchResult:
    """The outcome at one batch size M: the chosen configs and the layer's µs with them.

    config: GEMM 1's (and the engines' single) config; down_config: GEMM 2's (SGLang's `_down`
    entry), None where no down search ran. tuned_us: the layer with both; shared_config_us: the
    layer with config for both GEMMs (what vLLM, which has no down files, runs).
    failures: configs that failed, those of the down search marked "down": true.
    """

    M: int
    config: dict[str, int]
    tuned_us: float
    default_us: float | None
    floor_us: float
    candidates_tried: int
    failures: list[dict] = field(default_factory=list)
    down_config: dict[str, int] | None = None
    shared_config_us: float | None = None

    @classmethod
    def from_dict(cls, data: dict) -> BatchResult:
        """Inverse of dataclasses.asdict."""
        return cls(**data)


@dataclass
class ProcessTimeline:
    """Where one tuning process's seconds went (s). setup_s: building the Tuner (imports,
    weights; in tuning.spread's processes counted from their launch); tune_s: Tuner.tune
    (waiting for the compile processes to start, measuring the ceilings, searching); compile_s:
    the part of tune_s spent waiting on compiles. pool_start_s: from the compile processes'
    creation, first thing in the set-up, until all had started; it overlaps setup_s and, where
    longer, the start of tune_s. Parts of setup_s: import_s (torch, Triton, the kernel), cuda_s
    (this process's CUDA context), weights_s; of tune_s: ceilings_s (measuring them; 0 when read
    from the cache).
    """

    setup_s: float = 0.0
    pool_start_s: float = 0.0
    compile_s: float = 0.0
    tune_s: float = 0.0
    import_s: float = 0.0
    cuda_s: float = 0.0
    weights_s: float = 0.0
    ceilings_s: float = 0.0


@dataclass
class TuneResult:
    """A tune of one shape on one GPU: per batch size config and µs (tuned, default, floor).

    ceilings: the measured bandwidth_tbps, bf16_tflops and fp8_tflops behind floor_us.
    search: "coarse-to-fine" or "exhaustive". wall_s: seconds the tune took.
    timeline: where this run's seconds went: a ProcessTimeline from Tuner.tune, per GPU index
    its process's from tuning.spread.spread_tune; not in the log, None when read from one.
    """

    shape: KernelShape
    device_name: str
    triton_version: str
    search: str
    ceilings: dict
    batches: dict[int, BatchResult] = field(default_factory=dict)
    wall_s: float = 0.0
    timeline: ProcessTimeline | dict[int, ProcessTimeline] | None = field(
        default=None, compare=False
    )

    def entries(self) -> dict[int, dict]:
        """{M: config} as the engines' config files hold them, M ascending."""
        return {m: dict(self.batches[m].config) for m in sorted(self.batches)}

    def down_entries(self) -> dict[int, dict]:
        """{M: down config} for SGLang's `_down` file (batch sizes without one left out)."""
        return {
            m: dict(self.batches[m].down_config)
            for m in sorted(self.batches)
            if self.batches[m].down_config is not None
        }

    def speedup_geomean(self) -> float | None:
        """Geometric mean over batch sizes of default µs / tuned µs."""
        ratios = [b.default_us / b.tuned_us for b in self.batches.values() if b.default_us]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    def to_dict(self) -> dict:
        """JSON-ready form (the tuning log)."""
        return {
            "shape": self.shape.as_dict(),
            "device_name": self.device_name,
            "triton_version": self.triton_version,
            "search": self.search,
            "ceilings": self.ceilings,
            "wall_s": self.wall_s,
            "batches": {str(m): vars(self.batches[m]) for m in sorted(self.batches)},
        }

    @classmethod
    def from_dict(cls, data: dict) -> TuneResult:
        """Inverse of to_dict."""
        return cls(
            shape=KernelShape.from_dict(data["shape"]),
            device_name=data["device_name"],
            triton_version=data["triton_version"],
            search=data["search"],
            ceilings=data["ceilings"],
            batches={int(m): BatchResult.from_dict(b) for m, b in data["batches"].items()},
            wall_s=data.get("wall_s", 0.0),
        )

    def same_run_as(self, other: TuneResult) -> bool:
        """Whether two results tune the same shape on the same GPU model and Triton."""
        return (self.shape, self.device_name, self.triton_version, self.search) == (
            other.shape,
            other.device_name,
            other.triton_version,
            other.search,
        )


def merge_results(results: Iterable[TuneResult]) -> TuneResult:
    """One result from parts tuned side by side (e.g. one process per GPU, disjoint M).

    The parts must agree on shape, device name, Triton version and search; a batch size
    in several parts keeps the last. wall_s is the longest part's (they ran in parallel).
    """
    results = list(results)
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    for other in results[1:]:
        if not first.same_run_as(other):
            raise ValueError("results disagree on shape, device, Triton version or search")
    merged = replace(first, batches={}, wall_s=max(r.wall_s for r in results), timeline=None)
    for result in results:
        merged.batches.update(result.batches)
    return merged


def config_path(
    result: TuneResult, out_dir: str | Path, style: str = "vllm", *, down: bool = False
) -> Path:
    """Where the engine's config file for this result goes under out_dir (SGLang: its folder);
    down: SGLang's `_down` file of GEMM 2's configs."""
    name = _engine_file_name(result.shape, result.device_name, style, down=down)
    return Path(out_dir) / config_file_relpath(name, style, result.triton_version)


def _engine_file_name(shape: KernelShape, device_name: str, style: str, *, down=False) -> str:
    """The engine's file name for shape on device_name (bf16 names carry no dtype part)."""
    return config_file_name(
        shape.E,
        shape.N,
        device_name,
        "fp8_w8a8" if shape.dtype == "fp8_w8a8" else None,
        shape.block_shape,
        style=style,
        down_moe=down,
    )


def write_config_file(
    result: TuneResult, out_dir: str | Path, style: str = "vllm", *, down: bool = False
) -> Path:
    """Write the engine's config file (exact name and content); returns its path.

    vLLM's files record triton_version inside; SGLang's name it by their folder instead.
    down: SGLang's `_down` file (GEMM 2's configs); raises ConfigFileError for vLLM.
    """
    path = config_path(result, out_dir, style, down=down)
    path.parent.mkdir(parents=True, exist_ok=True)
    version = result.triton_version if style == "vllm" else None
    path.write_text(dumps_config(result.down_entries() if down else result.entries(), version))
    return path


def write_config_files(result: TuneResult, out_dir: str | Path, style: str = "vllm") -> list[Path]:
    """The engine's config file, and for SGLang its `_down` file when down configs were tuned."""
    paths = [write_config_file(result, out_dir, style)]
    if style == "sglang" and result.down_entries():
        paths.append(write_config_file(result, out_dir, style, down=True))
    return paths


class DeviceMeasurements:
    """The GPU side of a tune: weights, measured ceilings, compile workers, layer timers.

    compile_workers processes compile candidate kernels in parallel ahead of timing (0: compile
    in this process as each is first timed); they start first, before the weights. The ceilings
    are measured when first asked for, or read where this GPU's were measured within
    CEILINGS_MAX_AGE_S (tuning.timing.cached_ceilings). compile_shard (i, n): this is process i
    of n tuning on one host (tuning.spread); see compile_order. seconds: where the set-up's and
    the ceilings' seconds went (ProcessTimeline's parts).
    """

    def __init__(
        self,
        shape: KernelShape,
        *,
        device_index: int = 0,
        compile_workers: int | None = None,
        ceilings: dict | None = None,
        compile_shard: tuple[int, int] = (0, 1),
    ):
        workers = _default_workers() if compile_workers is None else compile_workers
        # before importing torch: the workers' start-up overlaps this process's set-up
        self._pool = _CompilePool(shape, workers, shard=compile_shard) if workers > 0 else None
        self.shape = shape
        self.device_index = device_index
        self.seconds: dict[str, float] = {}
        try:
            started = time.monotonic()
            import torch
            import triton

            from tuning import timing
            from tuning.compile_only import gpu_target

            imported = time.monotonic()
            torch.cuda.set_device(device_index)
            self.device_name = torch.cuda.get_device_name(device_index)
            self.triton_version = triton.__version__
            self.target = gpu_target()
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

    def compile(self, configs: list[dict]) -> list[str | None]:
        """Compile configs ahead of timing; per config None or why it failed."""
        if self._pool is None:
            return [None] * len(configs)
        return self._pool.compile(configs, self.target)

    def timer(self, M: int):
        """A tuning.timing.LayerTimer at batch size M (time_config(config, replays) -> µs)."""
        import torch

        from tuning.timing import LayerTimer

        # hand back the graph memory of timers already dropped
        torch.cuda.empty_cache()
        return LayerTimer(self.shape, self.weights, M)

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
        # building the measurements: compile workers launched, imports, weights (the workers'
        # start-up runs on meanwhile; the ceilings come with the tune)
        self.setup_s = time.monotonic() - started
        self.compile_s = 0.0
        self._compile_errors: dict[tuple, str | None] = {}

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
    ) -> TuneResult:
        """Search each batch size M; per M the config, tuned/default/floor µs, tries, failures.

        down: then search GEMM 2's own config with GEMM 1's fixed (DownProjectionSearch; also
        coarse-to-fine when exhaustive). resume_path: a tuning log; batch sizes it already holds
        (same shape, GPU, Triton and search) are kept, and the log is rewritten after every
        chunk of batch sizes. result.timeline: a ProcessTimeline.
        """
        started = time.monotonic()
        compile_before = self.compile_s
        batch_sizes = sorted(set(batch_sizes))
        result = TuneResult(
            shape=self.shape,
            device_name=self.measurements.device_name,
            triton_version=self.measurements.triton_version,
            search="exhaustive" if exhaustive else "coarse-to-fine",
            ceilings=self.measurements.ceilings,
        )
        earlier_wall = 0.0
        previous = _load_log(resume_path)
        if previous is not None and previous.same_run_as(result):
            result.batches = {m: b for m, b in previous.batches.items() if m in batch_sizes}
            earlier_wall = previous.wall_s
        remaining = [m for m in batch_sizes if m not in result.batches]
        search_class = _search_class(exhaustive)
        # rounds per M, each reported once, and one report per finished search
        steps = (2 if exhaustive else 4) + 1 + (DOWN_ROUNDS + 1 if down else 0)
        total = len(remaining) * steps
        step = 0

        def report(message: str) -> None:
            nonlocal step
            step += 1
            if progress_callback is not None:
                progress_callback(min(step, total), total, message)

        for first in range(0, len(remaining), CHUNK_BATCH_SIZES):
            chunk = remaining[first : first + CHUNK_BATCH_SIZES]
            timers = {m: self.measurements.timer(m) for m in chunk}
            searches = {m: search_class(m, self.shape) for m in chunk}
            self._compile(round_one_configs(self.shape, chunk, exhaustive=exhaustive))
            self._run_searches(searches, timers, report)
            for m in chunk:
                result.batches[m] = self._finish(m, searches[m], timers[m])
                report(f"M={m}: {result.batches[m].tuned_us:.1f} µs")
            if down:
                up_configs = {m: result.batches[m].config for m in chunk}
                down_searches = {
                    m: DownProjectionSearch(m, self.shape, up_configs[m]) for m in chunk
                }
                self._run_searches(down_searches, timers, report, up_configs)
                for m in chunk:
                    _finish_down(result.batches[m], down_searches[m])
                    report(f"M={m}: {result.batches[m].tuned_us:.1f} µs with its down config")
            del timers
            result.wall_s = earlier_wall + time.monotonic() - started
            _save_log(resume_path, result)
        result.wall_s = earlier_wall + time.monotonic() - started
        result.timeline = ProcessTimeline(
            setup_s=self.setup_s,
            # by now they have started: the first compile waited for them
            pool_start_s=self.measurements.wait_for_compile_workers(),
            compile_s=self.compile_s - compile_before,
            tune_s=time.monotonic() - started,
            **self.measurements.seconds,
        )
        if progress_callback is not None:
            progress_callback(total, total, "done")
        return result

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
        self._compile([*configs, *(d for d in down_configs if d is not None)])
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
            self._compile(c for p in proposals.values() for c in p.configs)
            for m, proposal in proposals.items():
                up_config = up_configs[m] if up_configs else None
                times, errors = self._time_configs(
                    timers[m], proposal.configs, proposal.replays, up_config
                )
                searches[m].observe(times, errors)
                kind = "down " if up_config else ""
                report(f"M={m}: timed {len(proposal.configs)} {kind}configs")

    def _finish(self, M, search, timer) -> BatchResult:
        default = _default_config(self.shape, M)
        default_times, _ = self._time_configs(timer, [default], FINAL_REPLAYS)
        default_us = default_times[config_key(default)]
        best = search.best
        if best is None or (default_us is not None and default_us < best[1]):
            if default_us is None:
                raise RuntimeError(f"M={M}: no config ran, not even the default")
            best = (default, default_us)
        failures = [
            {"config": config_of(k), "error": e} for k, e in sorted(search.state.errors.items())
        ]
        return BatchResult(
            M=M,
            config=best[0],
            tuned_us=round(best[1], 2),
            default_us=None if default_us is None else round(default_us, 2),
            floor_us=round(self.measurements.floor_us(M), 2),
            candidates_tried=search.candidates_tried,
            failures=failures,
        )

    def _compile(self, configs: Iterable[dict]) -> None:
        todo = {}
        for config in configs:
            key = compile_key(config)
            if key not in self._compile_errors and key not in todo:
                todo[key] = config
        if todo:
            started = time.monotonic()
            errors = self.measurements.compile(list(todo.values()))
            self.compile_s += time.monotonic() - started
            self._compile_errors.update(zip(todo, errors, strict=True))

    def _time_configs(self, timer, configs, replays, up_config=None):
        """{key: µs or None}, {key: error} of configs; beside up_config they are GEMM 2's."""
        times, errors = {}, {}
        for config in configs:
            key = config_key(config)
            error = self._compile_errors.get(compile_key(config))
            if error is None:
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
                    error = _one_line(exc)
            times[key] = None
            errors[key] = error
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
) -> TuneResult:
    """Tune shape at batch_sizes on GPU device_index (see Tuner.tune); compile_shard: see
    compile_order."""
    with Tuner(
        shape,
        device_index=device_index,
        compile_workers=compile_workers,
        compile_shard=compile_shard,
    ) as tuner:
        return tuner.tune(
            batch_sizes,
            exhaustive=exhaustive,
            down=down,
            progress_callback=progress_callback,
            resume_path=resume_path,
        )


def round_one_configs(
    shape: KernelShape, batch_sizes: Iterable[int], *, exhaustive: bool = False
) -> list[dict[str, int]]:
    """What a tune of batch_sizes compiles before its first timing, one config per compile key:
    every size's first proposal (coarse-to-fine: one config per tile; exhaustive: the whole
    space) and its default config. Tuner.tune compiles it per chunk, so that the defaults go
    through the compile pool with the first round."""
    search_class = _search_class(exhaustive)
    configs: dict[tuple, dict[str, int]] = {}
    for m in sorted(set(batch_sizes)):
        proposal = search_class(m, shape).propose()
        for config in [*(proposal.configs if proposal else []), _default_config(shape, m)]:
            configs.setdefault(compile_key(config), config)
    return list(configs.values())


def _search_class(exhaustive: bool):
    return ExhaustiveSearch if exhaustive else CoarseToFineSearch


def _default_config(shape: KernelShape, M: int) -> dict[str, int]:
    """The engines' fallback config at batch size M, which every tune times."""
    from tuning.fused_moe import default_config

    block_shape = list(shape.block_shape) if shape.block_shape else None
    return default_config(M, shape.E, shape.N, shape.H, shape.top_k, shape.dtype, block_shape)


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


class _CompilePool:
    """Worker processes that compile candidates into Triton's on-disk cache, in parallel.

    They start at once, not at the first compile, and set up while the caller goes on; they
    compile for the GPU compile() names without a CUDA context (tuning.compile_only).
    set_up(shape_data): a worker's set-up (default: CPU tensors of shape's layer, values unset;
    the tests give others).
    """

    def __init__(
        self,
        shape: KernelShape,
        workers: int,
        set_up: Callable[[dict], None] | None = None,
        *,
        shard: tuple[int, int] = (0, 1),
    ):
        import multiprocessing

        # workers forked from one server that imported torch, not each importing it (spawn);
        # not forked from here, which may hold threads or a CUDA context
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(COMPILE_WORKER_PRELOAD)
        # a start-up task waits here until every worker holds one: one task per worker, so
        # that all have started when all these tasks are done
        started = context.Barrier(workers)
        # the workers compile into the cache this process reads now, whatever the server's was
        cache = os.environ.get("TRITON_CACHE_DIR")
        initargs = (set_up or _set_up_compile_worker, shape.as_dict(), cache, started)
        self._created_at = time.time()
        self._start_s: float | None = None
        self._shard = shard
        self._executor = None
        self._started: list = []
        # why the workers compile no more (_give_up), None while they do
        self.broken: str | None = None
        # a thread starts them (each start waits for the server's imports): meanwhile this
        # process imports torch itself
        self._starter = threading.Thread(
            target=self._start_workers, args=(context, workers, initargs), daemon=True
        )
        self._starter.start()

    def _start_workers(self, context, workers: int, initargs: tuple) -> None:
        from concurrent.futures import ProcessPoolExecutor

        try:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=context,
                initializer=_start_compile_worker,
                initargs=initargs,
            )
            # the executor starts a process per task submitted while none is idle
            self._started = [self._executor.submit(_compile_worker_started) for _ in range(workers)]
        except Exception as exc:
            # a daemonic process may have no children, say: the timing process compiles
            self._give_up(f"compile processes could not start ({_one_line(exc)})")
            self._started = []

    def _give_up(self, reason: str) -> None:
        """No more compiles in the workers (reason: why); the timing process compiles."""
        self.broken = reason
        print(f"{reason}; compiling in the tuning process", file=sys.stderr)

    def _wait_for_starter(self) -> None:
        if self.broken is None:
            self._starter.join(COMPILE_TIMEOUT_S)
            if self._starter.is_alive():
                self._give_up(f"compile processes did not start within {COMPILE_TIMEOUT_S} s")

    def wait_started(self) -> float:
        """Wait until every worker has set up; seconds from this pool's creation until then
        (or until the workers died, or COMPILE_TIMEOUT_S passed)."""
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        if self._start_s is None:
            self._wait_for_starter()
            try:
                ready_at = max(
                    (f.result(timeout=COMPILE_TIMEOUT_S) for f in self._started),
                    default=time.time(),
                )
            except (FutureTimeout, BrokenProcessPool):
                # died: compile() leaves the compiles to the timing process; slow: they queue
                ready_at = time.time()
            self._start_s = ready_at - self._created_at
        return self._start_s

    def compile(self, configs: list[dict], target: GpuTarget) -> list[str | None]:
        """Per config None, or why it failed to compile for target."""
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        order = compile_order(configs, self._shard)
        self._wait_for_starter()
        if self.broken or not self._started:
            # the timing process compiles each at its first launch
            return [None] * len(configs)
        try:
            futures = {
                i: self._executor.submit(_compile_in_worker, configs[i], target) for i in order
            }
        except BrokenProcessPool:
            # the workers died earlier (in their set-up, say): the timing process compiles all
            return [None] * len(configs)
        errors: list[str | None] = []
        for i in range(len(configs)):
            try:
                errors.append(futures[i].result(timeout=COMPILE_TIMEOUT_S))
            except FutureTimeout:
                errors.append(f"compile took over {COMPILE_TIMEOUT_S} s")
            except BrokenProcessPool:
                # the timing process compiles whatever the workers could not
                errors.append(None)
            except Exception as exc:
                errors.append(_one_line(exc))
        failed = {e for e in errors if e is not None}
        if len(configs) > 1 and len(failed) == 1 and None not in errors:
            # every config failing alike is the workers' failure, not the configs'
            self._give_up(f"compile processes failed ({failed.pop()})")
            return [None] * len(configs)
        return errors

    def close(self) -> None:
        self._wait_for_starter()
        if self._executor is not None:
            self._executor.shutdown(wait=not self._starter.is_alive(), cancel_futures=True)
        # the start-up barrier's semaphores go now, not at exit (which warns of them as leaked)
        self._executor, self._started = None, []


def compile_order(configs: list[dict], shard: tuple[int, int] = (0, 1)) -> list[int]:
    """The order (indices into configs) in which process shard[0] of shard[1] compiles them.

    The processes of a spread tune share one Triton cache on disk and need mostly the same
    configs at the same moment (every size's first round). Each starts with its own share of
    the compile keys (compile_owner), so that when it reaches the others' share they are mostly
    in the cache already and load instead of compiling. Within a share, the biggest tiles and
    deepest pipelines first: they compile slowest.
    """
    index, count = shard

    def key(i: int) -> tuple[bool, int]:
        config = configs[i]
        size = (
            config["num_stages"]
            * config["BLOCK_SIZE_M"]
            * config["BLOCK_SIZE_N"]
            * config["BLOCK_SIZE_K"]
        )
        return compile_owner(config, count) != index, -size

    return sorted(range(len(configs)), key=key)


def compile_owner(config: dict, processes: int) -> int:
    """Which of a host's tuning processes compiles config first: a stable hash of its key."""
    return zlib.crc32(repr(compile_key(config)).encode()) % processes


_WORKER: dict = {}


def _start_compile_worker(
    set_up: Callable[[dict], None], shape_data: dict, cache: str | None, started
) -> None:
    if cache is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = cache
    set_up(shape_data)
    _WORKER["started"] = started


def _compile_worker_started() -> float:
    """A compile worker's start-up task: time.time() once every worker has set up."""
    _WORKER["started"].wait()
    return time.time()


def _set_up_compile_worker(shape_data: dict) -> None:
    import torch

    from tuning import timing

    shape = KernelShape.from_dict(shape_data)
    # a compile process's torch work is small: threads would only contend with the others'
    torch.set_num_threads(1)
    # the kernels specialise on strides, which do not depend on E: top_k experts will do;
    # compiling needs shapes, dtypes and alignment, not values
    small = replace(shape, E=shape.top_k)
    weights = timing.unset_weights(small)
    topk_weights, topk_ids = timing.random_routing(1, 16, small.E, small.top_k, device="cpu")
    x = torch.empty((16, shape.H), dtype=timing.activation_dtype(shape))
    _WORKER.update(
        shape=small,
        weights=weights,
        x=x,
        out=torch.empty_like(x),
        topk_weights=topk_weights[0],
        topk_ids=topk_ids[0],
    )


def _compile_in_worker(config: dict, target: GpuTarget) -> str | None:
    """Compile the layer's kernels with config for target; None, or why they failed."""
    from triton.runtime import driver

    from tuning.compile_only import compile_only_driver
    from tuning.fused_moe import fused_moe

    w = _WORKER
    try:
        if w.get("target") != target:
            driver.set_active(compile_only_driver(target))
            w["target"] = target
        fused_moe(
            w["x"],
            w["weights"].w1,
            w["weights"].w2,
            w["topk_weights"],
            w["topk_ids"],
            config=config,
            out=w["out"],
            **w["weights"].layer_kwargs(w["shape"]),
        )
    except Exception as exc:
        return _one_line(exc)
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _default_workers() -> int:
    # a tune's round compiles some 30 to 60 kernels at once; more processes would mostly wait
    return max(1, min(32, (os.cpu_count() or 2) - 1))


class TuningLogError(ValueError):
    """A tuning log that cannot be read back; the message names it."""


def _load_log(path: str | Path | None) -> TuneResult | None:
    """The log at path, None where there is none yet; TuningLogError if it cannot be read."""
    if path is None or not Path(path).exists():
        return None
    return _read_log(path)


def _read_log(path: str | Path) -> TuneResult:
    try:
        return TuneResult.from_dict(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise TuningLogError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TuningLogError(f"{path} is not a tuning log ({type(exc).__name__}: {exc})") from None


def _save_log(path: str | Path | None, result: TuneResult) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    partial.replace(path)


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


def shape_from_args(args: argparse.Namespace) -> KernelShape:
    """The KernelShape of --model-config, --tp, --ep, --dtype and --block-shape."""
    from tuning.moe_params import moe_params

    try:
        text = Path(args.model_config).read_text()
    except OSError as exc:
        problem = f"cannot read {args.model_config}: {exc.strerror}"
        raise ValueError(f"--model-config: {problem}") from None
    params = moe_params(text, tp=args.tp, ep=args.ep)
    dtype = args.dtype or ("fp8_w8a8" if params.quantization == "fp8" else "bf16")
    block_shape = None
    if dtype == "fp8_w8a8":
        block_shape = parse_ints(args.block_shape) if args.block_shape else params.block_shape
    return KernelShape(
        E=params.experts_per_rank,
        N=params.N,
        H=params.hidden_size,
        top_k=params.topk,
        dtype=dtype,
        block_shape=tuple(block_shape) if block_shape else None,
    )


def add_shape_arguments(parser: argparse.ArgumentParser, *, model_config_required=True) -> None:
    """--model-config, --tp, --ep, --dtype, --block-shape, --batch-sizes, --device."""
    parser.add_argument(
        "--model-config", required=model_config_required, help="the model's HF config.json"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (default 1)")
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp8_w8a8"),
        help="kernel dtype (default: fp8_w8a8 for fp8 checkpoints, else bf16)",
    )
    parser.add_argument(
        "--block-shape", help="fp8 weight-scale block, e.g. 128,128 (default: the model's)"
    )
    parser.add_argument(
        "--batch-sizes",
        help="comma-separated batch sizes (default: the 18 the engines tune)",
    )
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning tune`."""
    # --merge takes the shape from its logs
    add_shape_arguments(parser, model_config_required=False)
    parser.add_argument("--out", required=True, help="folder for the config file and the log")
    parser.add_argument("--style", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument(
        "--exhaustive", action="store_true", help="time every viable config (slow; a check)"
    )
    parser.add_argument(
        "--no-down",
        action="store_true",
        help="skip the search for GEMM 2's own configs (SGLang's _down file)",
    )
    parser.add_argument(
        "--compile-workers",
        type=int,
        help="parallel compile processes (default: CPUs − 1, at most 32; with --gpus, per GPU"
        " process: the CPUs shared out)",
    )
    parser.add_argument(
        "--gpus",
        help="spread the tune over these GPUs, e.g. 0,1,2,3 or all (one process each; --log"
        " then names a folder for their logs)",
    )
    parser.add_argument("--log", help="tuning log to resume from and write (default: in --out)")
    parser.add_argument("--fresh", action="store_true", help="ignore an existing log")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="LOG",
        help="write the config file from these logs (tuned side by side) instead of tuning",
    )


def run(args: argparse.Namespace) -> int:
    """Tune (or merge logs), write the config file, print its path and a summary."""
    if args.merge:
        try:
            result = merge_results(_read_log(p) for p in args.merge)
        except ValueError as exc:
            print(f"error: --merge: {exc}", file=sys.stderr)
            return 2
        for path in write_config_files(result, args.out, args.style):
            print(path)
        return 0
    if not args.model_config:
        print("error: --model-config is required (except with --merge)", file=sys.stderr)
        return 2
    try:
        shape = shape_from_args(args)
        batch_sizes = parse_ints(args.batch_sizes) if args.batch_sizes else TUNED_BATCH_SIZES
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.gpus:
        from tuning import spread

        try:
            gpus = spread.parse_gpus(args.gpus)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if len(gpus) > 1:
            return spread.run_cli(args, shape, batch_sizes, gpus)
        args.device = gpus[0]
    import torch

    if not torch.cuda.is_available():
        print("error: tuning needs a CUDA GPU", file=sys.stderr)
        return 1
    name = _engine_file_name(shape, torch.cuda.get_device_name(args.device), args.style)
    log = Path(args.log) if args.log else Path(args.out) / f"{name}.tuning-log.json"
    if args.fresh and log.exists():
        log.unlink()
    try:
        result = tune(
            shape,
            batch_sizes,
            device_index=args.device,
            exhaustive=args.exhaustive,
            down=not args.no_down,
            progress_callback=progress_bar(),
            resume_path=log,
            compile_workers=args.compile_workers,
        )
    except TuningLogError as exc:
        print(f"error: {exc}; --fresh starts the tune over", file=sys.stderr)
        return 2
    for path in write_config_files(result, args.out, args.style):
        print(path)
    print_summary(result)
    return 0


def print_summary(result: TuneResult) -> None:
    """Per batch size tuned, one-config, default and floor µs and tries; speedup and wall."""
    for m, b in sorted(result.batches.items()):
        shared = "" if b.shared_config_us is None else f"  one config {b.shared_config_us:9.1f} µs"
        print(
            f"M={m:>5}  tuned {b.tuned_us:9.1f} µs{shared}  default"
            f" {b.default_us or float('nan'):9.1f} µs  floor {b.floor_us:9.1f} µs"
            f"  tried {b.candidates_tried}"
        )
    speedup = result.speedup_geomean()
    if speedup is not None:
        print(f"tuned/default geomean speedup {speedup:.2f}x")
    print(f"wall {result.wall_s:.0f} s")


def parse_ints(text: str) -> tuple[int, ...]:
    """ "1,2,4" → (1, 2, 4); ValueError unless every value is a positive integer."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values
