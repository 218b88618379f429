"""A job as a GPU host's worker runs it, one protocol for every kind: a sweep run, a kernel
tune and an engine action. A delivery of the job's task claims it (queued → running), or finds
it settled, or finds another delivery at it and stands down (BUSY: the task looks again once
that one's heartbeat would have gone stale), or takes it over from a delivery whose heartbeat
went stale or whose process is gone, as the next attempt (compare-and-set on the web tier:
moeops.jobs.take_over; of two deliveries, one wins). While it runs it sends heartbeats in its
progress; the answer says whether the job was cancelled, and a refusal (409) says another
delivery took it over: either way it stops.
"""

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domain.jobs import FINISHED_STATUSES
from domain.progress import HEARTBEAT_STALE_S, JobBeat
from workers.client import ApiError, BadPush, Conflict

log = logging.getLogger(__name__)

# The outcome when another delivery is still at the job (its heartbeat is fresh).
BUSY = "busy"
# How often a claim may find the job moved under it before the delivery looks again later.
CLAIM_TRIES = 3


@dataclass(frozen=True)
class Kind:
    """How the API reads and writes one kind of job: get(client, uuid) → the job as a dict;
    patch(client, uuid, **fields) and take_over(client, uuid, attempt, progress) → the job
    after the write; cancelled(job) → whether the job's delivery is to stop; settled: the
    statuses in which a delivery has nothing left to do; noun: what the worker's log calls
    the job."""

    name: str
    noun: str
    get: Callable[..., dict]
    patch: Callable[..., dict]
    take_over: Callable[..., dict]
    cancelled: Callable[[dict], bool]
    settled: tuple[str, ...] = FINISHED_STATUSES

    def claim(self, client, ref, progress) -> dict:
        """queued → running (compare-and-set on the web tier)."""
        return self.patch(client, ref, status="running", progress=progress)

    def beat(self, client, ref, progress) -> dict:
        """A heartbeat: advisory, so that a spooled one never replays late."""
        return self.patch(client, ref, advisory=True, progress=progress)


SWEEP = Kind(
    name="sweep",
    noun="run",
    get=lambda client, ref: client.get_run(ref),
    patch=lambda client, ref, **fields: client.update_run(ref, **fields),
    take_over=lambda client, ref, attempt, progress: client.take_over_run(ref, attempt, progress),
    # a running sweep is cancelled by a flag it reads, so that it stores the level it is in
    cancelled=lambda job: bool(job.get("cancel_requested")),
)
TUNE = Kind(
    name="tune",
    noun="tune",
    get=lambda client, ref: client.get_tuning_run(ref),
    patch=lambda client, ref, **fields: client.update_tuning_run(ref, **fields),
    take_over=lambda client, ref, a, progress: client.take_over_tuning_run(ref, a, progress),
    cancelled=lambda job: job.get("status") == "cancelled",
)
ACTION = Kind(
    name="engine action",
    noun="action",
    get=lambda client, ref: client.get_engine_action(ref),
    patch=lambda client, ref, **fields: client.report_action(ref, **fields),
    take_over=lambda client, ref, a, progress: client.take_over_action(ref, a, progress),
    # an action is never cancelled: a restart half done would leave the engine down
    cancelled=lambda job: False,
    # re-sweeping: the action's own part is done, its re-sweep is a sweep run of its own
    settled=("sweeping", "succeeded", "failed"),
)


