"""Writes to managed engines: launch recipe versions, engine actions (started here, reported by
the host's worker, finished when their re-sweep does), and failing actions whose worker is lost.

An action is one Celery chain on the deployment's host queue (`send_host_chain`):
`workers.engine_action` (write the recipe's kernel configs, restart the engine with the recipe,
the previous one again when it does not come up, check what the engine reports) and, when the
deployment has a finished sweep to repeat, `workers.run_sweep` with that sweep's load into a run
created here. The chain stops when the restart fails; the run is then cancelled.
"""

import contextlib
import logging

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from domain.launch import PROFILER_FLAG, FlagError, check_values, profiler_flag_value, set_flags
from domain.numbers import is_integer
from moeops import jobs, permissions
from moeops.celery import send_host_chain
from moeops.engines.models import EngineAction, LaunchRecipe
from moeops.fleet.models import Deployment
from moeops.insights import services as insights_services
from moeops.insights.models import PlanItem
from moeops.kernels.models import KernelConfig
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from moeops.runs.workloads import sweep_task_kwargs
from tuning.config_files import ConfigFileError

log = logging.getLogger(__name__)


class ActionConflict(Exception):
    """The action cannot move there from where it is (compare-and-set)."""


# --------------------------------------------------------------------------- recipes


def _check_recipe(deployment, argv, env, gpu_indices, ready_timeout_s):
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise ValidationError({"argv": "the engine's command as a list of non-empty strings"})
    try:
        check_values(argv)
    except FlagError as exc:
        raise ValidationError({"argv": str(exc)}) from None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()
    ):
        raise ValidationError({"env": "variables as name → text value"})
    if not isinstance(gpu_indices, list) or not all(is_integer(i) and i >= 0 for i in gpu_indices):
        raise ValidationError({"gpu_indices": "GPU indices as a list of integers ≥ 0"})
    known = {gpu.index for gpu in deployment.host.gpus.all()}
    missing = sorted(set(gpu_indices) - known) if known else []
    if missing:
        raise ValidationError(
            {"gpu_indices": f"host {deployment.host.name} has no GPU {missing[0]}"}
        )
    if not 1 <= ready_timeout_s <= 2 * 3600:
        raise ValidationError({"ready_timeout_s": "between 1 s and 2 h"})


def recipe_create(
    *,
    deployment,
    argv,
    author,
    env=None,
    cwd="",
    gpu_indices=None,
    config_folder="",
    ready_timeout_s=900.0,
    kernel_configs=(),
    reason="",
    based_on=None,
):
    """The deployment's next launch recipe version (it runs from the next restart on).

    author: the staff member who changes it, or permissions.API_TOKEN (a token with write access
    to the deployment, checked by the caller) or permissions.MOEOPS (a bisection's try); only a
    person is recorded. gpu_indices default to the deployment's GPUs. Raises PermissionDenied
    for anyone else (None included) and ValidationError naming the field.
    """
    permissions.require_engine_change(author)
    env = {} if env is None else env
    gpu_indices = deployment.gpu_indices() if gpu_indices is None else gpu_indices
    _check_recipe(deployment, argv, env, gpu_indices, ready_timeout_s)
    with transaction.atomic():
        # the deployment's row serializes version numbers
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        last = deployment.launch_recipes.aggregate(v=Max("version"))["v"] or 0
        recipe = LaunchRecipe.objects.create(
            deployment=deployment,
            version=last + 1,
            argv=list(argv),
            env=dict(env),
            cwd=cwd,
            gpu_indices=list(gpu_indices),
            config_folder=config_folder,
            ready_timeout_s=ready_timeout_s,
            reason=reason,
            author=permissions.person(author),
            based_on=based_on,
        )
        recipe.kernel_configs.set(kernel_configs)
    return recipe


def recipe_newest(deployment):
    return deployment.launch_recipes.order_by("-version").first()


