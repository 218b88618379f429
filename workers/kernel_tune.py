"""A fused-MoE kernel tune as a GPU-host worker runs it, over the REST API; no Celery needed.

`tune_kernel(tuning_run_uuid, client=..., E=, N=, hidden_size=, topk=, engine=, ...)` claims
the tuning run, resolves whose kernel to time (the deployment's engine's own where its package
is installed on this host, else moeops' builtin one, and says which and why), tunes with
tuning.spread, one process per GPU of the tune, also for one (resuming from local logs when the
task is delivered again), while one NVML sampler records every GPU of the tune and pushes the
samples in batches, reports progress, and pushes the written config (the API serves it under
the engines' exact file names) with the kernel it was tuned on, the per-batch-size timings
(written, default, shipped and floor µs, and which config was written) and the final status.
Where GEMM 2 got configs of its own, SGLang's `_down` file is pushed too, as a kernel config of
its own; where vLLM runs GEMM 2 on its sorted-A path (read from the deployment's launch recipe:
tuning.engines.vllm_launch), the `_down` file goes with the up file as one kernel config. The
tuning run records which kernel path it tuned (default, TMA, sorted-A).
"""

import contextlib
import functools
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from domain.progress import JobBeat
from tuning.cache_dir import cache_dir
from tuning.config_files import triton_config_unread
from workers import job
from workers.client import ApiError, BadPush, Conflict, Unreachable
from workers.telemetry import TelemetryPusher

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 2.0
SAMPLES_INTERVAL_S = 5.0


class TuneCancelled(Exception):
    """Someone cancelled the tune from the page: its processes stop (the tuning log stays)."""


class TuneTakenOver(Exception):
    """Another delivery took the tune over (this one was thought gone): its processes stop,
    and the tune's end is that delivery's."""


# The outcome when another delivery took the tune over while this one ran.
TAKEN_OVER = "taken over"


def _log_dir():
    # tuning logs survive a worker restart, so that a re-delivered tune resumes
    return Path(os.getenv("MOEOPS_TUNE_DIR") or cache_dir() / "tuning")


def _default_spread(
    shape,
    batch_sizes,
    gpu_indices,
    *,
    progress_callback,
    log_dir,
    engine,
    routing=None,
    also_under=None,
):
    from tuning.spread import spread_tune

    return spread_tune(
        shape,
        batch_sizes,
        gpu_indices,
        log_dir=log_dir,
        progress_callback=progress_callback,
        engine=engine,
        routing=routing,
        also_under=also_under,
    )


def kernel_for(engine, *, launch_env=None, launch_argv=None):
    """(spec, record): whose kernel this host times for a tune that asks for engine's.

    engine: the deployment's engine as recorded ("vllm", "sglang", "other") or "builtin". The
    engine's own kernel where its package is found here (tuning.engine_source.locate_package;
    spec: tuning.spread.spread_tune's engine), else moeops' builtin one (spec None). record: the
    tuning run's kernel_engine, kernel_version and kernel_note (which kernel, and why).
    launch_env, launch_argv: the deployment's launch recipe's environment and argv (None: it has
    none), from which vLLM's spec gets its launch (vllm_launch): whether DeepGEMM with E8M0
    scales is on (and DeepGEMM installed beside the engine here) and expert parallelism.
    """
    from tuning.engine_source import ENGINE_PYTHON_ENV, EngineSourceError, locate_package
    from tuning.engines import ENGINE_TITLES, VLLM_TMA_SINCE, release

    if engine == "builtin":
        return None, _builtin_record("moeops' builtin kernel, as asked")
    if engine not in ENGINE_PYTHON_ENV:
        known = " nor ".join(ENGINE_TITLES.values())
        return None, _builtin_record(
            f"builtin: the deployment's engine ({engine}) is neither {known}"
        )
    try:
        package = locate_package(engine)
    except EngineSourceError as exc:
        log.warning("timing moeops' builtin kernel: %s", exc)
        env = ENGINE_PYTHON_ENV[engine]
        python = os.getenv(env)
        where = f"for {python} ({env})" if python else f"on this host (set {env})"
        return None, _builtin_record(f"builtin: {engine} is not installed {where}")
    record = {
        "kernel_engine": engine,
        "kernel_version": package.version,
        "kernel_note": f"{package.title}'s own kernel",
    }
    spec = {"engine": engine, "source_dir": str(package.package_dir)}
    if engine == "vllm" and release(package.version) >= VLLM_TMA_SINCE:
        spec["launch"], why = vllm_launch_here(package.package_dir, launch_env, launch_argv)
        record["kernel_note"] = f"{package.title}'s own kernel; {why}"[:300]
    return spec, record


