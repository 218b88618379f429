"""Spread one fused-MoE tune over several GPUs of a host: one process per GPU, one result.

`spread_tune(shape, batch_sizes, gpu_indices, ...)` shares the batch sizes out over the GPUs by
expected cost (`share_batch_sizes`), starts `python -m tuning.spread worker ...` once per GPU with
CUDA_VISIBLE_DEVICES naming that GPU alone (and NVLink multicast off), relays their progress,
and merges their tuning logs with `tuning.tune_results.merge_results` into one TuneResult and one
engine file. A process that fails is reported with the batch sizes it left untuned; what the
others (and it, before failing) tuned stays in the logs, so running the same tune again tunes
only the missing batch sizes.

Each process compiles with its own pool of compile processes (tuning.compile_pool), started
while the process sets up; the host's CPUs are shared out between the pools
(`host_compile_workers`). All of them need mostly the same kernels at the start (every size's
first round), and they share Triton's on-disk cache: process i of n compiles its own share of the
compile keys first (`--compile-shard i/n`, tuning.compile_pool.compile_order), and by the time it
reaches the others' share those mostly load from the cache. No process waits for a host-wide
precompile, which is slower (docs/decisions.md, "no host precompile").

Where the seconds went: the merged result's `timeline` is {GPU index: ProcessTimeline} of the
processes that reported one (set-up counted from this process launching it).

Cost rule: tuning batch size M costs about 2 + M / 1024 units (`expected_cost`): a fixed part
per size (timer and CUDA-graph set-up, compiles, timing the default) plus timing that grows
with the layer's time, which rises roughly linearly in M once every expert is touched (the fit:
docs/decisions.md, "shared out by expected cost"). The sizes go out longest first, each to the
GPU with the least expected work so far.

GPU indices are those nvidia-smi and NVML show (the processes get CUDA_DEVICE_ORDER=PCI_BUS_ID);
where this process has CUDA_VISIBLE_DEVICES set, index i is its i-th entry.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tuning.compile_pool import default_workers
from tuning.config_files import TUNED_BATCH_SIZES, parse_ints
from tuning.routing import Routing
from tuning.search import KernelShape
from tuning.tune_results import (
    ProcessTimeline,
    TuneResult,
    load_log,
    merge_results,
    print_summary,
    save_log,
    write_config_files,
)
from tuning.tuner import ProgressCallback, progress_bar

DEFAULT_TUNE_FUNCTION = "tuning.tuner:tune"
# Every process this module starts keeps NVLink multicast off (see the device README).
NVLS_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
STDERR_TAIL_LINES = 5
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ProcessFailure:
    """One GPU's process that did not tune all of its share: the sizes missing, how it ended."""

    gpu_index: int
    batch_sizes: list[int]
    returncode: int
    stderr_tail: str
    stderr_path: Path

    def __str__(self) -> str:
        sizes = ", ".join(map(str, self.batch_sizes))
        last = self.stderr_tail.splitlines()[-1] if self.stderr_tail else "no error output"
        return (
            f"GPU {self.gpu_index} (batch sizes {sizes}) exited with {self.returncode}: {last}"
            f" (see {self.stderr_path})"
        )


class SpreadTuneError(RuntimeError):
    """Some GPUs' processes failed. failures: one ProcessFailure each; result: what was tuned
    (kept in the logs, None when nothing was), which a rerun completes."""

    def __init__(self, failures: list[ProcessFailure], result: TuneResult | None, log_dir: Path):
        self.failures = failures
        self.result = result
        kept = len(result.batches) if result else 0
        super().__init__(
            "; ".join(map(str, failures))
            + f". {kept} batch sizes are kept in {log_dir}: run again to tune only the missing ones"
        )


def expected_cost(M: int) -> float:
    """Expected cost of tuning batch size M, in units of the cost rule (module doc): only the
    ratios between sizes matter."""
    return 2.0 + M / 1024


def host_compile_workers(processes: int) -> int:
    """Compile processes per GPU process when `processes` GPU processes tune on one host: the
    host's CPUs shared out, one per GPU process left free for timing, at most as many as one
    process alone gets (tuning.tuner's default).

    Compiling is CPU work: the compile processes fork from a server that imported torch and
    open no CUDA context (tuning.compile_only), so a host's CPUs can all compile without the
    processes slowing each other's start (docs/decisions.md, "compile processes").
    """
    processes = max(processes, 1)
    per_cpu = (os.cpu_count() or 2) // processes - 1
    return max(1, min(default_workers(), per_cpu))