def recipe_content(recipe):
    """What starting a recipe depends on, as recipe_create takes it."""
    return {
        "argv": recipe.argv,
        "env": recipe.env,
        "cwd": recipe.cwd,
        "gpu_indices": recipe.gpu_indices,
        "config_folder": recipe.config_folder,
        "ready_timeout_s": recipe.ready_timeout_s,
        "kernel_configs": list(recipe.kernel_configs.all()),
    }


def recipe_derive(base, *, author, reason, **changes):
    """A new version of base's recipe with changes (argv, kernel_configs, …), based on base."""
    fields = {**recipe_content(base), **changes}
    return recipe_create(
        deployment=base.deployment, author=author, reason=reason, based_on=base, **fields
    )


# --------------------------------------------------------------------------- actions


def _kernel_files(recipe, engine):
    """The files the recipe's config folder holds: [{"file_name", "text"}] in the engine's
    format and name; a vLLM config with a `_down` file brings both (KernelConfig.files)."""
    return [
        {"file_name": name, "text": text}
        for config in recipe.kernel_configs.order_by("pk")
        for name, text in config.files(engine)
    ]


def _worker_recipe(recipe, deployment):
    """The recipe as workers.engine_supervisor.Recipe takes it."""
    return {
        "deployment": deployment.pk,
        "version": recipe.version,
        "argv": recipe.argv,
        "base_url": deployment.endpoint_url,
        "env": recipe.env,
        "cwd": recipe.cwd or None,
        "gpu_indices": recipe.gpu_indices,
        "config_env": recipe.config_env,
        "config_folder": recipe.config_folder or None,
        "ready_timeout_s": recipe.ready_timeout_s,
        "kernel_files": _kernel_files(recipe, deployment.engine),
    }


def _check_config(kernel_config, deployment):
    """ValidationError unless the engine would load kernel_config for the deployment's shape."""
    shape = deployment.kernel_shape()
    if shape is None or shape.get("dtype") is None:
        reason = (shape or {}).get("reason") or "its MoE shape cannot be read"
        raise ValidationError({"kernel_config": f"{deployment} loads no kernel config: {reason}"})
    try:
        name = kernel_config.file_name(deployment.engine)
    except ConfigFileError as exc:
        raise ValidationError({"kernel_config": str(exc)}) from None
    loaded = KernelConfig.objects.for_shape(shape, engine=deployment.engine)
    if not loaded.filter(pk=kernel_config.pk).exists():
        wanted = KernelConfig(
            device_name=shape["device_name"] or "",
            E=shape["E"],
            N=shape["N"],
            dtype=shape["dtype"],
            block_shape=shape["block_shape"],
            down_moe=kernel_config.down_moe,
        ).file_name(deployment.engine)
        raise ValidationError(
            {"kernel_config": f"{deployment}'s engine loads {wanted}, not {name}"}
        )


def _with_profiler(base, deployment, user):
    """A new version of base whose vLLM serves its torch profiler (domain.launch's
    --profiler-config) and the /server_info that names its folder to the worker."""
    if deployment.engine != "vllm":
        raise ValidationError(
            {"kind": f"moeops profiles vLLM's steps; {deployment} runs {deployment.engine}"}
        )
    argv = set_flags(base.argv, {PROFILER_FLAG: profiler_flag_value()})
    env = {**(base.env or {}), "VLLM_SERVER_DEV_MODE": "1"}
    if argv == base.argv and env == base.env:
        raise ValidationError({"kind": f"recipe v{base.version} already runs with the profiler"})
    reason = "restart with profiling available"
    return recipe_derive(base, author=user, reason=reason, argv=argv, env=env)