def vllm_launch_here(package_dir, launch_env, launch_argv):
    """(launch, why): tuning.backends.load_backend's launch for vLLM installed at package_dir,
    launched with the recipe's env and argv, and the sentence saying what decided it."""
    from tuning.engines import vllm_launch

    launch = vllm_launch(launch_env, launch_argv)
    recipe = "" if launch_env is not None or launch_argv is not None else " (no launch recipe)"
    why = launch.why + recipe
    deep_gemm_e8m0 = launch.deep_gemm_e8m0
    if deep_gemm_e8m0 and not deep_gemm_installed(package_dir):
        deep_gemm_e8m0 = False
        why += ", but DeepGEMM is not installed beside vLLM on this host"
    elif deep_gemm_e8m0:
        # the engine starts with this host's environment and the recipe's on top of it
        no_jit = deep_gemm_without_nvcc({**os.environ, **(launch_env or {})})
        if no_jit:
            deep_gemm_e8m0 = False
            why += f", but vLLM turns DeepGEMM off on this host: {no_jit}"
    return {"deep_gemm_e8m0": deep_gemm_e8m0, "expert_parallel": launch.expert_parallel}, why


def deep_gemm_installed(package_dir) -> bool:
    """Whether vLLM at package_dir finds DeepGEMM: its own copy (vllm/third_party/deep_gemm,
    in vLLM 0.34's wheel) or a deep_gemm package beside it (vLLM's has_deep_gemm)."""
    package_dir = Path(package_dir)
    return (package_dir / "third_party" / "deep_gemm").is_dir() or (
        package_dir.parent / "deep_gemm"
    ).is_dir()


# vLLM 0.34's is_deep_gemm_supported (vllm/utils/deep_gemm.py, `_deep_gemm_nvcc_path` and
# `_nvcc_version`) turns DeepGEMM off, and with it E8M0 scales and the sorted-A path, where
# DeepGEMM's JIT would find no nvcc or one older than 12.9. deep_gemm_without_nvcc looks as it does.
DEEP_GEMM_NVCC_SINCE = (12, 9)
DEFAULT_CUDA_HOME = "/usr/local/cuda"


def deep_gemm_without_nvcc(env) -> str | None:
    """Why vLLM 0.34 started with env would turn DeepGEMM off for want of nvcc, in a phrase;
    None where it finds one that is new enough (or whose release it cannot read, as vLLM)."""
    path = env.get("PATH")
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not cuda_home:
        found = shutil.which("nvcc", path=path)
        cuda_home = os.path.dirname(os.path.dirname(found)) if found else DEFAULT_CUDA_HOME
    if not os.path.exists(cuda_home):
        return (
            f"no CUDA toolkit for DeepGEMM's JIT (CUDA_HOME, CUDA_PATH, an nvcc on PATH, "
            f"{DEFAULT_CUDA_HOME}: none)"
        )
    named = (
        env.get("DG_JIT_NVCC_COMPILER")
        or env.get("DJ_JIT_NVCC_COMPILER")
        or os.path.join(cuda_home, "bin", "nvcc")
    )
    nvcc = shutil.which(named, path=path)
    if nvcc is None:
        return f"DeepGEMM's JIT finds no nvcc at {named}"
    release = nvcc_release(nvcc)
    if release is not None and release < DEEP_GEMM_NVCC_SINCE:
        need = ".".join(map(str, DEEP_GEMM_NVCC_SINCE))
        return f"DeepGEMM's JIT needs nvcc {need} or newer, {nvcc} is {release[0]}.{release[1]}"
    return None


