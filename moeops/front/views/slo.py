"""SLO profiles: the list and the form that creates or edits one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from moeops.fleet.models import SLOProfile
from moeops.front.forms.slo import SLOProfileForm


@login_required
def slo_profiles(request):
    profiles = SLOProfile.objects.all()
    return render(request, "front/slo_profiles.html", {"nav": "slo", "profiles": profiles})


def _edit(request, profile):
    form = SLOProfileForm(request.POST or None, instance=profile)
    if request.method == "POST" and form.is_valid():
        profile = form.save()
        messages.success(request, f"SLO profile “{profile.name}” saved.")
        return redirect("slo-profiles")
    ctx = {"nav": "slo", "form": form, "profile": profile}
    return render(request, "front/slo_profile_form.html", ctx)


@login_required
def slo_profile_create(request):
    return _edit(request, SLOProfile())


@login_required
def slo_profile_edit(request, pk):
    return _edit(request, get_object_or_404(SLOProfile, pk=pk))