def _new_recipe(*, deployment, kind, user, changes, kernel_config, recipe=None):
    """(recipe to bring up, the one in force) for an action of this kind."""
    in_force = deployment.recipe_in_force()
    if kind in ("bisect", "restore"):
        # the bisection made the version it tries (moeops.watches.bisection)
        if recipe is None or recipe.deployment_id != deployment.pk:
            raise ValidationError({"recipe": f"which recipe of {deployment} to bring up"})
        return recipe, in_force
    newest = recipe_newest(deployment)
    base = in_force or newest
    if base is None:
        raise ValidationError(
            {"recipe": f"{deployment} has no launch recipe yet: a staff member adds one"}
        )
    if kind == "restart":
        return newest, in_force
    if kind == "restart_with_args":
        if not isinstance(changes, dict) or not changes:
            raise ValidationError({"changes": "which flags to change, e.g. --max-num-seqs: 64"})
        try:
            argv = set_flags(base.argv, changes)
        except FlagError as exc:
            raise ValidationError({"changes": str(exc)}) from None
        if argv == base.argv:
            raise ValidationError({"changes": f"recipe v{base.version} already runs with that"})
        flags = ", ".join(f"{flag} {value}" for flag, value in changes.items())
        return recipe_derive(base, author=user, reason=f"restart with {flags}", argv=argv), in_force
    if kind == "restart_with_profiler":
        return _with_profiler(base, deployment, user), in_force
    if kind == "apply_config":
        if kernel_config is None:
            raise ValidationError({"kernel_config": "which kernel config to apply"})
        _check_config(kernel_config, deployment)
        name = kernel_config.file_name(deployment.engine)
        configs = [c for c in base.kernel_configs.all() if c.file_name(deployment.engine) != name]
        return (
            recipe_derive(
                base,
                author=user,
                reason=f"apply {kernel_config}",
                kernel_configs=[*configs, kernel_config],
            ),
            in_force,
        )
    if kind == "revert":
        target = in_force.based_on if in_force is not None else None
        if target is None:
            raise ValidationError({"kind": "no earlier recipe was in force: nothing to revert to"})
        reason = f"revert to v{target.version}"
        return recipe_derive(
            in_force, author=user, reason=reason, **recipe_content(target)
        ), in_force
    raise ValidationError({"kind": f"unknown action {kind!r}"})


def _last_sweep(deployment):
    """The deployment's newest finished sweep by a worker, whose load a re-sweep repeats."""
    return (
        SweepRun.objects.filter(deployment=deployment, source="worker", status="succeeded")
        .order_by("-created", "-id")
        .first()
    )


def engine_action_start(
    *,
    deployment,
    kind,
    user,
    source="page",
    changes=None,
    kernel_config=None,
    plan_item=None,
    resweep=True,
    recipe=None,
    before_run=None,
):
    """A queued EngineAction of a managed deployment, its chain sent to the host's worker once
    committed.

    kind: restart (the newest recipe), restart_with_args (changes: flag → value on the recipe in
    force), apply_config (kernel_config into the engine's config folder), revert (the recipe in
    force before the current one), bisect and restore (recipe: the version a bisection made).
    Each of the first four but restart makes a new recipe version. With resweep, before_run
    (default: the deployment's newest finished sweep) is repeated with the same load afterwards
    (its run created queued here, linked as after_run). plan_item is set in progress (done when the
    re-sweep succeeds). user: staff, permissions.API_TOKEN (a token with write access) or
    permissions.MOEOPS (a watch's bisection, a plan item's tune, a command).

    Raises PermissionDenied for anyone else (None included) and ValidationError naming the
    field: an external
    deployment, a host whose worker is gone, an action already in flight, a bad change.
    """
    permissions.require_engine_change(user)
    if not deployment.is_managed:
        raise ValidationError(
            {"deployment": f"{deployment} is external: moeops never starts or stops its engine"}
        )
    absence = deployment.host.worker_absence()
    if absence:
        raise ValidationError({"host": absence})
    with transaction.atomic():
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        busy = deployment.engine_actions.filter(status__in=jobs.ACTION_IN_FLIGHT).first()
        if busy is not None:
            raise ValidationError(
                {"deployment": f"{busy.title()} is still {busy.get_status_display().lower()}"}
            )
        if plan_item is not None:
            try:
                insights_services.plan_item_transition(item=plan_item, status="in_progress")
            except ValidationError as exc:
                raise ValidationError({"plan_item": exc.messages}) from None
        recipe, previous = _new_recipe(
            deployment=deployment,
            kind=kind,
            user=user,
            changes=changes,
            kernel_config=kernel_config,
            recipe=recipe,
        )
        before = (before_run or _last_sweep(deployment)) if resweep else None
        action = EngineAction.objects.create(
            deployment=deployment,
            kind=kind,
            recipe=recipe,
            previous_recipe=previous,
            changes=dict(changes or {}) if kind in ("restart_with_args", "bisect") else {},
            kernel_config=kernel_config if kind == "apply_config" else None,
            plan_item=plan_item,
            before_run=before,
            requested_by=permissions.person(user),
            source=source,
        )
        steps = [("engine_action", _action_kwargs(action, recipe, previous, deployment))]
        if before is not None:
            after, parameters = _resweep(action, before, deployment)
            steps.append(("run_sweep", sweep_task_kwargs(after.uuid, parameters)))
        _enqueue(action, deployment.host, steps)
    return action