def nvcc_release(nvcc) -> tuple[int, int] | None:
    """(major, minor) of `nvcc --version`'s "release X.Y", None where unreadable."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else None


def _builtin_record(note):
    from tuning.backends.builtin import BuiltinBackend

    kernel = BuiltinBackend().describe()
    return {
        "kernel_engine": kernel["engine"],
        "kernel_version": kernel["version"],
        "kernel_source_sha256": kernel["source_sha256"],
        # the API keeps a sentence of at most 300 characters; a long Python path may pass that
        "kernel_note": note[:300],
    }


def timing_rows(result):
    """The API's timing rows (µs) from a tuning.tune_results.TuneResult.

    tuned_us is the written config's time when both GEMMs use it (as vLLM runs it); SGLang
    with the `_down` file beside it may run faster at the sizes that have a GEMM-2 config.
    picked: where the written config comes from ("tuned", "default", "shipped"); default_us
    and shipped_us: the engine's own configs, timed head to head with it.
    """
    return [
        {
            "batch_size": m,
            "tuned_us": b.tuned_us if b.shared_config_us is None else b.shared_config_us,
            "default_us": b.default_us,
            "shipped_us": b.shipped_us,
            "picked": b.picked,
            "floor_us": b.floor_us,
            "config": b.config,
            "candidates_tried": b.candidates_tried,
            # a skewed tune's file and the engine's own, timed under uniform routing too
            **({"also_under": b.also_under} if b.also_under else {}),
        }
        for m, b in sorted(result.batches.items())
    ]


def tune_kernel(
    tuning_run_uuid,
    *,
    client,
    E,
    N,
    hidden_size,
    topk,
    dtype="bf16",
    block_shape=None,
    batch_sizes=None,
    gpu_indices=None,
    device_name="",
    engine="builtin",
    quantization="",
    force=False,
    launch_env=None,
    launch_argv=None,
    spread=_default_spread,
    nvml=None,
    telemetry_hz=1.0,
    routing="uniform",
    also_under="",
):
    """Tune one shape (E experts per rank, N per-shard intermediate, hidden_size, topk) on
    gpu_indices (CUDA indices; default [0]), one process per GPU; returns the tuning run's final
    status.

    engine: whose kernel is asked for (kernel_for, with launch_env and launch_argv: the
    deployment's launch recipe's, None where it has none); quantization: the deployment's weights',
    whose FP4 experts run on kernels that read no Triton config, so their tune fails saying so
    unless force. routing: what the timings draw their router choices under, as the tune was
    asked for ("uniform", "zipf:1.2", "dirichlet:0.3": tuning.routing); also_under: another
    routing to time the written file and the engine's own configs under ("": none asked).

    spread: tuning.spread.spread_tune's signature (tests pass fakes). Also one GPU tunes in a
    process of its own: a Celery worker's process is daemonic and may not start the tune's
    compile processes, and the tune's CUDA context and memory leave with its process.
    device_name is what the web tier expected; the tuner reads the real one from the GPU and
    that one names the file. One NVML sampler (telemetry_hz samples/s per GPU; nvml: a
    pynvml stand-in for tests) watches gpu_indices as NVML numbers them, which is the numbering
    tuning.spread pins its processes by (PCI bus order).
    """
    from tuning.config_files import TUNED_BATCH_SIZES
    from tuning.routing import parse_routing
    from tuning.search import KernelShape
    from tuning.tune_results import routing_label

    tune = job.Job(client, job.TUNE, tuning_run_uuid)
    claimed = tune.claim()
    if isinstance(claimed, str):
        return claimed
    # what the tune page shows of the tune's progress; the heartbeats carry it
    state = {}
    refusal = triton_config_unread(quantization)
    if refusal and not force:
        return _finish(
            tune,
            state,
            status="failed",
            error=f"{refusal} Tune anyway to tune it all the same.",
            telemetry_status="not_collected",
            telemetry_detail="the tune was refused before it started",
        )
    spec, kernel = kernel_for(engine, launch_env=launch_env, launch_argv=launch_argv)
    shape = KernelShape(
        E=E,
        N=N,
        H=hidden_size,
        top_k=topk,
        dtype=dtype,
        block_shape=tuple(block_shape) if block_shape else None,
    )
    last_report = 0.0

    def progress(done, total, message):
        nonlocal last_report
        state.update(done=done, total=total, message=message)
        _stop_if(heartbeat.taken_over, heartbeat.cancelled)
        if done < total and time.monotonic() - last_report < PROGRESS_INTERVAL_S:
            return
        last_report = time.monotonic()
        _beat(tune, state)

    log_dir = _log_dir()
    log_dir.mkdir(parents=True, exist_ok=True)
    gpu_indices = list(gpu_indices or [0])
    telemetry = TelemetryPusher(
        gpu_indices,
        functools.partial(client.post_tuning_telemetry, tuning_run_uuid),
        hz=telemetry_hz,
        interval_s=SAMPLES_INTERVAL_S,
        nvml=nvml,
    )
    # beats while the tuner says nothing (compiling, a long batch size), so that a delivery of
    # the task again finds this one alive and stands down
    heartbeat = job.Heartbeat(tune, lambda: dict(state), PROGRESS_INTERVAL_S, log=log)
    try:
        with telemetry, _beating(heartbeat):
            # said now, as a sweep says it: the tune page tells why its charts stay empty while
            # the tune runs, not only once it has ended
            _beat(tune, state, **kernel, **_telemetry_fields(telemetry))
            result = spread(
                shape,
                batch_sizes or TUNED_BATCH_SIZES,
                gpu_indices,
                progress_callback=progress,
                log_dir=log_dir / tuning_run_uuid,
                engine=spec,
                # only when asked for: spreads of the signature before routings still run
                **({"routing": parse_routing(routing)} if routing != "uniform" else {}),
                **({"also_under": parse_routing(also_under)} if also_under else {}),
            )
        if device_name and device_name != result.device_name:
            log.warning("tuned on %s, the web tier expected %s", result.device_name, device_name)
        # the timed kernel's own record: the engine's source hash is known once it is loaded
        kernel.update(_kernel_fields(result.kernel))
        if result.limits:
            kernel["kernel_note"] = f"{kernel['kernel_note']}; {result.limits_phrase()}"[:300]
        if routing != "uniform":
            said = f"timed under {routing_label(result.routing)} routing"
            kernel["kernel_note"] = f"{kernel['kernel_note']}; {said}"[:300]
        if result.kernel_path == "sorted_a":
            # vLLM's up file and its _down file: one kernel config
            config = _store_config(
                client, tuning_run_uuid, shape, result, result.entries(),
                down_entries=result.down_entries(),
            )  # fmt: skip
        else:
            config = _store_config(client, tuning_run_uuid, shape, result, result.entries())
            down_entries = result.down_entries()
            if down_entries:
                _store_config(client, tuning_run_uuid, shape, result, down_entries, down_moe=True)
        client.post_tuning_timings(tuning_run_uuid, timing_rows(result))
    except Unreachable:
        # the task tries again later; the tuning log makes the next attempt resume
        raise
    except TuneCancelled:
        log.info(
            "tuning run %s: cancelled from the page; its processes are stopped", tuning_run_uuid
        )
        return "cancelled"
    except TuneTakenOver:
        log.warning("tuning run %s: another delivery took it over; stopped", tuning_run_uuid)
        return TAKEN_OVER
    except Exception as exc:
        _finish(
            tune,
            state,
            status="failed",
            # the page turns this into a sentence with the whole text as its detail
            error=f"{type(exc).__name__}: {exc}",
            **kernel,
            **_telemetry_fields(telemetry),
        )
        raise
    state.update(done=1, total=1, message="done")
    return _finish(
        tune,
        state,
        status="succeeded",
        result=config["id"],
        wall_s=result.wall_s,
        **kernel,
        **_telemetry_fields(telemetry),
    )


@contextlib.contextmanager
def _beating(heartbeat):
    heartbeat.start()
    try:
        yield heartbeat
    finally:
        heartbeat.stop()


def _beat(tune, state, **fields):
    """Send what the tune page shows while the tune runs (progress, the kernel, telemetry
    status) with a heartbeat: one attempt, never spooled, a failure logged (the final push
    carries what matters). Stops the tune (raises inside tuning.spread's progress relay, which
    then kills the GPU processes) when it was cancelled or taken over."""
    try:
        answer = tune.client.update_tuning_run(
            tune.ref, advisory=True, progress=tune.stamp(state), **fields
        )
    except Conflict:
        raise TuneTakenOver from None
    except (ApiError, BadPush) as exc:
        log.warning("tuning run %s: push failed: %s", tune.ref, exc)
        return
    _stop_if(False, tune.cancelled(answer))


def _stop_if(taken_over, cancelled):
    if taken_over:
        raise TuneTakenOver
    if cancelled:
        raise TuneCancelled


def _finish(tune, state, *, status, **fields):
    """End the tune with status (pushed: spooled while the web tier is away), its progress
    stamped with this delivery's attempt, so that a delivery that was taken over ends
    nothing; returns status, or TAKEN_OVER when the API refused it for that."""
    try:
        tune.client.update_tuning_run(tune.ref, status=status, progress=tune.stamp(state), **fields)
    except Conflict as exc:
        if (
            JobBeat.read(tune.client.get_tuning_run(tune.ref).get("progress")).attempt
            > tune.attempt
        ):
            log.warning("tuning run %s: taken over, not ended %s: %s", tune.ref, status, exc)
            return TAKEN_OVER
        raise
    return status


def _telemetry_fields(telemetry):
    # the tune page says why its GPU charts are empty (no pynvml, no GPU, ...), as a sweep's does
    sampler = telemetry.sampler
    return {"telemetry_status": sampler.status, "telemetry_detail": sampler.detail}


def _kernel_fields(kernel):
    """The API's kernel_* fields from a TuneResult's kernel (KernelBackend.describe() and the
    kernel path the tune timed)."""
    return {
        "kernel_engine": kernel.get("engine") or "builtin",
        "kernel_version": kernel.get("version") or "",
        "kernel_source_sha256": kernel.get("source_sha256") or "",
        "kernel_path": kernel.get("path") or "default",
    }


def _provenance(tuning_run_uuid, result) -> str:
    from tuning.tune_results import routing_label

    limits = f", {result.limits_phrase()}" if result.limits else ""
    kind = result.routing.get("kind", "uniform")
    routed = f", timed under {routing_label(result.routing)} routing" if kind != "uniform" else ""
    return f"tuned by moeops (tuning run {tuning_run_uuid}, {result.search}{limits}{routed})"


def _store_config(
    client, tuning_run_uuid, shape, result, entries, *, down_moe=False, down_entries=None
):
    # sent now, never spooled: the tuning run needs the config's id
    body = {
        "device_name": result.device_name,
        "E": shape.E,
        "N": shape.N,
        "dtype": shape.dtype,
        "block_shape": list(shape.block_shape) if shape.block_shape else None,
        "down_moe": down_moe,
        "triton_version": result.triton_version,
        "entries": {str(m): entry for m, entry in entries.items()},
        "down_entries": (
            {str(m): entry for m, entry in down_entries.items()} if down_entries else None
        ),
        "source": "tuned",
        "provenance": _provenance(tuning_run_uuid, result),
        **_kernel_fields(result.kernel),
    }
    return client.request("POST", "/kernel-configs", body=body).json()