def share_batch_sizes(batch_sizes: Iterable[int], gpu_count: int) -> list[list[int]]:
    """The batch sizes per GPU (each list ascending, some maybe empty), balanced by
    expected_cost: longest first, each to the GPU with the least expected work so far."""
    if gpu_count < 1:
        raise ValueError("no GPU to share the batch sizes over")
    shares: list[list[int]] = [[] for _ in range(gpu_count)]
    loads = [0.0] * gpu_count
    for m in sorted(set(batch_sizes), key=lambda m: (-expected_cost(m), m)):
        least = min(range(gpu_count), key=lambda i: (loads[i], i))
        shares[least].append(m)
        loads[least] += expected_cost(m)
    return [sorted(share) for share in shares]


def parse_gpus(text: str) -> tuple[int, ...]:
    """ "0,1,3" → (0, 1, 3); "all" → every GPU this process can see. ValueError otherwise."""
    if text.strip() == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError("--gpus all: no CUDA GPU is visible")
        return tuple(range(count))
    try:
        indices = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected 'all' or comma-separated GPU indices, got {text!r}") from None
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"expected distinct GPU indices ≥ 0, got {text!r}")
    return indices


def spread_tune(
    shape: KernelShape,
    batch_sizes: Iterable[int] = TUNED_BATCH_SIZES,
    gpu_indices: Sequence[int] = (0,),
    *,
    out_dir: str | Path | None = None,
    style: str = "vllm",
    log_dir: str | Path | None = None,
    exhaustive: bool = False,
    down: bool = True,
    compile_workers: int | None = None,
    fresh: bool = False,
    progress_callback: ProgressCallback | None = None,
    tune_function: str = DEFAULT_TUNE_FUNCTION,
    engine: dict | None = None,
    routing=None,
    also_under=None,
) -> TuneResult:
    """Tune shape at batch_sizes with one process per GPU of gpu_indices; the merged result.
    engine: whose kernel (tuning.tuner.DeviceMeasurements; None: moeops' builtin); routing:
    what the timings draw their router choices under (tuning.routing.Routing; None: uniform);
    also_under: another routing to time the written configs under (tuning.tuner.Tuner.tune).

    out_dir: where the engine file(s) go (None: not written); log_dir: the per-GPU and merged
    tuning logs (default out_dir/spread-logs); fresh: forget earlier logs of this tune.
    compile_workers: per process (default: host_compile_workers). tune_function
    "module:function" with tuning.tuner.tune's signature runs in each process. wall_s: this
    call's seconds plus those of the runs it resumed; timeline: {GPU index: ProcessTimeline}
    (module doc).
    Raises SpreadTuneError when some process failed (after keeping what the others tuned).
    """
    started = time.monotonic()
    if out_dir is None and log_dir is None:
        raise ValueError("spread_tune needs out_dir or log_dir for its logs")
    log_dir = Path(log_dir) if log_dir is not None else Path(out_dir) / "spread-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    gpu_indices = list(gpu_indices)
    batch_sizes = sorted(set(batch_sizes))
    search = "exhaustive" if exhaustive else "coarse-to-fine"
    tag = _log_tag(shape, search, (engine or {}).get("engine", "builtin"))
    skewed = routing is not None and routing.kind != "uniform"
    if skewed:
        # a tune under another routing keeps logs of its own: neither resumes the other
        tag += f"_{routing.slug}"
    merged_log = log_dir / f"{tag}.json"
    if fresh:
        for path in [merged_log, *_part_logs(log_dir, tag)]:
            path.unlink(missing_ok=True)

    previous = _previous_result(log_dir, tag, batch_sizes)
    remaining = [m for m in batch_sizes if previous is None or m not in previous.batches]
    shares = {
        index: share
        for index, share in zip(
            gpu_indices, share_batch_sizes(remaining, len(gpu_indices)), strict=True
        )
        if share
    }
    workers = compile_workers
    if workers is None:
        workers = host_compile_workers(len(shares))
    worker_args = ["--shape", json.dumps(shape.as_dict()), "--compile-workers", str(workers)]
    worker_args += ["--tune-function", tune_function, "--engine", json.dumps(engine)]
    worker_args += (["--exhaustive"] if exhaustive else []) + ([] if down else ["--no-down"])
    worker_args += ["--routing", json.dumps(routing.as_dict())] if skewed else []
    worker_args += ["--also-under", json.dumps(also_under.as_dict())] if also_under else []
    returncodes, total, timeline = _run_processes(
        shares, worker_args, log_dir, tag, progress_callback
    )

    parts = [load_log(log_dir / f"{tag}.gpu{i}.json") for i in shares]
    results = [r for r in [previous, *parts] if r is not None]
    merged = merge_results(results) if results else None
    if merged is not None:
        merged.wall_s = (previous.wall_s if previous else 0.0) + time.monotonic() - started
        merged.timeline = timeline
        save_log(merged_log, merged)
        for path in _part_logs(log_dir, tag):
            path.unlink()
    tuned = set(merged.batches) if merged else set()
    failures = [
        _failure(index, [m for m in share if m not in tuned], returncodes[index], log_dir, tag)
        for index, share in shares.items()
        if not set(share) <= tuned
    ]
    if failures:
        raise SpreadTuneError(failures, merged, log_dir)
    if out_dir is not None:
        write_config_files(merged, out_dir, style)
    if progress_callback is not None:
        progress_callback(total, total, "done")
    return merged


