"""A level's profiled pass: the level's load once more, with the engine's torch profiler recording
a bounded window of its steps at steady state, read into a step breakdown on this host.

The engine must have been started with its profiler (vLLM: `--profiler-config` naming a torch
profiler folder, which also serves /start_profile and /stop_profile); one that was not gets a
`LevelProfile` of status "unavailable" whose reason says how to start it so. The window opens when
the pass's first request finishes (every stream is then running: the warm-up is over and the
prefills of the first wave are done) and is bounded by the engine itself (`max_iterations` steps);
/stop_profile closes it when the pass ends first. The pass is not a round of the level: its
figures only measure what the window cost (ProfileCost) and are never a level's.
"""

import asyncio
import dataclasses
import logging
import socket
import threading
import time
from pathlib import Path

from domain.launch import PROFILES_FOLDER, profiler_flag_value
from domain.step_breakdown import LevelProfile, ProfileCost, ProfileTrace
from domain.step_trace import TraceError, read_breakdown
from workers import loadgen
from workers.engine_http import EngineHTTP

log = logging.getLogger(__name__)

HOW_TO_START = (
    "start vLLM with --profiler-config '{config}' (a managed engine: its action "
    '"restart with profiling available") for moeops to profile a level'
)
# s the engine may take to answer /start_profile: at TP 2 the CPU build answered after 17 s
START_TIMEOUT_S = 120.0
# s to wait for every rank's trace file to be written once the window is closed
TRACES_TIMEOUT_S = 300.0
# s a trace folder's files must keep their sizes to count as written
SETTLED_S = 2.0
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")


def how_to_start(folder: str = PROFILES_FOLDER) -> str:
    return HOW_TO_START.format(config=profiler_flag_value(folder))


def profiler_folder(http: EngineHTTP) -> tuple[str | None, str]:
    """(the folder where the engine at http writes its torch traces, "") or (None, why not) from
    vLLM's /server_info (VLLM_SERVER_DEV_MODE=1)."""
    info = http.get("/server_info?config_format=json")
    body = info.json_object() if info.ok else None
    config = (body or {}).get("vllm_config")
    if not isinstance(config, dict):
        return None, (
            f"{info.sentence() if not info.ok else info.url + ' holds no vllm_config'}: moeops "
            "reads the profiler's folder from vLLM's /server_info (VLLM_SERVER_DEV_MODE=1)"
        )
    profiler = config.get("profiler_config")
    if not isinstance(profiler, dict) or profiler.get("profiler") != "torch":
        return None, f"the engine at {http.base_url} was not started with a torch profiler"
    folder = profiler.get("torch_profiler_dir")
    if not isinstance(folder, str) or not folder:
        return None, f"the engine at {http.base_url} names no torch_profiler_dir"
    return folder, ""


def trace_files(folder: Path) -> dict[Path, int]:
    """The torch-profiler traces under folder (vLLM writes them there or in a subfolder), with
    their sizes in bytes."""
    found = {}
    for path in folder.rglob("*"):
        if path.name.endswith(TRACE_SUFFIXES) and path.is_file():
            found[path] = path.stat().st_size
    return found


def written_traces(folder: Path, before: dict[Path, int], timeout_s: float) -> list[Path]:
    """The trace files that appeared in folder since `before`, once their names and sizes have
    settled for SETTLED_S (the engine writes each rank's file when its window closes)."""
    deadline = time.monotonic() + timeout_s
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = {p: n for p, n in trace_files(folder).items() if before.get(p) != n}
        if now != seen:
            seen, since = now, time.monotonic()
        elif now and time.monotonic() - since >= SETTLED_S:
            return sorted(now)
        time.sleep(0.25)
    return sorted(seen or {})