def me():
    """Who sends the heartbeats: on this host, a dead sender's job is taken over at once."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def alive(progress: JobBeat) -> bool:
    """Whether the process that sent this progress may still be at the job."""
    worker = progress.worker
    if worker.host != socket.gethostname() or not worker.pid:
        # another machine: only its heartbeat can tell
        return True
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Job:
    """One job of `kind` (SWEEP, TUNE) as this delivery runs it: claim() it, then beat() its
    progress; `attempt` is this delivery's (1, then 2, … after each takeover)."""

    def __init__(self, client, kind, ref, *, stale_after_s=HEARTBEAT_STALE_S):
        self.client = client
        self.kind = kind
        self.ref = ref
        self.stale_after_s = stale_after_s
        # marks this delivery's own claim: a write whose answer was lost and whose retry the API
        # refused (409) is recognised as this claim's, not another delivery's
        self.token = uuid.uuid4().hex
        self.attempt = 1

    def stamp(self, progress=None):
        """progress with this delivery's heartbeat (now, UTC epoch s), sender, claim and
        attempt."""
        return {
            **(progress or {}),
            "heartbeat": time.time(),
            "worker": me(),
            "claim": self.token,
            "attempt": self.attempt,
        }

    def claim(self, first_progress=None):
        """The job as the API has it once it is this delivery's to run, or the outcome when
        there is nothing to do here: its finished status, or BUSY when another delivery is at
        it (or it moved under the claim CLAIM_TRIES times). first_progress: what a job's
        progress starts with when this delivery is its first."""
        for _ in range(CLAIM_TRIES):
            job = self.kind.get(self.client, self.ref)
            progress = JobBeat.read(job.get("progress"))
            if job["status"] in self.kind.settled:
                return job["status"]
            if job["status"] == "running" and progress.claim == self.token:
                self.attempt = progress.attempt
                return job
            try:
                if job["status"] != "running":
                    self.attempt = 1
                    return self.kind.claim(self.client, self.ref, self.stamp(first_progress))
                beat = progress.heartbeat
                if beat is not None and time.time() - beat < self.stale_after_s and alive(progress):
                    return BUSY
                self.attempt = progress.attempt + 1
                sent = self.stamp(job.get("progress"))
                taken = self.kind.take_over(self.client, self.ref, self.attempt, sent)
                log.info(
                    "%s %s: resuming a %s whose worker stopped",
                    self.kind.name,
                    self.ref,
                    self.kind.noun,
                )
                return taken
            except Conflict:
                # cancelled, claimed or taken over meanwhile (or this claim's own write, its
                # answer lost): read where it is now
                continue
        return BUSY

    def beat(self, progress=None):
        """Send progress with a heartbeat (advisory: one attempt, never spooled); returns the
        job as the API answered. Raises Conflict when another delivery took the job over (or
        it ended), ApiError or BadPush when the push failed."""
        return self.kind.beat(self.client, self.ref, self.stamp(progress))

    def cancelled(self, job) -> bool:
        """Whether the job as the API answered tells this delivery to stop."""
        return self.kind.cancelled(job)


class Heartbeat(threading.Thread):
    """Beats the job's progress (progress() → dict) every interval_s, then calls each()
    (the sweep's spool replay and sample pushes). `cancelled` follows each answer; a refusal
    (409: another delivery took the job over, or it ended) sets `taken_over` and ends the
    thread; a push that fails is logged by log and tried again at the next beat."""

    def __init__(self, job, progress, interval_s, *, log, each: Callable[[], Any] = None):
        super().__init__(name=f"{job.kind.name}-heartbeat", daemon=True)
        self.job = job
        self.cancelled = False
        self.taken_over = False
        self._progress = progress
        self._interval = interval_s
        self._each = each
        self._log = log
        self._halt = threading.Event()

    def run(self):
        while not self._halt.wait(self._interval):
            try:
                self.cancelled = self.job.cancelled(self.job.beat(self._progress()))
            except Conflict as exc:
                self._log.warning("%s %s: progress refused, stopping: %s", *self._what(), exc)
                self.taken_over = True
                return
            except (ApiError, BadPush) as exc:
                self._log.info("%s %s: progress push failed: %s", *self._what(), exc)
                continue
            if self._each is not None:
                self._each()

    def _what(self):
        return self.job.kind.name, self.job.ref

    def stop(self):
        self._halt.set()
        self.join()
