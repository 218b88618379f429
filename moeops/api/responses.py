"""Idempotent writes answer 201 when they stored something and 200 when it was already there;
a task sent to a host's worker answers 202 with what was sent."""

from typing import Any

from kombu.exceptions import OperationalError
from ninja import Schema, Status
from ninja.errors import HttpError
from pydantic import Field


def stored(created, body):
    return Status(201 if created else 200, body)


class HostTaskQueued(Schema):
    """A task sent to a host's worker; its result arrives later, pushed by the worker."""

    task: str = Field(description="the GPU-host task, e.g. workers.check_deployment")
    queue: str = Field(description="the host's queue, host.<name>")
    kwargs: dict[str, Any]


def queued(task, host, enqueue):
    """202 with what `enqueue()` sent (it returns the task's kwargs); 503 naming the broker's
    error when it cannot be reached."""
    try:
        kwargs = enqueue()
    except OperationalError as exc:
        raise HttpError(503, f"could not reach the broker to enqueue {task}: {exc}") from None
    return Status(202, {"task": task, "queue": host.queue_name, "kwargs": kwargs or {}})
