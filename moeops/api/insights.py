"""Findings (confirm or dismiss them), plan items and notes."""

import datetime as dt
from typing import Any

from ninja import Query, Router, Schema, Status
from ninja.pagination import paginate
from pydantic import Field

from moeops.api import lookups
from moeops.api.auth import PersonOnly
from moeops.api.fields import (
    CreatedRange,
    In,
    JsonObject,
    LongText,
    Patch,
    PosInt,
    in_range,
    matching,
    one_of,
    slug,
    text,
)
from moeops.api.paging import Page
from moeops.api.responses import stored
from moeops.insights import services
from moeops.insights.models import (
    FINDING_KINDS,
    FINDING_SOURCES,
    FINDING_STATES,
    PLAN_STATUSES,
    SEVERITIES,
    Finding,
    Note,
    PlanItem,
)
from moeops.insights.services import finding_set_state

router = Router(tags=["insights"])

FindingKind = one_of(FINDING_KINDS)
FindingState = one_of(FINDING_STATES)
FindingSource = one_of(FINDING_SOURCES)
Severity = one_of(SEVERITIES)
PlanStatus = one_of(PLAN_STATUSES)
NoteSlug = slug(services.NOTE_SLUG_MAX_LENGTH)


# --------------------------------------------------------------------------- findings


class FindingIn(In):
    deployment: text(200, min_length=1) = Field(description="deployment id or name")
    run: text(100) | None = Field(None, description="run id or UUID")
    kind: FindingKind
    key: text(100) = ""
    severity: Severity = "warning"
    title: text(200, min_length=1)
    evidence: JsonObject = {}
    provenance: text(300) = ""
    # last: the field's name shadows the text() helper in the class body
    text: LongText = ""


class FindingPatch(Patch):
    state: FindingState


class FindingOut(Schema):
    id: int
    deployment: int = Field(alias="deployment_id")
    run: int | None = Field(alias="run_id")
    kind: str
    key: str
    severity: str
    title: str
    text: str
    evidence: dict[str, Any]
    source: str
    state: str
    state_changed_at: dt.datetime | None
    note: str | None = Field(description="slug of the note that explains it")
    provenance: str
    created: dt.datetime
    updated: dt.datetime

    @staticmethod
    def resolve_note(obj):
        return obj.note.slug if obj.note_id else None


class FindingFilter(CreatedRange):
    deployment: text(200) | None = Field(None, description="deployment name")
    run: int | None = Field(None, ge=1, le=lookups.MAX_ID, description="run id")
    kind: FindingKind | None = None
    state: FindingState | None = None
    severity: Severity | None = None
    source: FindingSource | None = None


def _findings():
    # the pages' order: most important first (FindingQuerySet.by_importance)
    return Finding.objects.select_related("note").by_importance()


@router.post("/findings", auth=PersonOnly(), response={201: FindingOut})
def finding_create(request, payload: FindingIn):
    """Record a finding by a person (analysis after each run adds the automatic ones)."""
    deployment = lookups.get_deployment(payload.deployment)
    run = None
    if payload.run is not None:
        run = lookups.by_id_or_uuid(deployment.runs.all(), "run", payload.run)
    fields = payload.model_dump(exclude={"deployment", "run"})
    return Status(201, services.finding_create(deployment=deployment, run=run, **fields))


@router.get("/findings", response=list[FindingOut])
@paginate(Page)
def finding_list(request, filters: Query[FindingFilter]):
    """Findings as the pages list them: dismissed last, then by severity, a charted finding
    before one without, newest first."""
    return matching(
        in_range(_findings(), filters),
        filters,
        "kind",
        "state",
        "severity",
        "source",
        deployment="deployment__name",
        run="run_id",
    )


@router.get("/findings/{ref}", response=FindingOut)
def finding_get(request, ref: str):
    return lookups.by_id(_findings(), "finding", ref)


@router.patch("/findings/{ref}", auth=PersonOnly(), response=FindingOut)
def finding_patch(request, ref: str, payload: FindingPatch):
    """Confirm, dismiss or reopen a finding; re-analysis keeps the state a person set."""
    finding = lookups.by_id(_findings(), "finding", ref)
    finding_set_state(finding=finding, state=payload.state, user=None)
    return finding


