"""Managed engines: launch recipes, engine actions (restart with changed arguments, apply a
kernel config, revert) and the heartbeats of the hosts' workers."""

import datetime as dt
from typing import Any
from uuid import UUID

from django.core.exceptions import PermissionDenied
from django.db import transaction
from ninja import Router, Schema, Status
from ninja.errors import HttpError
from pydantic import Field

from domain.wire.engines import ActionReport, Heartbeat
from moeops import permissions
from moeops.api import lookups
from moeops.api.auth import HostWrite, PersonOnly, require_host
from moeops.api.fields import In, PosInt, one_of, text
from moeops.engines import services
from moeops.engines.models import ACTION_KINDS, EngineAction
from moeops.fleet import services as fleet_services
from moeops.insights.models import PlanItem
from moeops.kernels.models import KernelConfig

router = Router(tags=["engines"])

# a bisection's steps are started by the bisection (POST /watch-runs/{id}/bisection)
ActionKind = one_of(ACTION_KINDS, but=("bisect", "restore"))


# Actions and recipes are people's decisions: a host's worker reports on them, never makes them.
PEOPLE_ONLY = PersonOnly(refusal="is a host's worker token: it may not change engines")


class HeartbeatOut(Schema):
    host: str
    worker_seen_at: dt.datetime


@router.post("/hosts/{ref}/heartbeat", auth=HostWrite(), response=HeartbeatOut)
def heartbeat(request, ref: str, payload: Heartbeat):
    """The host's worker is alive; what it says of itself replaces the last heartbeat's."""
    host = lookups.get_host(ref)
    require_host(request, host)
    fleet_services.host_heartbeat_record(host=host, status=payload.model_dump())
    return {"host": host.name, "worker_seen_at": host.worker_seen_at}


class RecipeIn(In):
    argv: list[text(4000, min_length=1)] = Field(
        min_length=1, max_length=512, description="the engine's command, no shell"
    )
    env: dict[text(200, min_length=1), text(4000)] = Field({}, max_length=256)
    cwd: text(500) = ""
    gpu_indices: list[PosInt] | None = Field(
        None, max_length=1024, description="default: the deployment's GPUs"
    )
    config_folder: text(500) = Field("", description="blank: a folder of the worker's cache")
    ready_timeout_s: float = Field(900.0, ge=1, le=2 * 3600)
    reason: text(300) = ""
    manage: bool = Field(True, description="mark the deployment managed (moeops starts it)")


class RecipeOut(Schema):
    id: int
    deployment: str = Field(alias="deployment.name")
    version: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    gpu_indices: list[int]
    config_folder: str
    kernel_configs: list[int]
    ready_timeout_s: float
    reason: str
    based_on: int | None = Field(description="version this one was made from")
    created: dt.datetime
    applied_at: dt.datetime | None
    failed_at: dt.datetime | None

    @staticmethod
    def resolve_kernel_configs(obj):
        return [config.pk for config in obj.kernel_configs.all()]

    @staticmethod
    def resolve_based_on(obj):
        return obj.based_on.version if obj.based_on_id else None


@router.post("/deployments/{ref}/launch-recipes", auth=PEOPLE_ONLY, response={201: RecipeOut})
def recipe_create(request, ref: str, payload: RecipeIn):
    """A new launch recipe version for the deployment; it runs from the next restart on."""
    deployment = lookups.get_deployment(ref)
    fields = payload.model_dump(exclude={"manage"})
    with transaction.atomic():
        recipe = services.recipe_create(
            deployment=deployment, author=permissions.API_TOKEN, **fields
        )
        if payload.manage and not deployment.is_managed:
            fleet_services.deployment_update(deployment=deployment, management="managed")
    return Status(201, recipe)


@router.get("/deployments/{ref}/launch-recipes", response=list[RecipeOut])
def recipe_list(request, ref: str):
    """The deployment's recipe versions, newest first."""
    deployment = lookups.get_deployment(ref)
    return deployment.launch_recipes.select_related("deployment", "based_on").prefetch_related(
        "kernel_configs"
    )


