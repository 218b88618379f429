"""An engine server as a child process: started from an argv list (no shell) in its own process
group, its output in a log file, ready once /health answers 200, stopped with SIGTERM and then
SIGKILL after a grace period.

    engine = EngineProcess(["vllm", "serve", "/models/glm-5", "--port", "8000"], log_path=...)
    engine.start()
    engine.wait_healthy("http://127.0.0.1:8000", timeout_s=900)
    ...
    engine.stop()
"""

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from workers.engine_http import EngineHTTP

HEALTH_POLL_S = 1.0
STOP_GRACE_S = 30.0


class EngineStartError(RuntimeError):
    """The engine exited or never answered /health; the message ends with its last log lines."""


class EngineProcess:
    """One engine server process; see the module docstring."""

    def __init__(self, argv, *, log_path, env=None, cwd=None):
        if not argv or not all(isinstance(part, str) for part in argv):
            raise ValueError("argv must be a non-empty list of strings")
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        # where this process's output begins in the log (it may hold earlier lines)
        self._log_from = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "EngineProcess":
        """Start the process (returns at once); its output is appended to log_path."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_from = log.seek(0, os.SEEK_END)
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines this process wrote to its log ("" before it wrote any)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(self._log_from, log.tell() - 64 * 1024))
                text = log.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(
        self,
        base_url: str,
        *,
        timeout_s: float,
        on_wait: Callable[[float], None] | None = None,
    ) -> float:
        """Block until GET base_url/health answers 200; returns the seconds waited.

        on_wait(elapsed_s) is called between polls (progress). Raises EngineStartError when the
        process exits first or timeout_s passes.
        """
        start = time.monotonic()
        with EngineHTTP(base_url, timeout_s=5.0) as engine:
            while True:
                elapsed = time.monotonic() - start
                if not self.alive():
                    code = self.proc.returncode if self.proc is not None else None
                    tail = self.log_tail()
                    raise EngineStartError(
                        f"the engine exited with status {code} before it was healthy"
                        f"{_last_line(tail)}\nits last log lines:\n{tail}"
                    )
                if engine.get("/health").ok:
                    return elapsed
                if elapsed >= timeout_s:
                    raise EngineStartError(
                        f"{engine.base_url}/health did not answer 200 within {timeout_s:.0f} s\n"
                        f"its last log lines:\n{self.log_tail()}"
                    )
                if on_wait is not None:
                    on_wait(elapsed)
                time.sleep(HEALTH_POLL_S)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # children the engine spawned (its engine-core and worker processes) go with the group
        _signal_group(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


def _last_line(tail: str) -> str:
    """ ": <the log's last line>" (where an engine states why it exited), "" for no log."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
