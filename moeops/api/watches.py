"""Watches, their runs and baselines, alert channels and alerts. A webhook's URL is never
shown back: the API answers with its scheme and host only."""

import datetime as dt
from typing import Any, Literal

from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import Field

from moeops import permissions
from moeops.api import lookups
from moeops.api.auth import PersonOnly
from moeops.api.fields import In, JsonObject, Name, Patch, PosInt, one_of, text
from moeops.api.openapi import may_answer
from moeops.api.paging import Page
from moeops.fleet.models import Deployment, SLOProfile
from moeops.watches import bisection, services
from moeops.watches.models import (
    ALERT_STATUSES,
    Alert,
    AlertChannel,
    Bisection,
    Watch,
    WatchRun,
)

router = Router(tags=["watches"])

# A watch starts sweeps and sends messages: a person's decision, not a host worker's.
WATCH_WRITE = PersonOnly(refusal="is a host's worker token: it may not change watches or alerts")


class Schedule(In):
    cron: text(200) | None = None
    every_hours: PosInt | None = None


class WatchIn(In):
    deployment: text(200, min_length=1) = Field(description="deployment id or name")
    name: Name
    kind: Literal["sweep", "capacity"] = "sweep"
    parameters: JsonObject
    slo_profile: text(200) | None = Field(None, description="SLO profile id or name")
    schedule: Schedule
    window_start: dt.time | None = None
    window_end: dt.time | None = None
    enabled: bool = True
    bisect_on_regression: bool = False


class WatchPatch(Patch):
    NULLABLE = ("slo_profile", "window_start", "window_end")

    name: Name | None = None
    parameters: JsonObject | None = None
    slo_profile: text(200) | None = Field(None, description="SLO profile id or name")
    schedule: Schedule | None = None
    window_start: dt.time | None = None
    window_end: dt.time | None = None
    enabled: bool | None = None
    bisect_on_regression: bool | None = None


class WatchOut(Schema):
    id: int
    deployment: int = Field(alias="deployment_id")
    deployment_name: str = Field(alias="deployment.name")
    name: str
    kind: str
    parameters: dict[str, Any]
    slo_profile: int | None = Field(alias="slo_profile_id")
    schedule: str
    next_run_at: dt.datetime | None
    window_start: dt.time | None
    window_end: dt.time | None
    enabled: bool
    bisect_on_regression: bool
    baseline: int | None = Field(alias="baseline_id")
    created: dt.datetime

    @staticmethod
    def resolve_schedule(obj):
        return obj.schedule_label()

    @staticmethod
    def resolve_next_run_at(obj):
        return obj.next_run_at(dt.datetime.now(dt.UTC))


class WatchRunOut(Schema):
    id: int
    watch: int = Field(alias="watch_id")
    run: str | None
    status: str
    reason: str
    verdict: str
    figure: float | None
    interval: list[float] | None
    baseline_figure: float | None
    baseline_interval: list[float] | None
    compared_with: str | None
    changes: list[str]
    bisections: list[int]
    fired_at: dt.datetime
    finished_at: dt.datetime | None

    @staticmethod
    def resolve_bisections(obj):
        return [b.pk for b in obj.bisections.all()]

    @staticmethod
    def resolve_run(obj):
        return str(obj.run.uuid) if obj.run_id else None

    @staticmethod
    def resolve_compared_with(obj):
        return str(obj.compared_with.uuid) if obj.compared_with_id else None


class BisectionStepOut(Schema):
    number: int
    keys: list[str]
    tried: list[str]
    action: str
    run: str | None
    outcome: str
    figure: float | None
    interval: list[float] | None
    detail: str
    measures: int

    @staticmethod
    def resolve_tried(obj):
        return obj.bisection.phrases(obj.keys)

    @staticmethod
    def resolve_action(obj):
        return str(obj.action.uuid)

    @staticmethod
    def resolve_run(obj):
        run = obj.judged_run
        return str(run.uuid) if run is not None else None


class BisectionOut(Schema):
    id: int
    watch_run: int = Field(alias="watch_run_id")
    deployment: int = Field(alias="deployment_id")
    status: str
    source: str
    factors: list[dict[str, Any]]
    fixed: list[dict[str, Any]]
    cause: list[str]
    finding: str
    steps: list[BisectionStepOut]
    restore_action: str | None
    url: str
    created: dt.datetime
    finished_at: dt.datetime | None

    @staticmethod
    def resolve_cause(obj):
        return obj.phrases(obj.cause)

    @staticmethod
    def resolve_steps(obj):
        return list(obj.steps.select_related("action__after_run", "run", "bisection"))

    @staticmethod
    def resolve_restore_action(obj):
        return str(obj.restore_action.uuid) if obj.restore_action_id else None

    @staticmethod
    def resolve_url(obj):
        return obj.get_absolute_url()


class ChannelIn(In):
    name: Name
    kind: Literal["webhook", "email"]
    url: text(500) = ""
    recipients: list[text(254)] = []
    deployment: text(200) | None = Field(None, description="deployment id or name")
    enabled: bool = True


class ChannelPatch(Patch):
    url: text(500) | None = None
    recipients: list[text(254)] | None = None
    enabled: bool | None = None


class ChannelOut(Schema):
    id: int
    name: str
    kind: str
    url: str
    recipients: list[str]
    deployment: int | None = Field(alias="deployment_id")
    enabled: bool

    @staticmethod
    def resolve_url(obj):
        return obj.masked_url()


class AttemptOut(Schema):
    number: int
    at: dt.datetime
    ok: bool
    status_code: int | None
    answer: str
    error: str