def _action_kwargs(action, recipe, previous, deployment):
    return {
        "action_uuid": str(action.uuid),
        "host": deployment.host.name,
        "engine": deployment.engine,
        "model": deployment.request_model_name,
        "kind": action.kind,
        "recipe": _worker_recipe(recipe, deployment),
        "previous": _worker_recipe(previous, deployment) if previous is not None else None,
        "changes": action.changes,
        "kernel_shape": deployment.kernel_shape(),
        "resweep": action.before_run_id is not None,
    }


def _resweep(action, before, deployment):
    """The queued run that repeats before's load after the action, and its sweep's parameters."""
    load = run_services.repeated_load(before.parameters)
    parameters = run_services.sweep_parameters(deployment=deployment, load=load)
    after, _ = run_services.run_create(
        deployment=deployment,
        label=_resweep_label(action, deployment),
        parameters=parameters,
        source="worker",
        topology_snapshot=deployment.host.current_topology(),
        recipe=action.recipe,
    )
    EngineAction.objects.filter(pk=action.pk).update(after_run=after)
    action.after_run = after
    return after, parameters


def _resweep_label(action, deployment):
    """The re-sweep's name: the change it measures, once ("Restart with --max-num-seqs 32
    (recipe v3)"), numbered when a run of the deployment already has it (the same recipe
    restarted again), so that no two runs share a name."""
    version = action.recipe.version
    if action.kind == "restart":
        name = f"Restart with recipe v{version}"
    else:
        name = f"{action.title()} (recipe v{version})"
    name = name[:190]
    taken = SweepRun.objects.filter(
        Q(label=name) | Q(label__startswith=f"{name} #"), deployment=deployment
    ).count()
    return f"{name} #{taken + 1}" if taken else name


def _enqueue(action, host, steps):
    jobs.enqueue(action, lambda: send_host_chain(host, steps), what="the action", fail=_fail)


def _move(action, status, **fields):
    """Move action to status with fields (moeops.jobs.transition); the same status again
    writes only the fields. Raises ActionConflict for a move the action cannot make."""
    if action.status == status:
        if fields:
            EngineAction.objects.filter(pk=action.pk).update(**fields)
            for key, value in fields.items():
                setattr(action, key, value)
        return action
    if not jobs.transition(action, status, **fields):
        raise ActionConflict(f"action {action.uuid} is {action.status}; it cannot become {status}")
    return action


