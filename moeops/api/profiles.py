"""Profiled levels of a sweep: where each engine step's time goes (domain.step_breakdown), as the
worker pushes it after a level's profiled window."""

import datetime as dt
from typing import Annotated

from django.http import Http404
from ninja import File, Form, Router, UploadedFile
from pydantic import Field, model_validator

from domain.step_breakdown import LevelProfile as LevelProfileBody
from domain.storable import storable_json
from moeops.api import lookups
from moeops.api.auth import HostWrite, require_host
from moeops.api.responses import stored
from moeops.runs import measurements
from moeops.runs.keys import level_key
from moeops.runs.parameters import MAX_CONCURRENCY

router = Router(tags=["runs"])

# a form's fields arrive as text: these read "64" and "2.5" as numbers
UploadConcurrency = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]
UploadRate = Annotated[float, Field(gt=0, le=1e6)] | None


class ProfileIn(LevelProfileBody):
    """The worker's body: the contract, and nothing jsonb refuses (NUL, a lone surrogate,
    NaN or Infinity) anywhere in it."""

    @model_validator(mode="after")
    def _storable(self):
        # the Python dump keeps NaN and Infinity, which the JSON dump would turn into null
        storable_json(self.model_dump())
        return self


class ProfileOut(LevelProfileBody):
    """The profile as pushed, with what the web tier stored it as."""

    id: int
    source: str = Field(description="worker, or upload (traces uploaded by hand)")
    created: dt.datetime


def _out(profile):
    return ProfileOut(
        **profile.body().model_dump(),
        id=profile.pk,
        source=profile.source,
        created=profile.created,
    )


@router.post("/runs/{ref}/profiles", auth=HostWrite(), response={200: ProfileOut, 201: ProfileOut})
def profile_record(request, ref: str, payload: ProfileIn):
    """Store a level's profile once per (run, concurrency, request rate, attempt): 201 the first
    time, 200 for the same body again; 409 for another body under that key, or a new profile of
    a finished run."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    profile, created = measurements.profile_record(run=run, body=payload)
    return stored(created, _out(profile))


@router.post(
    "/runs/{ref}/profiles/upload", auth=HostWrite(), response={200: ProfileOut, 201: ProfileOut}
)
def profile_upload(
    request,
    ref: str,
    concurrency: Form[UploadConcurrency],
    file: File[UploadedFile],
    request_rate: Form[UploadRate] = None,
):
    """Traces captured by hand for a level (multipart: `file` a .zip of rank traces, or one
    .json.gz or .json trace; `concurrency`, and `request_rate` for a rate level), read by the
    web tier into a captured profile: 201, or 200 for the same file again. A file over
    MOEOPS_MAX_TRACE_BYTES, or one the trace reader refuses, is a 400 naming `file` with the
    reader's sentence, and nothing is stored. A finished run takes uploads."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    profile, created = measurements.profile_upload(
        run=run,
        concurrency=concurrency,
        request_rate=request_rate,
        name=file.name or "",
        chunks=file.chunks(),
        size=file.size,
    )
    return stored(created, _out(profile))


@router.get("/runs/{ref}/profiles", response=list[ProfileOut])
def profile_list(request, ref: str):
    """The run's profiled levels, the newest profile of each, by concurrency."""
    run = lookups.get_run(ref)
    return [_out(profile) for profile in run.profiles.shown()]


@router.get("/runs/{ref}/profiles/{concurrency}", response=ProfileOut)
def profile_get(request, ref: str, concurrency: int, request_rate: float | None = None):
    """A level's profile (its newest): the level of that concurrency sent without a rate, or at
    `request_rate` req/s."""
    run = lookups.get_run(ref)
    key = level_key(concurrency, request_rate)
    found = run.profiles.filter(key=key).shown()
    if not found:
        raise Http404(f"run {run.uuid} has no profile of level {key}")
    return _out(found[0])
