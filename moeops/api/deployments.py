"""The deployments of /api/v1: a model served by an engine on a host's GPUs, and its health
checks."""

import datetime as dt
from typing import Annotated, Any
from uuid import UUID

from ninja import Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import Field

from moeops import permissions
from moeops.api import lookups
from moeops.api.auth import HostWrite, PersonOnly, require_host
from moeops.api.fields import (
    CreatedRange,
    EpochSeconds,
    In,
    JsonObject,
    Name,
    Patch,
    PosInt,
    RequestCap,
    SmallInt,
    in_range,
    matching,
    one_of,
    text,
)
from moeops.api.openapi import may_answer
from moeops.api.paging import Page
from moeops.api.responses import HostTaskQueued, queued, stored
from moeops.fleet import services
from moeops.fleet.models import (
    CHECK_TRIGGERS,
    DEPLOYMENT_STATUSES,
    ENGINES,
    GPU,
    HEALTH_STATUSES,
    Deployment,
    SLOProfile,
)

router = Router(tags=["fleet"])

DeploymentStatus = one_of(DEPLOYMENT_STATUSES)
Engine = one_of(ENGINES)
HealthStatus = one_of(HEALTH_STATUSES)
CheckTrigger = one_of(CHECK_TRIGGERS)


def fleet_operation(name):
    """An operation id as the fleet's other routes have theirs (moeops_api_fleet_…): clients
    generated from the schema call a route by its id, whichever module holds it."""
    return f"moeops_api_fleet_{name}"


class DeploymentFields(In):
    engine_version: text(100) = ""
    max_running_requests: RequestCap | None = None
    quantization: text(50) = ""
    attention_backend: text(50) = ""
    allreduce_fusion: bool | None = None
    launch_args: JsonObject = Field({}, description="Other launch arguments, flag → value")
    endpoint_url: text(200) = ""
    served_model_name: text(200) = ""
    engine_log: text(500) = Field(
        "", description="an external engine's start-up log on its host, for its engine paths"
    )
    status: DeploymentStatus = "planned"
    status_detail: text(300) = ""
    default_slo_profile: text(200) | None = Field(None, description="SLO profile id or name")


class DeploymentIn(DeploymentFields):
    name: Name
    model: text(200, min_length=1) = Field(description="model id or name")
    host: text(100, min_length=1) = Field(description="host id or name")
    gpus: list[SmallInt] = Field([], max_length=1024, description="GPU indexes on the host")
    engine: Engine = "sglang"
    # Field(1, ge=1) on SmallInt would lose ge=1 to SmallInt's own ge=0
    tp: Annotated[SmallInt, Field(ge=1)] = 1
    ep: Annotated[SmallInt, Field(ge=1)] = 1
    provenance: text(300) = ""


class DeploymentPatch(Patch):
    NULLABLE = ("max_running_requests", "allreduce_fusion", "default_slo_profile")

    engine_version: text(100) | None = None
    max_running_requests: RequestCap | None = None
    quantization: text(50) | None = None
    attention_backend: text(50) | None = None
    allreduce_fusion: bool | None = None
    launch_args: JsonObject | None = None
    endpoint_url: text(200) | None = None
    served_model_name: text(200) | None = None
    engine_log: text(500) | None = None
    status: DeploymentStatus | None = None
    status_detail: text(300) | None = None
    default_slo_profile: text(200) | None = Field(
        None, description="SLO profile id or name; null: none"
    )


class DeploymentOut(Schema):
    id: int
    name: str
    model: str
    host: str
    gpus: list[int]
    engine: str
    engine_version: str
    tp: int
    ep: int
    max_running_requests: int | None
    quantization: str
    attention_backend: str
    allreduce_fusion: bool | None
    launch_args: dict[str, Any]
    endpoint_url: str
    served_model_name: str
    engine_log: str
    management: str = Field(description="managed: moeops starts and stops the engine")
    status: str
    status_detail: str
    status_checked_at: dt.datetime | None
    default_slo_profile: str | None = Field(description="the SLO profile's name")
    provenance: str
    created: dt.datetime
    updated: dt.datetime

    @staticmethod
    def resolve_model(obj):
        return obj.model.name

    @staticmethod
    def resolve_default_slo_profile(obj):
        profile = obj.default_slo_profile
        return profile.name if profile else None

    @staticmethod
    def resolve_host(obj):
        return obj.host.name

    @staticmethod
    def resolve_gpus(obj):
        return [gpu.index for gpu in obj.gpus.all()]


class DeploymentFilter(CreatedRange):
    host: text(200) | None = Field(None, description="host name")
    model: text(200) | None = Field(None, description="model name")
    status: DeploymentStatus | None = None
    engine: Engine | None = None


def _deployments():
    return Deployment.objects.select_related(
        "model", "host", "default_slo_profile"
    ).prefetch_related("gpus")


def _with_profile(fields):
    """fields with default_slo_profile (an id or name) as its SLOProfile row (404 if none)."""
    if fields.get("default_slo_profile") is not None:
        fields["default_slo_profile"] = lookups.by_id_or_name(
            SLOProfile.objects.all(), "SLO profile", fields["default_slo_profile"]
        )
    return fields


