"""Workloads: what a sweep sends (random lengths, a dataset file, shared prefixes, multi-turn
conversations), named and versioned; a run names one in its parameters' `workload`."""

import base64
import binascii
import datetime as dt
from typing import Any

from ninja import Query, Router, Schema
from ninja.errors import HttpError
from pydantic import Field, model_validator

from domain.workloads import MAX_LENGTH
from moeops.api import lookups
from moeops.api.auth import PersonOnly
from moeops.api.fields import In, JsonObject, PosInt, one_of, text
from moeops.api.responses import stored
from moeops.runs.models import WORKLOAD_KINDS, Workload
from moeops.runs.workloads import workload_store

router = Router(tags=["workloads"])

WorkloadKind = one_of(WORKLOAD_KINDS)


class WorkloadIn(In):
    name: text(100, min_length=1)
    spec: JsonObject = Field(
        description='domain.workloads\' spec: {"kind": "random", "input": LENGTH, "output": '
        'LENGTH}, {"kind": "dataset", "output": LENGTH | null}, {"kind": "shared_prefix", '
        '"groups", "prefix_len", "question_len", "output"}, {"kind": "multi_turn", "turns", '
        '"question_len", "output", "think_time_s"} (with a file: its conversations\' turns, '
        '"turns" a cap, "output" optional), {"kind": "trace", "block_size": 512, "speed": 1} '
        '(with its Mooncake trace file: JSONL or CSV); docs/metrics.md, "Workloads", '
        'docs/formats.md, "Request traces"'
    )
    description: text(300) = ""
    file_name: text(300) = Field("", description="the dataset, conversations or trace file's name")
    content: str | None = Field(None, description="the file's text")
    content_base64: str | None = Field(None, description="the file's bytes, base64")
    context_len: PosInt | None = Field(
        None, description="tokens: a prompt of more words than this is refused"
    )

    @model_validator(mode="after")
    def _one_content(self):
        if self.content is not None and self.content_base64 is not None:
            raise ValueError("content: send the file as content or content_base64, not both")
        if self.context_len is not None and not 1 <= self.context_len <= MAX_LENGTH:
            raise ValueError(f"context_len: from 1 to {MAX_LENGTH:,}")
        return self

    def file_bytes(self):
        if self.content is not None:
            return self.content.encode("utf-8", errors="surrogatepass")
        if self.content_base64 is not None:
            try:
                return base64.b64decode(self.content_base64, validate=True)
            except (binascii.Error, ValueError):
                raise HttpError(400, "content_base64: not base64") from None
        return None


class WorkloadOut(Schema):
    id: int
    name: str
    version: int
    kind: WorkloadKind
    spec: dict[str, Any]
    description: str
    file_name: str
    sha256: str
    layout: str
    item_count: int = Field(description="prompts of a dataset, requests of a trace")
    created: dt.datetime


@router.post("/workloads", auth=PersonOnly(), response={200: WorkloadOut, 201: WorkloadOut})
def workload_create(request, payload: WorkloadIn):
    """Store a new version of a workload (a dataset with its file); the newest version when it
    holds the same spec and file (200). A refused file is named with its line and the reason."""
    workload, created = workload_store(
        name=payload.name,
        spec=payload.spec,
        file_name=payload.file_name,
        data=payload.file_bytes(),
        context_len=payload.context_len,
        description=payload.description,
    )
    return stored(created, workload)


class WorkloadFilter(Schema):
    name: text(100) | None = Field(None, description="every version of the workload so named")


@router.get("/workloads", response=list[WorkloadOut])
def workload_list(request, filters: Query[WorkloadFilter]):
    workloads = Workload.objects.all()
    if filters.name is not None:
        workloads = workloads.filter(name=filters.name)
    return workloads


@router.get("/workloads/{ref}", response=WorkloadOut)
def workload_get(request, ref: str):
    return lookups.by_id(Workload.objects.all(), "workload", ref)
