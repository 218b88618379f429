"""The engines a GPU-host worker manages: started from a deployment's launch recipe, found again
after the worker restarts, stopped.

What a managed engine is, per deployment, lives in the host's cache folder
(cache_dir()/engines/<deployment>/): engine.json (process, recipe, GPUs, endpoint, start time)
and engine.log (the output of the engine's latest start; the start before it in
engine.previous.log). The process runs in its own process group, so that stopping it stops what
it spawned (vLLM's engine core and workers). An engine is called healthy only when the port of its
endpoint was free before it started and, once /health answers, is held by its process group.

    supervisor = EngineSupervisor()
    supervisor.start(recipe)                  # returns once /health answers, or raises
    supervisor.stop(recipe.deployment)

A restart with another recipe, and the previous one back when it fails, is an engine action's
(workers.engine_action), which writes the recipes' kernel configs in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from tuning.cache_dir import cache_dir
from workers.engine_process import STOP_GRACE_S, EngineProcess, EngineStartError

READY_TIMEOUT_S = 900.0
# How long a port may stay held after its engine was stopped (s): the killed group's sockets
# close as its processes exit.
PORT_FREE_WAIT_S = 10.0


class SupervisorError(RuntimeError):
    """A managed engine could not be started, stopped or restarted; the message says why and,
    where the engine wrote any, ends with its last log lines."""


@dataclass(frozen=True)
class Recipe:
    """How to start a deployment's engine: argv (no shell), environment, working folder, GPU
    indices (CUDA_VISIBLE_DEVICES), its endpoint, and where it reads tuned kernel configs
    (config_env names the variable that points it there: VLLM_TUNED_CONFIG_FOLDER,
    SGLANG_MOE_CONFIG_DIR)."""

    deployment: int
    version: int
    argv: list[str]
    base_url: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    gpu_indices: list[int] = field(default_factory=list)
    config_env: str | None = None
    config_folder: str | None = None
    ready_timeout_s: float = READY_TIMEOUT_S

    @classmethod
    def from_dict(cls, data: dict) -> Recipe:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def process_env(self) -> dict[str, str]:
        """The engine's environment: the worker's, the recipe's, its GPUs, its config folder."""
        env = {**os.environ, **{k: str(v) for k, v in self.env.items()}}
        if self.gpu_indices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpu_indices))
        if self.config_env and self.config_folder:
            env[self.config_env] = self.config_folder
        return env