class ActionIn(In):
    kind: ActionKind
    changes: dict[text(100, min_length=3), text(1000) | None] = Field(
        {}, max_length=32, description='restart_with_args: {"--max-num-seqs": "64"}'
    )
    kernel_config: PosInt | None = Field(None, description="apply_config: the config's id")
    plan_item: PosInt | None = Field(None, description="the plan item the action carries out")
    resweep: bool = Field(True, description="repeat the newest finished sweep afterwards")


class ActionOut(Schema):
    uuid: UUID
    deployment: str = Field(alias="deployment.name")
    kind: str
    title: str
    status: str
    recipe_version: int = Field(alias="recipe.version")
    previous_recipe_version: int | None
    changes: dict[str, Any]
    kernel_config: int | None = Field(alias="kernel_config_id")
    plan_item: int | None = Field(alias="plan_item_id")
    before_run: UUID | None
    after_run: UUID | None
    steps: list[dict[str, Any]]
    progress: dict[str, Any] = Field(
        description="the heartbeat of the worker's delivery carrying it out: heartbeat, attempt"
    )
    observed: dict[str, Any]
    error: str
    log_tail: str
    source: str
    created: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @staticmethod
    def resolve_title(obj):
        return obj.title()

    @staticmethod
    def resolve_previous_recipe_version(obj):
        return obj.previous_recipe.version if obj.previous_recipe_id else None

    @staticmethod
    def resolve_before_run(obj):
        return obj.before_run.uuid if obj.before_run_id else None

    @staticmethod
    def resolve_after_run(obj):
        return obj.after_run.uuid if obj.after_run_id else None


def _actions():
    return EngineAction.objects.select_related(
        "deployment", "recipe", "previous_recipe", "before_run", "after_run", "kernel_config"
    )


@router.post("/deployments/{ref}/actions", auth=PEOPLE_ONLY, response={202: ActionOut})
def action_start(request, ref: str, payload: ActionIn):
    """Start an engine action on a managed deployment (202): a chain on its host's worker that
    restarts the engine and re-sweeps; follow it at /engine-actions/{uuid}."""
    deployment = lookups.get_deployment(ref)
    config = plan_item = None
    if payload.kernel_config is not None:
        config = lookups.by_id(KernelConfig.objects.all(), "kernel config", payload.kernel_config)
    if payload.plan_item is not None:
        plan_item = lookups.by_id(
            PlanItem.objects.filter(deployment=deployment), "plan item", payload.plan_item
        )
    try:
        action = services.engine_action_start(
            deployment=deployment,
            kind=payload.kind,
            user=permissions.API_TOKEN,
            source="api",
            changes=payload.changes,
            kernel_config=config,
            plan_item=plan_item,
            resweep=payload.resweep,
        )
    except PermissionDenied as exc:
        raise HttpError(403, str(exc)) from None
    return Status(202, _actions().get(pk=action.pk))


@router.get("/deployments/{ref}/actions", response=list[ActionOut])
def action_list(request, ref: str):
    """The deployment's engine actions, newest first."""
    deployment = lookups.get_deployment(ref)
    return _actions().filter(deployment=deployment)[:100]


@router.get("/engine-actions/{ref}", response=ActionOut)
def action_get(request, ref: str):
    return lookups.by_id_or_uuid(_actions(), "engine action", ref)


@router.patch("/engine-actions/{ref}", auth=HostWrite(), response=ActionOut)
def action_report(request, ref: str, payload: ActionReport):
    """The host's worker reports an action's steps and status (compare-and-set: 409 for a move
    the action cannot make)."""
    action = lookups.by_id_or_uuid(_actions(), "engine action", ref)
    require_host(request, action.deployment.host)
    try:
        services.engine_action_report(action=action, **payload.model_dump(exclude_unset=True))
    except services.ActionConflict as exc:
        raise HttpError(409, str(exc)) from None
    return _actions().get(pk=action.pk)