def _run_processes(
    shares, worker_args, log_dir, tag, progress_callback
) -> tuple[dict[int, int], int, dict[int, ProcessTimeline]]:
    """Start one worker process per GPU with a share (worker_args: what they share) and relay
    their progress. Returns {GPU index: exit status}, the progress steps they reported in all,
    and {GPU index: ProcessTimeline} of those that reported one."""
    # every GPU index checked before any process starts
    envs = {index: _process_env(index) for index in shares}
    processes: dict[int, subprocess.Popen] = {}
    stderr_files = []
    try:
        for position, (index, share) in enumerate(shares.items()):
            command = [sys.executable, "-m", "tuning.spread", "worker", *worker_args]
            command += ["--batch-sizes", ",".join(map(str, share))]
            # each process compiles its own share of the keys first (compile_pool.compile_order)
            command += ["--compile-shard", f"{position}/{len(shares)}"]
            command += ["--log", str(log_dir / f"{tag}.gpu{index}.json")]
            stderr = open(log_dir / f"{tag}.gpu{index}.stderr.txt", "w")  # noqa: SIM115
            stderr_files.append(stderr)
            processes[index] = subprocess.Popen(
                [*command, "--launched-at", repr(time.time())],
                env=envs[index],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                # its own process group, so that stopping it also stops its compile workers
                start_new_session=True,
            )
        total, timelines = _relay_progress(processes, progress_callback)
        returncodes = {index: process.wait() for index, process in processes.items()}
        return returncodes, total, timelines
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for stderr in stderr_files:
            stderr.close()


def _process_env(index: int) -> dict[str, str]:
    """This environment with GPU index alone visible, NVLink multicast off, the package found."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = str(index)
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if index >= len(ids):
            raise ValueError(f"GPU {index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
        device = ids[index]
    path = os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **NVLS_OFF, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    env["CUDA_VISIBLE_DEVICES"] = device
    # indices as nvidia-smi, NVML and the topology probe number the GPUs
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env


def _relay_progress(
    processes: dict, progress_callback: ProgressCallback | None
) -> tuple[int, dict[int, ProcessTimeline]]:
    """Read each process's progress lines until all close; report the sums to the callback.
    Returns the steps of all processes and the timelines they reported."""
    lines: queue.Queue = queue.Queue()

    def pump(index, stream):
        for line in stream:
            lines.put((index, line))
        lines.put((index, None))

    for index, process in processes.items():
        threading.Thread(target=pump, args=(index, process.stdout), daemon=True).start()
    progress: dict[int, tuple[int, int]] = {}
    timelines: dict[int, ProcessTimeline] = {}
    open_streams = len(processes)
    while open_streams:
        index, line = lines.get()
        if line is None:
            open_streams -= 1
            continue
        event = _event(line)
        if event is None:
            sys.stderr.write(f"[GPU {index}] {line}")
            continue
        if "timeline" in event:
            timelines[index] = ProcessTimeline(**event["timeline"])
            continue
        progress[index] = (event["done"], event["total"])
        if progress_callback is not None:
            done = sum(d for d, _ in progress.values())
            total = sum(t for _, t in progress.values())
            # "done" is said once, after the merge, not when the first process ends
            done = max(0, min(done, total - 1))
            progress_callback(done, total, f"GPU {index}: {event['message']}")
    return sum(t for _, t in progress.values()), timelines


def _event(line: str) -> dict | None:
    """A worker's JSON line: progress {done, total, message} or {timeline}; else None."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    if {"done", "total", "message"} <= event.keys() or "timeline" in event:
        return event
    return None


def _log_tag(shape: KernelShape, search: str, engine: str = "builtin") -> str:
    """The logs' name stem: shape, search and whose kernel (the GPU model and the kernel's
    version are checked when they merge)."""
    block = f"_block{shape.block_shape[0]}x{shape.block_shape[1]}" if shape.block_shape else ""
    kernel = "" if engine == "builtin" else f"_{engine}"
    return f"E{shape.E}_N{shape.N}_H{shape.H}_k{shape.top_k}_{shape.dtype}{block}_{search}{kernel}"


