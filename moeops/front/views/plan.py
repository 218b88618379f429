"""The deployment page's plan and findings: add, save, move, delete and re-tune a plan item,
confirm or dismiss a finding."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from moeops.front.forms.deployments import PlanItemForm
from moeops.front.views.deployments import _deployment_or_404, _deployment_page
from moeops.insights.models import FINDING_STATES, Finding, PlanItem
from moeops.insights.services import (
    finding_set_state,
    plan_item_add,
    plan_item_delete,
    plan_item_move,
    plan_item_update,
)
from moeops.kernels import services as kernel_services


@login_required
@require_POST
def plan_add(request, pk):
    deployment = _deployment_or_404(pk)
    form = PlanItemForm(request.POST)
    if form.is_valid():
        plan_item_add(deployment=deployment, **form.cleaned_data)
    else:
        messages.error(request, "A plan item needs a title.")
    return redirect(f"{deployment.get_absolute_url()}#plan")


@login_required
@require_POST
def plan_item(request, pk):
    """Save, move up/down or delete one plan item (the button pressed says which)."""
    item = get_object_or_404(PlanItem.objects.select_related("deployment"), pk=pk)
    action = request.POST.get("action", "save")
    if action == "save":
        form = PlanItemForm(request.POST)
        if form.is_valid():
            try:
                plan_item_update(item=item, **form.cleaned_data)
            except ValidationError as exc:
                for error in exc.messages:
                    messages.error(request, error[:1].upper() + error[1:] + ".")
        else:
            messages.error(request, "A plan item needs a title and a status.")
    elif action in ("up", "down"):
        plan_item_move(item=item, offset=-1 if action == "up" else 1)
    elif action == "delete":
        plan_item_delete(item=item)
    return redirect(f"{item.deployment.get_absolute_url()}#plan")


@login_required
@require_POST
def plan_item_retune(request, pk):
    """Start the tune a plan item asks for (a re-tune for the engine's kernel); its page follows."""
    item = get_object_or_404(PlanItem.objects.select_related("deployment__host", "finding"), pk=pk)
    try:
        tuning = kernel_services.tuning_start_for_plan_item(item=item, user=request.user)
    except PermissionDenied as exc:
        messages.error(request, f"{exc}.")
    except ValueError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Kernel tune queued on {item.deployment.host.queue_name}.")
        return redirect("tuning-detail", uuid=tuning.uuid)
    return redirect(f"{item.deployment.get_absolute_url()}#plan")


@login_required
@require_POST
def finding_state(request, pk):
    """Confirm, dismiss or reopen a finding, unless someone changed its state since the page."""
    finding = get_object_or_404(Finding, pk=pk)
    new, expected = request.POST.get("state"), request.POST.get("expected")
    back = request.POST.get("next") or finding.deployment.get_absolute_url()
    # checked before anything is saved; a path, never a view name for redirect() to look up
    if not back.startswith("/") or not url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}
    ):
        messages.error(request, "next: must be a path on this site, such as /deployments/1/.")
        return _deployment_page(request, finding.deployment, status=400)
    if new not in dict(FINDING_STATES):
        messages.error(request, "Unknown finding state.")
    elif not finding_set_state(
        finding=finding, state=new, user=request.user, expected=expected or ""
    ):
        messages.error(request, "Someone changed this finding meanwhile; here is its new state.")
    return HttpResponseRedirect(back)
