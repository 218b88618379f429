"""The GPU-host tasks: thin wrappers that parse plain values, call the library, push results.

Enqueued by name on `host.<name>` (see workers.celery); results travel over the REST API with
the host's token, never as Celery results. Every task is idempotent, so a task whose worker died
is simply run again (acks_late).
"""

import contextlib
import logging
import time

from domain.progress import HEARTBEAT_STALE_S
from domain.queues import SWEEP_SOFT_LIMIT_S
from workers import engine_action, engine_check, job, kernel_tune, sweep, telemetry, topology
from workers.celery import HOST_NAME, HOST_QUEUE, app
from workers.client import ApiError, MoeopsClient, Unreachable

log = logging.getLogger(__name__)

# Time limits (s): soft raises inside the task so it can end its run as failed; hard kills it.
# Every hard limit ends before the broker's visibility timeout (domain.queues) would hand the
# task to another worker. A sweep's soft limit is in domain.queues: the web tier reads it too.
TUNE_SOFT_LIMIT_S = 3 * 3600
CHECK_SOFT_LIMIT_S = 120
# A restart waits for the engine's /health (a recipe allows up to 2 h), then perhaps for the
# previous recipe's.
ACTION_SOFT_LIMIT_S = 5 * 3600
HARD_MARGIN_S = 120
# The web tier unreachable before a task could start: try again later, this many times.
UNREACHABLE_RETRIES = 20
UNREACHABLE_BACKOFF_MAX_S = 600
# Ends a sweep cleanly (failed, finished levels kept) before the soft limit interrupts it.
DEADLINE_MARGIN_S = 60
# How often a spool that still holds pushes is tried again (s).
REPLAY_COUNTDOWN_S = 10


def _host_task(name, soft_limit_s, **options):
    """A task of this host's queue, bound and retried by its own rules, with a soft time limit of
    soft_limit_s and a hard one HARD_MARGIN_S after it."""
    return app.task(
        name=name,
        bind=True,
        max_retries=None,
        soft_time_limit=soft_limit_s,
        time_limit=soft_limit_s + HARD_MARGIN_S,
        **options,
    )


def _unless_busy(task, outcome):
    """The job's outcome; job.BUSY (another delivery's heartbeat is fresh) retries the task once
    that heartbeat would have gone stale."""
    if outcome == job.BUSY:
        raise task.retry(countdown=HEARTBEAT_STALE_S, max_retries=None)
    return outcome


def _retry_later(task, exc):
    if task.request.retries >= UNREACHABLE_RETRIES:
        raise exc
    countdown = min(10 * 2**task.request.retries, UNREACHABLE_BACKOFF_MAX_S)
    raise task.retry(exc=exc, countdown=countdown, max_retries=None)


def _replay_later(client):
    # results that wait in the spool reach the web tier once it is back, even with no new task
    if client.spool is not None and client.spool.entries():
        app.send_task("workers.replay_spool", queue=HOST_QUEUE, countdown=REPLAY_COUNTDOWN_S)


@contextlib.contextmanager
def _host_client(task, job_path=None):
    """A client for the task's body: web tier unreachable retries the task; spooled pushes are
    replayed later. job_path: the API path of the job the task runs (/runs/<uuid>), failed
    with the cause when the body raises anything else."""
    with MoeopsClient() as client:
        try:
            yield client
        except Unreachable as exc:
            _retry_later(task, exc)
        except Exception as exc:
            if job_path is not None:
                _fail_job(client, job_path, exc)
            raise
        _replay_later(client)


def _fail_job(client, job_path, exc):
    """Fail the job at job_path with exc as its cause, sent now and not through the spool: the
    spool may be what failed, and a job left queued would wait for this worker forever while
    its heartbeat says it is alive."""
    error = f"The worker's task failed: {type(exc).__name__}: {exc}"[:2000]
    try:
        client.request("PATCH", job_path, body={"status": "failed", "error": error})
    except ApiError as failed:
        # 409: the job already ended (the task body reported its own end); else nothing to do
        log.warning("could not fail %s after %s: %s", job_path, type(exc).__name__, failed)


