"""The worker's heartbeat: every MOEOPS_HEARTBEAT_S it tells the web tier that it is alive, which
managed engines run on its host (found again after a restart), what waits in its spool and
whether it reaches its broker.

The web tier marks the host's worker alive while heartbeats arrive (`Host.worker_alive`), says
at once that work for a host without one would wait, and fails the work of a worker that
stopped sending them (moeops.jobs.fail_stale_jobs). Started by workers.celery
(HeartbeatStep) in the worker's main process before it connects to its broker: neither a broker
out of reach nor a task that runs for hours stops it.
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


def worker_status(queue, supervisor=None, spool=None, broker=None) -> dict:
    """What a heartbeat says: {"worker": {"host", "pid", "queue"}, "engines": [...], "spool":
    {"waiting", "rejected"}, "broker": {"reachable", "url", "error", "since"}, "sent_at"}; an
    engine: {"deployment", "version", "pid", "started_at" (epoch s), "ready_after_s", "argv",
    "base_url", "log_tail"}. broker: a workers.broker.BrokerCheck."""
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
    if broker is not None:
        status["broker"] = broker()
    return status


class Heartbeat(threading.Thread):
    """Sends a heartbeat for host every interval_s until stop(); broker: as worker_status
    takes it."""

    def __init__(self, host, queue, interval_s=HEARTBEAT_S, broker=None):
        super().__init__(name="moeops-heartbeat", daemon=True)
        self.host = host
        self.queue = queue
        self.interval_s = interval_s
        self.broker = broker
        self._halt = threading.Event()

    def beat(self, client):
        try:
            status = worker_status(self.queue, spool=client.spool, broker=self.broker)
            client.post_heartbeat(self.host, status)
        except ApiError as exc:
            # the web tier may be down: the next beat tries again, a late one says nothing
            log.info("heartbeat of %s not sent: %s", self.host, exc)
        except Exception:
            # a beat that cannot be made must not end the thread: without heartbeats the web
            # tier takes the worker for gone and fails its work
            log.exception("heartbeat of %s failed", self.host)

    def run(self):
        with MoeopsClient(timeout_s=10.0) as client:
            while True:
                self.beat(client)
                if self._halt.wait(self.interval_s):
                    return

    def stop(self):
        self._halt.set()