class EngineSupervisor:
    """Managed engines of this host (see the module docstring). root: the state folder."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else cache_dir() / "engines"

    def _folder(self, deployment: int) -> Path:
        return self.root / str(int(deployment))

    def log_path(self, deployment: int) -> Path:
        """The output of the deployment's latest engine start."""
        return self._folder(deployment) / "engine.log"

    def log_tail(self, deployment: int, lines: int = 30) -> str:
        """The last lines of the deployment's engine log ("" when it has none)."""
        return EngineProcess(["true"], log_path=self.log_path(deployment)).log_tail(lines)

    def state(self, deployment: int) -> dict | None:
        """The deployment's engine as recorded, when its process still runs; else None."""
        path = self._folder(deployment) / "engine.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return state if _runs(state) else None

    def running(self) -> list[dict]:
        """Every managed engine still running on this host (a worker's start finds them)."""
        if not self.root.is_dir():
            return []
        found = []
        for folder in sorted(self.root.iterdir()):
            if folder.name.isdigit() and (state := self.state(int(folder.name))) is not None:
                found.append(state)
        return found

    def start(self, recipe: Recipe, *, on_wait: Callable[[float], None] | None = None) -> dict:
        """Start the recipe's engine and wait for its /health; returns its state.

        Raises SupervisorError when the deployment's engine already runs, when another
        managed engine holds one of its GPUs, when another process holds its endpoint's port,
        or when the engine exits, never answers, or is not what answers (it is stopped then).
        """
        if self.state(recipe.deployment) is not None:
            raise SupervisorError(f"deployment {recipe.deployment}'s engine already runs")
        for other in self.running():
            shared = set(other["recipe"]["gpu_indices"]) & set(recipe.gpu_indices)
            if shared:
                gpus = ", ".join(map(str, sorted(shared)))
                raise SupervisorError(
                    f"GPU {gpus} is held by deployment {other['recipe']['deployment']}'s engine"
                )
        port = _endpoint_port(recipe.base_url)
        _wait_port_free(port)
        folder = self._folder(recipe.deployment)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(recipe.deployment)
        # each start its own log: a failed start's cause is not buried under an older engine's
        with contextlib.suppress(FileNotFoundError):
            log_path.replace(folder / "engine.previous.log")
        process = EngineProcess(
            recipe.argv, log_path=log_path, env=recipe.process_env(), cwd=recipe.cwd
        )
        log_path.write_text(f"== moeops: starting recipe v{recipe.version}: {recipe.argv}\n")
        try:
            process.start()
        except OSError as exc:
            raise SupervisorError(f"the engine could not be started: {exc}") from None
        state = {
            "pid": process.pid,
            "started_at": time.time(),
            "start_after_boot_s": _start_after_boot(process.pid),
            "recipe": asdict(recipe),
        }
        self._record(recipe.deployment, state)
        try:
            state["ready_after_s"] = process.wait_healthy(
                recipe.base_url, timeout_s=recipe.ready_timeout_s, on_wait=on_wait
            )
            _check_answering(process, port)
        except EngineStartError as exc:
            self.stop(recipe.deployment)
            raise SupervisorError(str(exc)) from None
        self._record(recipe.deployment, state)
        return state

    def _record(self, deployment: int, state: dict) -> None:
        # whole or not at all: a heartbeat reading it half-written would lose the engine
        path = self._folder(deployment) / "engine.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(state, indent=1))
        partial.replace(path)

    def stop(self, deployment: int, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGTERM the engine's process group, SIGKILL after grace_s; whether one was running."""
        path = self._folder(deployment) / "engine.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        was_running = _runs(state)
        if was_running:
            _stop_group(state["pid"], grace_s)
        path.unlink(missing_ok=True)
        return was_running


def _start_after_boot(pid: int) -> float:
    """When the process started, in seconds after the host booted. Unlike its start in
    wall-clock time this does not move when the clock is set, so a state file written before
    a clock step still names its process after it."""
    return psutil.Process(pid).create_time() - psutil.boot_time()


def _runs(state: dict) -> bool:
    """Whether the recorded process still runs (the same process: its start time matches)."""
    try:
        process = psutil.Process(state["pid"])
        return (
            abs(_start_after_boot(process.pid) - state["start_after_boot_s"]) < 1.0
            and process.status() != psutil.STATUS_ZOMBIE
        )
    except (psutil.NoSuchProcess, KeyError, TypeError):
        return False


def _endpoint_port(base_url: str) -> int:
    """The TCP port of an engine's endpoint (80 or 443 where the URL names none)."""
    parts = urlsplit(base_url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _listeners(port: int) -> list[int | None]:
    """The processes listening on TCP port on this host (None where the pid cannot be read;
    none where the system lets no socket be listed)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return []
    return [
        conn.pid
        for conn in connections
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    ]


def _holder(pids: list[int | None]) -> str:
    """ "another process (pid 26344: python -m http.server 8000)", as far as it can be told."""
    for pid in pids:
        with contextlib.suppress(psutil.Error, TypeError):
            command = " ".join(psutil.Process(pid).cmdline())[:200]
            return f"another process (pid {pid}: {command})"
    return "another process"


def _wait_port_free(port: int) -> None:
    deadline = time.monotonic() + PORT_FREE_WAIT_S
    while holders := _listeners(port):
        if time.monotonic() >= deadline:
            raise SupervisorError(
                f"port {port} is already in use by {_holder(holders)}: the engine was not "
                "started, since what answered there would not be it"
            )
        time.sleep(0.5)


def _check_answering(process: EngineProcess, port: int) -> None:
    """Raise EngineStartError unless the engine started still runs and its process group holds
    port (a process of another user, whose pid cannot be read, is not told apart)."""
    if not process.alive():
        raise EngineStartError(
            f"/health answered, but the engine started (pid {process.pid}) has exited "
            f"with status {process.proc.returncode}: something else answers on port {port}\n"
            f"its last log lines:\n{process.log_tail()}"
        )
    holders = _listeners(port)
    known = [pid for pid in holders if pid is not None]
    if known and not any(_in_group(pid, process.pid) for pid in known):
        raise EngineStartError(
            f"port {port} is held by {_holder(known)}, not by the engine started "
            f"(pid {process.pid})\nits last log lines:\n{process.log_tail()}"
        )


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def _stop_group(pid: int, grace_s: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        # what ignored SIGTERM, and the group's stragglers
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)


def _group_alive(pid: int) -> bool:
    """Whether the group's leader still runs (a zombie leader, once reaped, does not)."""
    _reap(pid)
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap(pid: int) -> None:
    # an engine this process started stays a zombie until it is waited for
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
