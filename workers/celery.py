"""The GPU-host Celery app `workers`: sweeps, checks, kernel tuning and topology probes.

Each GPU host runs one worker on its own queue, `host.<MOEOPS_HOST>`:

    MOEOPS_HOST=<name> MOEOPS_URL=... MOEOPS_TOKEN=... REDIS_URL=redis://... \\
        celery -A workers worker -Q host.<name>

The web tier enqueues these tasks by name (`workers.run_sweep`, ...) and never imports this
package; results go back over the REST API (workers.client), so no result backend is used.
"""

import logging
import os
import socket

from celery import Celery, bootsteps
from celery.signals import worker_ready

from domain.queues import VISIBILITY_TIMEOUT_S, host_queue

# httpx logs every request at INFO: thousands per sweep level
logging.getLogger("httpx").setLevel(logging.WARNING)

HOST_NAME = os.getenv("MOEOPS_HOST") or socket.gethostname().split(".")[0]
HOST_QUEUE = host_queue(HOST_NAME)

# no Django fixup: a GPU host has no Django, even where DJANGO_SETTINGS_MODULE is set (make run)
app = Celery("workers", include=["workers.tasks"], fixups=[])
app.conf.update(
    broker_url=os.getenv("REDIS_URL", "redis://127.0.0.1:6379/0"),
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        # look for orphaned tasks every unacked_restore_interval s (kombu's default is 100 s)
        "unacked_restore_interval": min(10, VISIBILITY_TIMEOUT_S),
        "unacked_restore_throttle": 1,
    },
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_default_queue=HOST_QUEUE,
    # one task at a time per host: two sweeps on the same GPUs would spoil each other's numbers
    worker_concurrency=1,
    worker_prefetch_multiplier=1,
    # a task whose worker died is handed out again; every task here is idempotent
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_cancel_long_running_tasks_on_connection_loss=False,
)


@worker_ready.connect
def _probe_on_start(sender, **kwargs):
    # a worker that starts may be on new hardware or a new virtualization layer: record it
    app.send_task("workers.probe_host", queue=HOST_QUEUE)


class HeartbeatStep(bootsteps.StartStopStep):
    """The worker's heartbeat (workers.heartbeat) from start to shutdown, in its main process.

    It starts once the pool's processes are forked (a thread running at a fork can leave a lock
    held in the child, which then hangs), and before the broker connection, not once the worker
    is ready: a worker that cannot reach its broker retries 100 times (most of an hour) before
    it is, and its heartbeat is what tells the web tier why work waits.
    """

    requires = ("celery.worker.components:Pool",)

    def create(self, worker):
        from workers.broker import BrokerCheck
        from workers.heartbeat import HEARTBEAT_S, Heartbeat

        if HEARTBEAT_S <= 0:
            return None
        return Heartbeat(HOST_NAME, HOST_QUEUE, broker=BrokerCheck(app))


app.steps["worker"].add(HeartbeatStep)