class AlertOut(Schema):
    id: int
    watch_run: int = Field(alias="watch_run_id")
    channel: str = Field(alias="channel.name")
    kind: str
    subject: str
    text: str
    status: str
    error: str
    created: dt.datetime
    delivered_at: dt.datetime | None
    attempts: list[AttemptOut]

    @staticmethod
    def resolve_attempts(obj):
        return list(obj.attempts.all())


class AlertFilter(Schema):
    status: one_of(ALERT_STATUSES) | None = None


def _deployment(ref):
    return lookups.by_id_or_name(Deployment.objects.select_related("host"), "deployment", ref)


def _profile(ref):
    if ref is None:
        return None
    return lookups.by_id_or_name(SLOProfile.objects.all(), "SLO profile", ref)


def _watches():
    return Watch.objects.select_related(
        "deployment", "periodic_task__crontab", "periodic_task__interval"
    )


@router.post("/watches", auth=WATCH_WRITE, response={201: WatchOut})
def watch_create(request, payload: WatchIn):
    """A watch on a deployment with its schedule: {"cron": "0 3 * * *"} (UTC) or
    {"every_hours": 6}; parameters as a sweep's load (rounds default 4)."""
    watch = services.watch_create(
        deployment=_deployment(payload.deployment),
        name=payload.name,
        kind=payload.kind,
        parameters=payload.parameters,
        slo_profile=_profile(payload.slo_profile),
        window_start=payload.window_start,
        window_end=payload.window_end,
        enabled=payload.enabled,
        bisect_on_regression=payload.bisect_on_regression,
        **payload.schedule.model_dump(),
    )
    return Status(201, _watches().get(pk=watch.pk))


@router.get("/watches", response=list[WatchOut])
@may_answer(404)
@paginate(Page)
def watch_list(request, deployment: str | None = None):
    watches = _watches()
    if deployment is not None:
        watches = watches.filter(deployment=_deployment(deployment))
    return watches


@router.get("/watches/{ref}", response=WatchOut)
def watch_get(request, ref: str):
    return lookups.by_id(_watches(), "watch", ref)


@router.patch("/watches/{ref}", auth=WATCH_WRITE, response=WatchOut)
def watch_patch(request, ref: str, payload: WatchPatch):
    """Change a watch; a schedule given replaces the one stored."""
    watch = lookups.by_id(_watches(), "watch", ref)
    fields = payload.model_dump(exclude_unset=True)
    if not fields:
        raise HttpError(400, "body: nothing to change")
    schedule = fields.pop("schedule", None) or {}
    if "slo_profile" in fields:
        fields["slo_profile"] = _profile(fields["slo_profile"])
    services.watch_update(watch=watch, **schedule, **fields)
    return _watches().get(pk=watch.pk)


@router.get("/watches/{ref}/runs", response=list[WatchRunOut])
@paginate(Page)
def watch_runs(request, ref: str):
    watch = lookups.by_id(Watch.objects.all(), "watch", ref)
    return watch.watch_runs.select_related("run", "compared_with").prefetch_related("bisections")


@router.post("/watch-runs/{ref}/baseline", auth=WATCH_WRITE, response=WatchOut)
def watch_run_baseline(request, ref: str):
    """Mark a finished watch run its watch's baseline: the next runs are compared with it."""
    watch_run = lookups.by_id(WatchRun.objects.select_related("watch"), "watch run", ref)
    watch = services.watch_mark_baseline(watch_run=watch_run, user=None)
    return _watches().get(pk=watch.pk)


@router.post("/watch-runs/{ref}/bisection", auth=WATCH_WRITE, response={201: BisectionOut})
def watch_run_bisect(request, ref: str):
    """Find the cause of a regressed watch run (managed deployments): the engine is restarted
    with the baseline's value of one factor at a time (or halves of them), each try re-swept with
    the watch's load, then back on the recipe in force. 400 with a sentence when it cannot start
    (no regression, external, nothing differs, the host busy)."""
    watch_run = lookups.by_id(
        WatchRun.objects.select_related("watch__deployment__host", "run", "compared_with"),
        "watch run",
        ref,
    )
    return Status(
        201,
        bisection.bisection_start(watch_run=watch_run, user=permissions.API_TOKEN, source="api"),
    )


@router.get("/bisections/{ref}", response=BisectionOut)
def bisection_get(request, ref: str):
    return lookups.by_id(Bisection.objects.all(), "bisection", ref)


@router.post("/alert-channels", auth=WATCH_WRITE, response={201: ChannelOut})
def channel_create(request, payload: ChannelIn):
    """A webhook (its host in MOEOPS_WEBHOOK_ALLOWLIST) or email channel; without a
    deployment it takes every deployment's alerts."""
    data = payload.model_dump()
    deployment = data.pop("deployment")
    channel = services.channel_create(
        **data, deployment=_deployment(deployment) if deployment is not None else None
    )
    return Status(201, channel)


@router.get("/alert-channels", response=list[ChannelOut])
@paginate(Page)
def channel_list(request):
    return AlertChannel.objects.all()


@router.patch("/alert-channels/{ref}", auth=WATCH_WRITE, response=ChannelOut)
def channel_patch(request, ref: str, payload: ChannelPatch):
    channel = lookups.by_id_or_name(AlertChannel.objects.all(), "alert channel", ref)
    fields = payload.model_dump(exclude_unset=True)
    if not fields:
        raise HttpError(400, "body: nothing to change")
    return services.channel_update(channel=channel, **fields)


@router.get("/alerts", response=list[AlertOut])
@paginate(Page)
def alert_list(request, filters: Query[AlertFilter]):
    """Alerts, newest first, each with its delivery attempts; ?status=failed: undelivered."""
    alerts = Alert.objects.select_related("channel").prefetch_related("attempts")
    if filters.status is not None:
        alerts = alerts.filter(status=filters.status)
    return alerts