@router.post(
    "/deployments",
    auth=PersonOnly(),
    response={200: DeploymentOut, 201: DeploymentOut},
    operation_id=fleet_operation("deployment_create"),
)
def deployment_create(request, payload: DeploymentIn):
    """Register a deployment (idempotent by name: an existing one is returned unchanged)."""
    fields = _with_profile(payload.model_dump())
    model = lookups.get_model(fields.pop("model"))
    host = lookups.get_host(fields.pop("host"))
    try:
        deployment, created = services.deployment_create(
            model=model,
            host=host,
            gpu_indexes=fields.pop("gpus"),
            user=permissions.API_TOKEN,
            **fields,
        )
    except GPU.DoesNotExist:
        raise HttpError(400, f"gpus: host {host.name!r} lacks one of {payload.gpus}") from None
    return stored(created, _deployments().get(pk=deployment.pk))


@router.get(
    "/deployments", response=list[DeploymentOut], operation_id=fleet_operation("deployment_list")
)
@paginate(Page)
def deployment_list(request, filters: Query[DeploymentFilter]):
    return matching(
        in_range(_deployments(), filters),
        filters,
        "status",
        "engine",
        host="host__name",
        model="model__name",
    )


@router.get(
    "/deployments/{ref}", response=DeploymentOut, operation_id=fleet_operation("deployment_get")
)
def deployment_get(request, ref: str):
    """A deployment by id or name."""
    return lookups.by_id_or_name(_deployments(), "deployment", ref)


@router.patch(
    "/deployments/{ref}",
    auth=HostWrite(),
    response=DeploymentOut,
    operation_id=fleet_operation("deployment_patch"),
)
def deployment_patch(request, ref: str, payload: DeploymentPatch):
    """Change launch details or record a health check (status, status_detail)."""
    deployment = lookups.get_deployment(ref)
    require_host(request, deployment.host)
    fields = _with_profile(payload.model_dump(exclude_unset=True))
    if not fields:
        raise HttpError(400, "body: nothing to change")
    services.deployment_update(deployment=deployment, user=permissions.API_TOKEN, **fields)
    return _deployments().get(pk=deployment.pk)


@router.post(
    "/deployments/{ref}/check",
    auth=HostWrite(),
    response={202: HostTaskQueued},
    operation_id=fleet_operation("deployment_check"),
)
@may_answer(503)
def deployment_check(request, ref: str):
    """Ask the host's worker to check the deployment's engine now (`workers.check_deployment`);
    the check arrives in /deployments/{ref}/health-checks and sets the status."""
    deployment = lookups.get_deployment(ref)
    require_host(request, deployment.host)
    return queued(
        "workers.check_deployment",
        deployment.host,
        lambda: services.deployment_check_enqueue(deployment=deployment, trigger="api"),
    )


class HealthCheckIn(In):
    """A check of the deployment's engine, as workers.engine_check.check_engine reports it."""

    uuid: UUID | None = Field(
        None, description="chosen by the worker so that a retried push stores one check"
    )
    checked_at: EpochSeconds | None = Field(None, description="UTC epoch s; default now")
    trigger: CheckTrigger = "api"
    status: HealthStatus
    up: bool | None = Field(None, description="the engine answered; default: status not failed")
    detail: text(300) = ""
    latency_ms: float | None = Field(None, ge=0, le=1e9, description="ms")
    engine: text(50) | None = Field(None, description="the engine that answered")
    version: text(100) | None = None
    models: list[text(300)] = Field([], max_length=1024, description="model ids it serves")
    max_running_requests: PosInt | None = None


class HealthCheckOut(Schema):
    id: int
    uuid: UUID
    deployment: str
    checked_at: dt.datetime
    trigger: str
    status: str
    up: bool
    detail: str
    latency_ms: float | None
    engine: str
    version: str
    models: list[str]
    max_running_requests: int | None

    @staticmethod
    def resolve_deployment(obj):
        return obj.deployment.name

    @staticmethod
    def resolve_models(obj):
        return obj.served_models


@router.post(
    "/deployments/{ref}/health-checks",
    auth=HostWrite(),
    response={200: HealthCheckOut, 201: HealthCheckOut},
    operation_id=fleet_operation("health_check_record"),
)
def health_check_record(request, ref: str, payload: HealthCheckIn):
    """Add a check to the deployment's history (201); the newest check sets its status. A uuid
    seen before answers that check (200)."""
    deployment = lookups.get_deployment(ref)
    require_host(request, deployment.host)
    fields = payload.model_dump(exclude={"uuid", "models"})
    check, created = services.health_check_record(
        deployment=deployment, check_uuid=payload.uuid, served_models=payload.models, **fields
    )
    return stored(created, check)


@router.get(
    "/deployments/{ref}/health-checks",
    response=list[HealthCheckOut],
    operation_id=fleet_operation("health_check_list"),
)
@paginate(Page)
def health_check_list(request, ref: str, filters: Query[CreatedRange]):
    """The deployment's checks, newest first; the date range applies to checked_at."""
    deployment = lookups.get_deployment(ref)
    return in_range(deployment.health_checks.select_related("deployment"), filters, "checked_at")