class _Window:
    """The profiler window, opened and closed from the load's event loop without blocking it."""

    def __init__(self, http: EngineHTTP, steps: int):
        self._http = http
        self._steps = steps
        self._thread: threading.Thread | None = None
        self.opened_at: float | None = None
        self.closed_at: float | None = None
        self.error = ""

    def open(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._start, name="profile-start", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        answer = self._http.post(
            "/start_profile", {"max_iterations": self._steps}, timeout_s=START_TIMEOUT_S
        )
        if answer.ok:
            self.opened_at = time.monotonic()
        else:
            self.error = f"the profiler did not start: {answer.sentence()}"

    def close(self) -> None:
        if self._thread is None:
            self.error = self.error or "the profiled pass ended before its first request did"
            return
        self._thread.join(START_TIMEOUT_S)
        if self.opened_at is None:
            self.error = self.error or "the profiler did not answer /start_profile in time"
            return
        answer = self._http.post("/stop_profile", timeout_s=TRACES_TIMEOUT_S)
        self.closed_at = time.monotonic()
        if not answer.ok:
            self.error = f"the profiler did not stop: {answer.sentence()}"


def profiled_level(level: loadgen.LevelConfig) -> loadgen.LevelConfig:
    """The pass's load: the level's, with at least two waves of prompts, so that the window that
    opens as the first request ends finds every stream still running."""
    return dataclasses.replace(level, num_prompts=max(level.num_prompts, 2 * level.concurrency))


def profile_level(
    client_cfg: loadgen.ClientConfig,
    level: loadgen.LevelConfig,
    *,
    steps: int,
    unprofiled_tok_s: float | None = None,
    engine: str = "vllm",
    should_stop=None,
    attempt: int = 1,
    traces_timeout_s: float = TRACES_TIMEOUT_S,
) -> dict:
    """Run the level's profiled pass and return its LevelProfile body (a dict, JSON-ready).

    steps: the window's bound in engine steps; unprofiled_tok_s: the level's output throughput
    unprofiled (tok/s, the median of its rounds) for the window's cost; engine: what serves it
    ("vllm"; another engine's profile is unavailable, with the reason).
    """
    base = {
        "concurrency": level.concurrency,
        "request_rate": None if level.request_rate == float("inf") else level.request_rate,
        "attempt": attempt,
        "steps_asked": steps,
    }

    def unavailable(reason):
        log.info("profile at concurrency %s unavailable: %s", level.concurrency, reason)
        return LevelProfile(status="unavailable", reason=reason, **base).model_dump(mode="json")

    if engine != "vllm":
        return unavailable(
            f"moeops profiles vLLM's steps; the engine that serves is {engine or 'unknown'}"
        )
    with EngineHTTP(client_cfg.base_url, timeout_s=30.0) as http:
        folder, why = profiler_folder(http)
        if folder is None:
            return unavailable(f"{why}: {how_to_start()}")
        where = Path(folder)
        if not where.is_dir():
            return unavailable(
                f"the engine writes its traces to {folder}, which is no folder on this worker's "
                f"host ({socket.gethostname()}): run the worker on the engine's host"
            )
        before = trace_files(where)
        window = _Window(http, steps)

        def on_request_done(done, total):
            window.open()

        started = time.monotonic()
        result = asyncio.run(
            loadgen.run_level(
                client_cfg,
                profiled_level(level),
                on_request_done=on_request_done,
                should_stop=should_stop,
            )
        )
        window.close()
    if window.error:
        return LevelProfile(status="failed", reason=window.error, **base).model_dump(mode="json")
    files = written_traces(where, before, traces_timeout_s)
    host = socket.gethostname()
    traces = [ProfileTrace(host=host, path=str(p), size_bytes=p.stat().st_size) for p in files]
    profiled_tok_s = result.get("output_throughput") or 0.0
    cost = None
    if unprofiled_tok_s:
        cost = ProfileCost(
            profiled_tok_s=profiled_tok_s,
            unprofiled_tok_s=unprofiled_tok_s,
            ratio=unprofiled_tok_s / profiled_tok_s if profiled_tok_s else None,
        )
    measured = {
        **base,
        "window_s": (window.closed_at or time.monotonic()) - (window.opened_at or started),
        "traces": traces,
        "cost": cost,
    }
    if not files:
        reason = f"the engine wrote no trace into {folder} within {traces_timeout_s:.0f} s"
        return LevelProfile(status="failed", reason=reason, **measured).model_dump(mode="json")
    try:
        breakdown = read_breakdown(files)
    except TraceError as exc:
        return LevelProfile(status="failed", reason=str(exc), **measured).model_dump(mode="json")
    return LevelProfile(status="captured", breakdown=breakdown, **measured).model_dump(mode="json")


def describe(body: dict) -> str:
    """A profiled level in lines of text: its status (or why it has no breakdown), what the
    window cost, and each rank's step kinds with every class's share and mean time (µs)."""
    profile = LevelProfile.model_validate(body)
    head = f"concurrency {profile.concurrency}: profile {profile.status}"
    if profile.breakdown is None:
        return f"{head}: {profile.reason}"
    lines = [head]
    if profile.cost is not None and profile.cost.ratio:
        lines.append(
            f"  the window cost the level ×{profile.cost.ratio:.2f} "
            f"({profile.cost.profiled_tok_s:.0f} tok/s profiled, "
            f"{profile.cost.unprofiled_tok_s:.0f} unprofiled)"
        )
    lines.append(format_breakdown(profile.breakdown))
    return "\n".join(lines)


def format_breakdown(breakdown) -> str:
    """A StepBreakdown as text: per rank and kind of step, the steps counted, the step's median,
    p10 and p90 (ms), and each class's share, mean µs per step and top names."""
    version = f" {breakdown.engine_version}" if breakdown.engine_version else ""
    lines = [f"{breakdown.engine}{version}, kernel names of {breakdown.rules}"]
    for rank in breakdown.ranks:
        lines.append(f"\nrank {rank.rank} ({rank.device}): {rank.file}")
        for kind in rank.kinds:
            lines.append(
                f"  {kind.kind}: {kind.steps} steps, step {kind.step_us_median / 1000:.2f} ms "
                f"median (p10 {kind.step_us_p10 / 1000:.2f}, p90 {kind.step_us_p90 / 1000:.2f})"
            )
            lines.append(f"    {'CLASS':<14}{'SHARE':>8}{'µs/STEP':>11}  TOP")
            for c in kind.classes:
                top = ", ".join(t.name for t in c.top[:2])
                lines.append(
                    f"    {c.name:<14}{c.share * 100:>7.1f}%{c.time_us:>11,.0f}  {top}"[:160]
                )
    lines.extend(f"note: {note}" for note in breakdown.notes)
    return "\n".join(lines)
