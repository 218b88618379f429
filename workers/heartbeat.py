"""The worker's heartbeat: every MOEOPS_HEARTBEAT_S it tells the web tier that it is alive, which
managed engines run on its host (found again after a restart) and what waits in its spool.

The web tier marks the host's worker alive while heartbeats arrive (`Host.worker_alive`), says
at once that work for a host without one would wait, and fails the work of a worker that
stopped sending them (moeops.engines.services.stale_work_fail). Started by workers.celery when
the worker is ready, in the worker's main process: a task that runs for hours does not stop it.
"""

import logging
import os
import socket
import threading
import time

from workers.client import ApiError, MoeopsClient
from workers.engine_supervisor import EngineSupervisor

log = logging.getLogger(__name__)

HEARTBEAT_S = float(os.getenv("MOEOPS_HEARTBEAT_S", "30"))
LOG_LINES = 20


def worker_status(queue, supervisor=None, spool=None) -> dict:
    """What a heartbeat says: {"worker": {"host", "pid", "queue"}, "engines": [...], "spool":
    {"waiting", "rejected"}, "sent_at"}; an engine: {"deployment", "version", "pid",
    "started_at" (epoch s), "ready_after_s", "argv", "base_url", "log_tail"}."""
    supervisor = supervisor or EngineSupervisor()
    engines = []
    for state in supervisor.running():
        recipe = state.get("recipe") or {}
        deployment = recipe.get("deployment")
        engines.append(
            {
                "deployment": deployment,
                "version": recipe.get("version"),
                "pid": state.get("pid"),
                "started_at": state.get("started_at"),
                "ready_after_s": state.get("ready_after_s"),
                "argv": recipe.get("argv"),
                "base_url": recipe.get("base_url"),
                "log_tail": supervisor.log_tail(deployment, LOG_LINES),
            }
        )
    status = {
        "worker": {"host": socket.gethostname(), "pid": os.getpid(), "queue": queue},
        "engines": engines,
        "sent_at": time.time(),
    }
    if spool is not None:
        status["spool"] = {"waiting": len(spool.entries()), "rejected": spool.rejected_count()}
    return status


class Heartbeat(threading.Thread):
    """Sends a heartbeat for host every interval_s until stop()."""

    def __init__(self, host, queue, interval_s=HEARTBEAT_S):
        super().__init__(name="moeops-heartbeat", daemon=True)
        self.host = host
        self.queue = queue
        self.interval_s = interval_s
        self._halt = threading.Event()

    def beat(self, client):
        try:
            client.post_heartbeat(self.host, worker_status(self.queue, spool=client.spool))
        except ApiError as exc:
            # the web tier may be down: the next beat tries again, a late one says nothing
            log.info("heartbeat of %s not sent: %s", self.host, exc)

    def run(self):
        with MoeopsClient(timeout_s=10.0) as client:
            while True:
                self.beat(client)
                if self._halt.wait(self.interval_s):
                    return

    def stop(self):
        self._halt.set()