def _part_logs(log_dir: Path, tag: str) -> list[Path]:
    return sorted(p for p in log_dir.glob(f"{tag}.gpu*.json") if p.is_file())


def _previous_result(log_dir: Path, tag: str, batch_sizes: list[int]) -> TuneResult | None:
    """What earlier runs of this tune logged (merged log and leftover per-GPU logs), limited
    to batch_sizes; the leftovers are folded into the merged log."""
    merged_log = log_dir / f"{tag}.json"
    parts = _part_logs(log_dir, tag)
    results = [r for r in map(load_log, [merged_log, *parts]) if r is not None]
    if not results:
        return None
    previous = merge_results(results)
    previous.batches = {m: b for m, b in previous.batches.items() if m in batch_sizes}
    save_log(merged_log, previous)
    for path in parts:
        path.unlink()
    return previous


def _failure(index, missing, returncode, log_dir, tag) -> ProcessFailure:
    stderr_path = log_dir / f"{tag}.gpu{index}.stderr.txt"
    text = stderr_path.read_text(errors="replace") if stderr_path.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    tail = "\n".join(lines[-STDERR_TAIL_LINES:])
    return ProcessFailure(index, missing, returncode, tail, stderr_path)


def _resolve(spec: str):
    module_name, _, function_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def run_cli(
    args: argparse.Namespace,
    shape: KernelShape,
    batch_sizes: Sequence[int],
    gpu_indices: Sequence[int],
) -> int:
    """`python -m tuning tune ... --gpus 0,1,...`: spread the tune of shape at batch_sizes (as
    the tuner's CLI parsed them), write the file, summarise.

    The per-GPU and merged logs go to --log (a folder here) or OUT/spread-logs.
    """
    try:
        result = spread_tune(
            shape,
            batch_sizes,
            gpu_indices,
            log_dir=Path(args.log) if args.log else Path(args.out) / "spread-logs",
            exhaustive=args.exhaustive,
            down=not args.no_down,
            compile_workers=args.compile_workers,
            fresh=args.fresh,
            progress_callback=progress_bar(),
            engine=args.engine_spec,
            routing=getattr(args, "routing_spec", None),
            also_under=getattr(args, "also_under_spec", None),
        )
    except SpreadTuneError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    for path in write_config_files(result, args.out, args.style):
        print(path)
    print_summary(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m tuning.spread worker ...`: tune a share on the one visible GPU (device 0),
    print progress as JSON lines {done, total, message} and at the end {timeline}, keep the
    result in --log."""
    parser = argparse.ArgumentParser(prog="python -m tuning.spread")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="one GPU's process of a spread tune")
    worker.add_argument("--shape", required=True, help="KernelShape as JSON")
    worker.add_argument("--batch-sizes", required=True)
    worker.add_argument("--log", required=True, help="tuning log to resume from and write")
    worker.add_argument("--compile-workers", type=int)
    worker.add_argument("--exhaustive", action="store_true")
    worker.add_argument("--no-down", action="store_true")
    worker.add_argument("--tune-function", default=DEFAULT_TUNE_FUNCTION)
    worker.add_argument("--engine", default="null", help="whose kernel, as JSON (null: builtin)")
    worker.add_argument("--routing", help="the routing to time under, as JSON (default: uniform)")
    worker.add_argument("--also-under", help="another routing to time the written configs under")
    worker.add_argument("--launched-at", type=float, help="time.time() at its launch")
    worker.add_argument(
        "--compile-shard", default="0/1", help="I/N: this is process I of N (compile order)"
    )
    args = parser.parse_args(argv)
    launched_at = args.launched_at or time.time()

    def report(done: int, total: int, message: str) -> None:
        print(json.dumps({"done": done, "total": total, "message": message}), flush=True)

    called_at = time.time()
    result = _resolve(args.tune_function)(
        KernelShape.from_dict(json.loads(args.shape)),
        parse_ints(args.batch_sizes),
        device_index=0,
        exhaustive=args.exhaustive,
        down=not args.no_down,
        progress_callback=report,
        resume_path=args.log,
        compile_workers=args.compile_workers,
        compile_shard=tuple(int(v) for v in args.compile_shard.split("/")),
        engine=json.loads(args.engine),
        # only when asked for: a tune function of tuning.tuner.tune's older signature still runs
        **({"routing": Routing.from_dict(json.loads(args.routing))} if args.routing else {}),
        **(
            {"also_under": Routing.from_dict(json.loads(args.also_under))}
            if args.also_under
            else {}
        ),
    )
    save_log(args.log, result)
    if result.timeline is not None:
        # Python's start and the imports before the tune count as set-up
        result.timeline.setup_s += called_at - launched_at
        print(json.dumps({"timeline": asdict(result.timeline)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