# --------------------------------------------------------------------------- plan items


class PlanItemIn(In):
    deployment: text(200, min_length=1) = Field(description="deployment id or name")
    title: text(300, min_length=1)
    status: PlanStatus = "pending"
    position: PosInt | None = Field(None, description="place in the plan, 0 first; default last")
    finding: PosInt | None = Field(None, description="finding id")
    note: NoteSlug | None = Field(None, description="slug of a note")
    provenance: text(300) = ""


class PlanItemPatch(Patch):
    title: text(300, min_length=1) | None = None
    status: PlanStatus | None = None
    position: PosInt | None = None


class PlanItemOut(Schema):
    id: int
    deployment: int = Field(alias="deployment_id")
    finding: int | None = Field(alias="finding_id")
    title: str
    status: str
    position: int
    note: str | None
    source: str
    provenance: str
    created: dt.datetime
    done_by: str | None = Field(
        description="uuid of the engine action that put its change in force"
    )

    @staticmethod
    def resolve_done_by(obj):
        return str(obj.done_by.uuid) if obj.done_by_id else None

    @staticmethod
    def resolve_note(obj):
        return obj.note.slug if obj.note_id else None


class PlanItemFilter(CreatedRange):
    deployment: text(200) | None = Field(None, description="deployment name")
    status: PlanStatus | None = None


@router.post("/plan-items", auth=PersonOnly(), response={201: PlanItemOut})
def plan_item_create(request, payload: PlanItemIn):
    deployment = lookups.get_deployment(payload.deployment)
    finding = note = None
    if payload.finding is not None:
        finding = lookups.by_id(deployment.findings.all(), "finding", payload.finding)
    if payload.note is not None:
        note = lookups.by_id_or_name(Note.objects.all(), "note", payload.note, field="slug")
    item = services.plan_item_add(
        deployment=deployment,
        title=payload.title,
        status=payload.status,
        finding=finding,
        note=note,
        provenance=payload.provenance,
    )
    if payload.position is not None:
        services.plan_item_update(item=item, position=payload.position)
    return Status(201, item)


@router.get("/plan-items", response=list[PlanItemOut])
@paginate(Page)
def plan_item_list(request, filters: Query[PlanItemFilter]):
    queryset = in_range(PlanItem.objects.select_related("note", "done_by"), filters)
    return matching(queryset, filters, "status", deployment="deployment__name")


@router.patch("/plan-items/{ref}", auth=PersonOnly(), response=PlanItemOut)
def plan_item_patch(request, ref: str, payload: PlanItemPatch):
    item = lookups.by_id(PlanItem.objects.select_related("note", "done_by"), "plan item", ref)
    services.plan_item_update(item=item, **payload.model_dump(exclude_unset=True))
    return item


# --------------------------------------------------------------------------- notes


class NoteIn(In):
    title: text(200, min_length=1)
    slug: NoteSlug | None = Field(None, description="default: from the title")
    body: LongText = Field("", description="Markdown")
    provenance: text(300) = ""


class NoteOut(Schema):
    id: int
    title: str
    slug: str
    body: str
    html: str = Field(description="the body rendered and sanitized")
    provenance: str
    created: dt.datetime
    updated: dt.datetime

    @staticmethod
    def resolve_html(obj):
        return obj.html()


@router.post("/notes", auth=PersonOnly(), response={200: NoteOut, 201: NoteOut})
def note_create(request, payload: NoteIn):
    """Add a note; the same slug with the same title and body is the existing note (200)."""
    fields = payload.model_dump(exclude={"slug"})
    note, created = services.note_create(**fields, slug=payload.slug or "")
    return stored(created, note)


@router.get("/notes", response=list[NoteOut])
@paginate(Page)
def note_list(request, filters: Query[CreatedRange]):
    return in_range(Note.objects.all(), filters)


@router.get("/notes/{slug}", response=NoteOut)
def note_get(request, slug: str):
    """A note by slug (or id)."""
    return lookups.by_id_or_name(Note.objects.all(), "note", slug, field="slug")