def _fail(action, error, **fields):
    """End the action failed: its recipe did not come up, its re-sweep is cancelled, its plan
    item is pending again (nothing was applied)."""
    with transaction.atomic():
        _move(action, "failed", error=error, **fields)
        if action.recipe.applied_at is None:
            LaunchRecipe.objects.filter(pk=action.recipe_id).update(failed_at=timezone.now())
        if action.after_run_id:
            run = SweepRun.objects.get(pk=action.after_run_id)
            if run.status == "queued":
                run_services.run_transition(
                    run=run, status="cancelled", error=f"the engine action failed: {error}"
                )
        if action.plan_item_id:
            _plan_item_release(action.plan_item_id)
    return action


def _plan_item_release(item_id):
    """Put the plan item a failed action or tune carried out back to pending; one that moved on
    meanwhile (done by a person or another action's change) stays where it is."""
    item = PlanItem.objects.filter(pk=item_id, status="in_progress").first()
    if item is None:
        return
    # moved since it was read: that move stands
    with contextlib.suppress(insights_services.PlanItemConflict):
        insights_services.plan_item_transition(item=item, status="pending")


def engine_action_report(
    *,
    action,
    status=None,
    steps=None,
    observed=None,
    error="",
    log_tail="",
    progress=None,
    takeover=None,
):
    """What the worker reports of an action: its steps so far, what the engine said after the
    restart (observed), its last log lines, and a status: running; sweeping or succeeded once
    the recipe is up (sweeping when a re-sweep follows); failed with the error. Raises
    ActionConflict for a move the action cannot make (e.g. a finished action). progress: the
    delivery's heartbeat (moeops.jobs.progress_update: one of an attempt older than the
    action's is refused, the rest of the report with it); takeover: the attempt a new delivery
    takes the running action over as (moeops.jobs.take_over)."""
    fields = {}
    if steps is not None:
        fields["steps"] = steps
    if observed is not None:
        fields["observed"] = observed
    if log_tail:
        fields["log_tail"] = log_tail
    with transaction.atomic():
        if takeover is not None:
            jobs.take_over(
                action, attempt=takeover, progress=progress, conflict=ActionConflict, what="action"
            )
        elif progress is not None:
            jobs.progress_update(action, progress, conflict=ActionConflict, what="action")
        action = EngineAction.objects.select_for_update().select_related("recipe").get(pk=action.pk)
        if status == "failed":
            return _fail(action, error or "the worker reported the action failed", **fields)
        if status in ("sweeping", "succeeded"):
            if status == "sweeping" and action.after_run_id is None:
                raise ActionConflict(f"action {action.uuid} has no re-sweep to wait for")
            LaunchRecipe.objects.filter(pk=action.recipe_id).update(
                applied_at=timezone.now(), failed_at=None
            )
            if action.kind != "bisect":
                # a bisection's try runs a recipe for a while; where it leaves the engine counts
                insights_services.findings_supersede(deployment=action.deployment)
        if status is not None:
            _move(action, status, **fields)
            if status == "succeeded":
                _plan_done(action)
            elif status == "sweeping":
                # the change is in force from now: items another path waited for are done
                insights_services.plan_items_settle(deployment=action.deployment)
            return action
        if action.is_finished:
            raise ActionConflict(f"action {action.uuid} is {action.status}")
        EngineAction.objects.filter(pk=action.pk).update(**fields)
        for key, value in fields.items():
            setattr(action, key, value)
    return action


def _plan_done(action):
    """A succeeded action: its own plan item is done by it, and so is every other whose change
    it put in force."""
    if action.plan_item_id:
        # the row locked: the compare-and-set cannot miss, so the item is done with its action
        item = PlanItem.objects.select_for_update().get(pk=action.plan_item_id)
        insights_services.plan_item_transition(item=item, status="completed", done_by=action)
    insights_services.plan_items_settle(deployment=action.deployment)


def on_run_finished(run):
    """A finished sweep run's handler (jobs.Step.FOLLOW_UP): a re-sweep ends its action. Returns
    the uuid (text) of the action it ended, or None."""
    return _uuid(engine_action_run_finished(run=run))