@_host_task("workers.run_sweep", SWEEP_SOFT_LIMIT_S)
def run_sweep(self, run_uuid, **parameters):
    """Sweep run `run_uuid`; parameters as workers.sweep.sweep_config takes them."""
    deadline = time.monotonic() + SWEEP_SOFT_LIMIT_S - DEADLINE_MARGIN_S
    with _host_client(self, f"/runs/{run_uuid}") as client:
        outcome = sweep.run_sweep(run_uuid, parameters, client=client, deadline=deadline)
    return _unless_busy(self, outcome)


@_host_task("workers.tune_kernel", TUNE_SOFT_LIMIT_S)
def tune_kernel(self, tuning_run_uuid, **parameters):
    """Tune the fused-MoE kernel for a shape on this host's GPU(s); parameters (the shape, the
    engine whose kernel is asked for, the weights' quantization, force) as kernel_tune takes
    them."""
    with _host_client(self, f"/tuning-runs/{tuning_run_uuid}") as client:
        outcome = kernel_tune.tune_kernel(tuning_run_uuid, client=client, **parameters)
    return _unless_busy(self, outcome)


@_host_task(
    "workers.engine_action",
    ACTION_SOFT_LIMIT_S,
    # a failed action is reported and ends its chain: an expected outcome, not a crash
    throws=(engine_action.ActionFailed,),
)
def run_engine_action(self, action_uuid, **payload):
    """Restart the deployment's managed engine with a new launch recipe (kernel configs
    written, the change checked, the previous recipe back when it fails); payload as
    workers.engine_action.run_action takes it. Raises ActionFailed, so that the chain's
    re-sweep does not run, when the action failed."""
    with _host_client(self) as client:
        outcome = engine_action.run_action(action_uuid, payload, client=client, host_name=HOST_NAME)
    return _unless_busy(self, outcome)


@_host_task("workers.check_deployment", CHECK_SOFT_LIMIT_S)
def check_deployment(self, deployment, base_url, model="", engine="", trigger="manual"):
    """Ask the engine what it is and what it serves; push the check to the deployment's health
    history (the newest check sets its status) and record the host's GPUs.

    engine: the engine the deployment records, so that another one answering is flagged;
    trigger: what asked for the check (manual, periodic or api)."""
    checked_at = time.time()
    result = engine_check.check_engine(base_url, model, recorded_engine=engine)
    with _host_client(self) as client:
        client.post_health_check(deployment, result, trigger=trigger, checked_at=checked_at)
        _record_host(client)
    return result["status"]


@_host_task("workers.gpus_now", CHECK_SOFT_LIMIT_S)
def gpus_now(self):
    """Read every GPU of this host once through NVML and push the reading; without NVML the
    reading says why."""
    reading = telemetry.read_gpus_now()
    with _host_client(self) as client:
        client.post_gpu_reading(HOST_NAME, reading)
    return reading["status"]


@_host_task("workers.probe_host", CHECK_SOFT_LIMIT_S)
def probe_host(self):
    """Snapshot this host's GPUs, links, P2P and virtualization; stored when it changed."""
    with _host_client(self) as client:
        _record_host(client)


@app.task(name="workers.replay_spool", bind=True, max_retries=None)
def replay_spool(self):
    """Send the pushes waiting in the spool; look again later while some still wait."""
    with MoeopsClient() as client:
        sent, waiting = client.replay_spool()
    if sent:
        log.info("replayed %d spooled pushes; %d still wait", sent, waiting)
    if waiting:
        raise self.retry(countdown=min(REPLAY_COUNTDOWN_S * 2**self.request.retries, 600))


def _record_host(client):
    snapshot = topology.probe()
    client.post_topology(HOST_NAME, snapshot)
    gpus = [
        {
            "index": gpu["index"],
            "name": gpu["name"],
            "uuid": gpu.get("uuid") or "",
            "compute_capability": gpu.get("compute_capability") or "",
            "memory_total_mib": gpu.get("memory_total_mib"),
            "power_limit_w": gpu.get("power_limit_w"),
        }
        for gpu in snapshot["gpus"]
        if gpu.get("name")
    ]
    if gpus:
        client.post_gpus(HOST_NAME, gpus)
