"""A host's worker's bodies about the engines it manages: its heartbeat, and its report of an
engine action."""

from typing import Literal

from pydantic import Field

from domain.wire.fields import Attempt, Body, JsonObject, LongText

# Statuses a worker reports of an engine action; queued is where an action starts.
ReportedStatus = Literal["running", "sweeping", "succeeded", "failed"]


class Heartbeat(Body):
    """The worker is alive, and what it says of itself (POST /hosts/{ref}/heartbeat)."""

    worker: JsonObject = Field({}, description="host, pid, queue of the worker")
    engines: list[JsonObject] = Field([], max_length=64, description="the managed engines running")
    spool: JsonObject = Field({}, description="waiting and rejected pushes")
    broker: JsonObject = Field(
        {}, description="whether the worker reaches its Celery broker: reachable, url, error, since"
    )
    sent_at: float | None = Field(None, ge=0, le=1e11, description="UTC epoch s")


class ActionReport(Body):
    """An engine action's steps, observed engine, log tail, error and status as the worker
    reports them (PATCH /engine-actions/{ref})."""

    status: ReportedStatus | None = None
    steps: list[JsonObject] | None = Field(None, max_length=64)
    observed: JsonObject | None = None
    error: LongText = ""
    log_tail: LongText = ""
    progress: JsonObject | None = Field(
        None, description="the heartbeat of the delivery carrying it out: heartbeat, attempt, …"
    )
    takeover: Attempt | None = Field(
        None,
        description="a new delivery takes the running action over as this attempt: "
        "compare-and-set on the attempt before it (409 when another delivery took it first)",
    )
