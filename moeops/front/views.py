from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max, Q
from django.shortcuts import get_object_or_404, render

from moeops.fleet.models import Deployment
from moeops.front import charts
from moeops.runs.models import SweepRun


@login_required
def deployments(request):
    rows = (
        Deployment.objects.select_related("model", "host")
        .annotate(
            peak=Max("runs__levels__output_throughput"),
            open_findings=Count("findings", filter=Q(findings__state="open"), distinct=True),
            run_count=Count("runs", distinct=True),
        )
        .order_by("name")
    )
    return render(request, "front/deployments.html", {"deployments": rows})


@login_required
def deployment_detail(request, pk):
    deployment = get_object_or_404(Deployment.objects.select_related("model", "host"), pk=pk)
    runs = list(
        SweepRun.objects.filter(deployment=deployment)
        .prefetch_related("levels")
        .annotate(peak=Max("levels__output_throughput"))
        .order_by("-created")
    )
    ctx = {
        "deployment": deployment,
        "runs": runs,
        "shape": deployment.moe_shape(),
        "topology": deployment.host.current_topology(),
        "findings": deployment.findings.select_related("note").order_by("state", "-created"),
        "plan_items": deployment.plan_items.select_related("note"),
        "throughput_chart": charts.throughput_vs_concurrency(reversed(runs)),
    }
    return render(request, "front/deployment_detail.html", ctx)