def on_tune_finished(tuning_run):
    """A finished tune's handler (jobs.Step.FOLLOW_UP): a plan item's tune starts its action.
    Returns the uuid (text) of the action it started, or None."""
    return _uuid(engine_action_tune_finished(tuning_run=tuning_run))


def _uuid(action):
    return str(action.uuid) if action is not None else None


def engine_action_tune_finished(*, tuning_run):
    """A tune that carries out a plan item (a re-tune for the engine's kernel) finished: on a
    managed deployment a succeeded tune's config is applied, the engine restarted and re-swept
    (an apply_config action with the item, source "tune"); an external deployment's item stays
    in progress for a person to apply it. A tune that failed or was cancelled, or an action that
    cannot start (its worker gone, another in flight), puts the item back to pending. Returns
    the action started (the one already started, when called again), or None."""
    item = tuning_run.plan_item
    if item is None:
        return None
    deployment = tuning_run.deployment
    if tuning_run.status != "succeeded" or tuning_run.result is None:
        _plan_item_release(item.pk)
        return None
    if deployment is None or not deployment.is_managed:
        return None
    # the hook delivered again: the action this tune's end started
    started = EngineAction.objects.filter(
        plan_item=item,
        kernel_config=tuning_run.result,
        source="tune",
        created__gte=tuning_run.finished_at or tuning_run.created,
    ).first()
    if started is not None:
        return started
    try:
        return engine_action_start(
            deployment=deployment,
            kind="apply_config",
            user=permissions.MOEOPS,
            source="tune",
            kernel_config=tuning_run.result,
            plan_item=item,
        )
    except ValidationError as exc:
        log.warning(
            "the tune %s of plan item %s applies nothing: %s", tuning_run.uuid, item.pk, exc
        )
        _plan_item_release(item.pk)
        return None


def engine_action_run_finished(*, run):
    """The re-sweep of an action finished: the action succeeds with it (its plan item done) or
    fails naming how the sweep ended. Returns the action, or None when no action was waiting
    for the run."""
    with transaction.atomic():
        action = (
            EngineAction.objects.select_for_update()
            .select_related("recipe")
            .filter(after_run=run, status="sweeping")
            .first()
        )
        if action is None:
            return None
        steps = [
            {**step, "status": "done" if run.status == "succeeded" else "failed",
             "detail": f"{run.display_label()}: {run.get_status_display().lower()}"}
            if step.get("name") == "re-sweep" else step
            for step in action.steps
        ]  # fmt: skip
        if run.status == "succeeded":
            _move(action, "succeeded", steps=steps)
            _plan_done(action)
            return action
        detail = f": {run.error}" if run.error else ""
        error = f"the engine came up, but its re-sweep ended {run.status}{detail}"
        return _fail(action, error, steps=steps)


# --------------------------------------------------------------------------- lost workers


def engine_action_fail_stale(*, now=None):
    """Fail each queued or restarting action older than MOEOPS_RUN_STALE_S whose host's worker
    is lost (moeops.jobs.worker_lost); returns how many. A re-sweeping action ends with its
    re-sweep, which its own heartbeat fails (runs.services.run_fail_stale)."""
    now = now or timezone.now()
    failed = 0
    actions = EngineAction.objects.filter(status__in=("queued", "running")).select_related(
        "deployment__host", "recipe"
    )
    for action in actions:
        host = action.deployment.host
        started = action.started_at or action.created
        if (now - started).total_seconds() <= settings.MOEOPS_RUN_STALE_S:
            continue
        if not jobs.worker_lost(host, now):
            continue
        silent = jobs.ago(host.silent_for(now))
        try:
            _fail(action, f"The worker of host {host.name} stopped sending heartbeats {silent}.")
            failed += 1
        except ActionConflict:
            pass
    return failed
