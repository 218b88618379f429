"""A managed engine from the browser: its launch recipe (staff), the actions that restart it
(changed arguments, a kernel config, revert) and each action's page."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from domain import launch
from moeops import permissions
from moeops.engines import services
from moeops.engines.models import EngineAction
from moeops.fleet import services as fleet_services
from moeops.fleet.models import Deployment
from moeops.front.forms.engines import ApplyConfigForm, ArgsForm, RecipeForm
from moeops.insights.models import PlanItem
from moeops.kernels.models import KernelConfig

RECENT_ACTIONS = 5


def _deployment(pk):
    # every signed-in member sees every deployment; who may act is the services' rule
    return get_object_or_404(Deployment.objects.select_related("model", "host"), pk=pk)


def _kernel_configs(deployment):
    """The kernel configs the deployment's engine would load for its shape, newest first."""
    configs = KernelConfig.objects.for_shape(deployment.kernel_shape(), engine=deployment.engine)
    return configs.order_by("-created", "-version")


def panel_context(deployment, plan_items):
    """What the deployment page's engine panel shows; plan_items get .restart (the cap change
    their button makes). An external deployment's panel only says so (no query)."""
    for item in plan_items:
        item.restart = item.cap_change() if deployment.is_managed else None
    if not deployment.is_managed:
        return {}
    in_force = deployment.recipe_in_force()
    newest = services.recipe_newest(deployment)
    engine = deployment.host.managed_engine(deployment.pk)
    cap_flag = launch.cap_flag(deployment.engine, (in_force or newest).argv if newest else [])
    # the one reading of the cap in force that also settles the plan's items
    current_cap = deployment.running_cap_in_force(cap_flag)[0] if cap_flag else None
    actions = deployment.engine_actions.select_related(
        "recipe", "after_run", "before_run", "requested_by", "kernel_config"
    )
    return {
        "recipe": in_force or newest,
        "recipe_pending": newest if newest and newest != in_force else None,
        "recipe_in_force": in_force,
        "managed_engine": engine,
        "worker_absence": deployment.host.worker_absence(),
        "engine_actions": actions[:RECENT_ACTIONS],
        "args_form": ArgsForm(initial={"flag": cap_flag or "--max-num-seqs", "value": ""}),
        "current_cap": current_cap,
        "apply_form": ApplyConfigForm(configs=_kernel_configs(deployment)),
    }


@permissions.staff_required
def recipe_edit(request, pk):
    """A new launch recipe version (and whether moeops manages the engine)."""
    deployment = _deployment(pk)
    newest = services.recipe_newest(deployment)
    form = RecipeForm(request.POST or None, initial=RecipeForm.initial_from(newest, deployment))
    if request.method == "POST" and form.is_valid():
        try:
            with transaction.atomic():
                fleet_services.deployment_update(
                    deployment=deployment, management=form.cleaned_data["management"]
                )
                recipe = services.recipe_create(
                    deployment=deployment,
                    author=request.user,
                    based_on=newest,
                    **form.recipe_fields(),
                )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(
                request,
                f"Launch recipe v{recipe.version} saved; it runs from the next restart.",
            )
            return redirect(f"{deployment.get_absolute_url()}#engine")
    ctx = {"nav": "deployments", "deployment": deployment, "form": form, "newest": newest}
    return render(request, "front/recipe_form.html", ctx, status=400 if form.errors else 200)


def _action_fields(request, deployment, kind):
    """The service's arguments for the posted action; ValidationError naming the field."""
    fields = {}
    if kind == "restart_with_args":
        form = ArgsForm(request.POST)
        if not form.is_valid():
            raise ValidationError({"changes": "a flag and the value to give it"})
        fields["changes"] = {form.cleaned_data["flag"]: form.cleaned_data["value"]}
    if kind == "apply_config":
        form = ApplyConfigForm(request.POST, configs=_kernel_configs(deployment))
        if not form.is_valid():
            raise ValidationError({"kernel_config": "pick a kernel config for this shape"})
        fields["kernel_config"] = form.cleaned_data["kernel_config"]
    item = request.POST.get("plan_item")
    if item:
        fields["plan_item"] = get_object_or_404(PlanItem, pk=item, deployment=deployment)
    return fields


@login_required
@require_POST
def action_start(request, pk):
    """Start an engine action on a managed deployment; its page follows it."""
    deployment = _deployment(pk)
    kind = request.POST.get("kind", "")
    try:
        action = services.engine_action_start(
            deployment=deployment,
            kind=kind,
            user=request.user,
            resweep=request.POST.get("resweep", "on") == "on",
            **_action_fields(request, deployment, kind),
        )
    except PermissionDenied as exc:
        messages.error(request, f"{exc}.")
    except ValidationError as exc:
        for errors in exc.message_dict.values():
            for error in errors:
                messages.error(request, error[:1].upper() + error[1:])
    else:
        messages.success(request, f"{action.title()}: queued on {deployment.host.queue_name}.")
        return redirect(action)
    return redirect(f"{deployment.get_absolute_url()}#engine")


@login_required
def action_detail(request, uuid):
    action = get_object_or_404(
        EngineAction.objects.select_related(
            "deployment__host", "recipe", "previous_recipe", "before_run", "after_run",
            "kernel_config", "plan_item", "requested_by",
        ),
        uuid=uuid,
    )  # fmt: skip
    ctx = {"nav": "deployments", "action": action, "deployment": action.deployment}
    return render(request, "front/engine_action.html", ctx)
