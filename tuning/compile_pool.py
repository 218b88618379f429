"""Compile processes: they compile a tune's candidate kernels into Triton's on-disk cache ahead
of timing, in parallel, for the tuning process's GPU without touching it (tuning.compile_only).

They start at once, forked from a server process that imports torch meanwhile, so that their
start-up overlaps the tuning process's imports and weights instead of the first compile.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import replace

from tuning.compile_only import GpuTarget
from tuning.search import KernelShape, compile_key

COMPILE_TIMEOUT_S = 300
# What the compile pool's server process imports once, before forking the workers from it (the
# heavy imports; the server skips silently what it cannot import).
COMPILE_WORKER_PRELOAD = ["torch", "triton"]
# how a compile process whose set-up failed answers every compile
SET_UP_FAILED = "compile processes could not set up: "


class CompilePool:
    """Worker processes that compile candidates into Triton's on-disk cache, in parallel.

    They start at once, not at the first compile, and set up while the caller goes on; they
    compile for the GPU compile() names without a CUDA context (tuning.compile_only).
    set_up(shape_data): a worker's set-up (default: CPU tensors of shape's layer, values unset;
    the tests give others). backend: the kernel backend's spec ({"engine", "source_dir",
    "python"}, tuning.backends.load_backend's arguments), None for moeops' builtin kernel. An
    engine's kernel specialises on the batch size (its sizes are not exempt from Triton's
    specialisation), so its configs are compiled at each batch size they will be timed at.
    """

    def __init__(
        self,
        shape: KernelShape,
        workers: int,
        set_up: Callable[[dict], None] | None = None,
        *,
        shard: tuple[int, int] = (0, 1),
        backend: dict | None = None,
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
        shape_data = {**shape.as_dict(), "backend": backend}
        initargs = (set_up or set_up_compile_worker, shape_data, cache, started)
        self.per_batch_size = backend is not None
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
            self._give_up(f"compile processes could not start ({one_line(exc)})")
            self._started = []

    def _give_up(self, reason: str) -> None:
        """No more compiles in the workers (reason: why, said once); the timing process
        compiles."""
        if self.broken is None:
            self.broken = reason
            print(f"{reason}; compiling in the tuning process, which is slower", file=sys.stderr)

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
            except FutureTimeout:
                # slow: the compiles queue behind their start
                ready_at = time.time()
            except BrokenProcessPool:
                self._give_up("compile processes died setting up")
                ready_at = time.time()
            self._start_s = ready_at - self._created_at
        return self._start_s

    def compile(
        self, configs: list[dict], target: GpuTarget, batch_sizes=(None,)
    ) -> list[str | None]:
        """Per config None, or why it failed to compile for target (at any of batch_sizes)."""
        return self.collect(self.submit(configs, target, batch_sizes))

    def submit(self, configs: list[dict], target: GpuTarget, batch_sizes=(None,)) -> list:
        """Start compiling configs for target (an engine's kernel: at each of batch_sizes); per
        config a handle for collect(). The timing process goes on timing what is compiled."""
        from concurrent.futures.process import BrokenProcessPool

        sizes = tuple(m for m in batch_sizes if m is not None) if self.per_batch_size else (None,)
        self._wait_for_starter()
        # with no batch size to compile an engine's kernel at, or no workers, the timing
        # process compiles each config at its first launch
        if not sizes or self.broken or not self._started:
            return [None] * len(configs)
        try:
            futures = {
                i: self._executor.submit(compile_in_worker, configs[i], target, sizes)
                for i in compile_order(configs, self._shard)
            }
        except BrokenProcessPool:
            self._give_up("compile processes died")
            return [None] * len(configs)
        return [futures[i] for i in range(len(configs))]

    def collect(self, handles: list) -> list[str | None]:
        """Wait for the compiles submit() started: per handle None, or why it failed."""
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        errors: list[str | None] = []
        for future in handles:
            if future is None:
                errors.append(None)
                continue
            try:
                errors.append(future.result(timeout=COMPILE_TIMEOUT_S))
            except FutureTimeout:
                errors.append(f"compile took over {COMPILE_TIMEOUT_S} s")
            except BrokenProcessPool:
                self._give_up("compile processes died")
                errors.append(None)
            except Exception as exc:
                errors.append(one_line(exc))
        set_up = next((e for e in errors if e and e.startswith(SET_UP_FAILED)), None)
        if set_up is not None:
            self._give_up(set_up)
        if self.broken is not None:
            return [None] * len(handles)
        failed = {e for e in errors if e is not None}
        if len(handles) > 1 and len(failed) == 1 and None not in errors:
            # every config failing alike is the workers' failure, not the configs'
            self._give_up(f"compile processes failed ({failed.pop()})")
            return [None] * len(handles)
        return errors

    def compile_reports(
        self, jobs: list[tuple[dict, int | None]], target: GpuTarget
    ) -> list[tuple[str | None, dict[str, int]]]:
        """Compile each (config, batch size) of jobs for target (the batch size is ignored for
        moeops' builtin kernel) and wait: per job None or why it failed, and {kernel name:
        shared memory bytes} of the kernels its layer launched. For a check
        (tuning.compile_check): a pool that cannot compile raises instead of leaving the
        compiles to a timing process, and configs failing alike are failures all the same."""
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        self._wait_for_starter()
        if self.broken or not self._started:
            raise RuntimeError(self.broken or "compile processes did not start")
        configs = [config for config, _ in jobs]
        futures = {
            i: self._executor.submit(
                compile_report_in_worker,
                jobs[i][0],
                target,
                (jobs[i][1],) if self.per_batch_size else (None,),
            )
            for i in compile_order(configs, self._shard)
        }
        answers: dict[int, tuple[str | None, dict[str, int]]] = {}
        # in the order they were queued: each waits for its own compile, not for those before
        for i, future in futures.items():
            try:
                answers[i] = future.result(timeout=COMPILE_TIMEOUT_S)
            except FutureTimeout:
                answers[i] = (f"compile took over {COMPILE_TIMEOUT_S} s", {})
            except BrokenProcessPool:
                raise RuntimeError("compile processes died") from None
        reports = [answers[i] for i in range(len(jobs))]
        set_up = next((e for e, _ in reports if e and e.startswith(SET_UP_FAILED)), None)
        if set_up is not None:
            raise RuntimeError(set_up)
        return reports

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
    # no GPU: a compile process opens no CUDA context, whatever its set-up asks of torch (an
    # engine backend asks for the GPU's capability; each launch names the target's instead)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        set_up(shape_data)
    except Exception as exc:
        # every compile answers with it, and the pool says so: a worker dying here would leave
        # the pool broken with no word of why
        _WORKER["set_up_error"] = SET_UP_FAILED + one_line(exc)
    _WORKER["started"] = started


def _compile_worker_started() -> float:
    """A compile worker's start-up task: time.time() once every worker has set up."""
    _WORKER["started"].wait()
    return time.time()


def set_up_compile_worker(shape_data: dict) -> None:
    """A compile process's state for shape_data (KernelShape.as_dict(), with "backend": the
    engine spec or None): the backend, and operands that give the launches their shapes."""
    import torch

    from tuning import timing

    shape = KernelShape.from_dict(shape_data)
    # a compile process's torch work is small: threads would only contend with the others'
    torch.set_num_threads(1)
    spec = shape_data.get("backend")
    if spec is not None:
        from tuning.backends import load_backend

        # the engine's launch reads E (its buffers' sizes): the real shape, values unset
        _WORKER.update(
            shape=shape,
            weights=timing.unset_weights(shape),
            backend=load_backend(
                spec["engine"], source_dir=spec.get("source_dir"), python=spec.get("python")
            ),
        )
        return
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


def compile_in_worker(
    config: dict, target: GpuTarget, sizes: tuple[int | None, ...] = (None,)
) -> str | None:
    """Compile the layer's kernels with config for target (an engine's: at each batch size of
    sizes); None, or why they failed."""
    from triton.runtime import driver

    from tuning.compile_only import compile_only_driver
    from tuning.fused_moe import fused_moe

    w = _WORKER
    if "set_up_error" in w:
        return w["set_up_error"]
    try:
        if "target" not in w:
            driver.set_active(compile_only_driver(target))
            w["target"] = target
        elif w["target"] != target:
            # Triton keeps the kernels it compiled in memory by device, not by target: another
            # target's kernel would be answered from there, checked against this one's limits
            return f"a compile process compiles for one GPU target, here {w['target']}"
        if "backend" in w:
            for M in sizes:
                _launch_engine_layer(w, config, target, M)
            return None
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
        return one_line(exc)
    return None


def compile_report_in_worker(
    config: dict, target: GpuTarget, sizes: tuple[int | None, ...] = (None,)
) -> tuple[str | None, dict[str, int]]:
    """compile_in_worker's answer, and {kernel name: shared memory bytes} of the kernels the
    layer launched (one that failed to load is in the answer, not here)."""
    from triton.runtime import driver

    if "target" in _WORKER:
        driver.active.launched.clear()
    error = compile_in_worker(config, target, sizes)
    launched = dict(driver.active.launched) if "target" in _WORKER else {}
    return error, launched


def _launch_engine_layer(w: dict, config: dict, target: GpuTarget, M: int) -> None:
    import torch

    from tuning import timing

    shape, backend = w["shape"], w["backend"]
    backend.capability = target.capability
    x = torch.empty((M, shape.H), dtype=timing.activation_dtype(shape))
    # the launches read the ids' shape, not their values
    topk_ids = torch.zeros((M, shape.top_k), dtype=torch.int32)
    topk_weights = torch.empty((M, shape.top_k), dtype=torch.float32)
    backend.layer(
        x,
        w["weights"],
        topk_weights,
        topk_ids,
        shape=shape,
        config=config,
        out=torch.empty_like(x),
        launch_only=True,
    )


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def default_workers() -> int:
    # a tune's round compiles some 30 to 60 kernels at once; more processes would mostly wait
    return max(1, min(32, (os.cpu_count() or 2) - 1))
