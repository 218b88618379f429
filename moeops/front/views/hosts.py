"""GPU hosts: their GPUs, link and P2P matrices, and the topology history with what changed."""

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max
from django.shortcuts import get_object_or_404, render

from moeops.fleet.models import Host
from moeops.front import charts
from moeops.runs.models import SweepRun
from workers.topology import P2P_KINDS, diff_snapshots


def _get_host_for_user(user, name):
    return get_object_or_404(Host, name=name)


@login_required
def hosts(request):
    rows = Host.objects.annotate(
        gpu_count=Count("gpus", distinct=True),
        deployment_count=Count("deployments", distinct=True),
        snapshot_count=Count("topology_snapshots", distinct=True),
    ).order_by("name")
    rows = [(host, host.current_topology()) for host in rows]
    return render(request, "front/hosts.html", {"nav": "hosts", "hosts": rows})


def _history(snapshots):
    """Newest first: (snapshot, what changed since the one before it, or None for the first)."""
    history = []
    for i, snapshot in enumerate(snapshots):
        older = snapshots[i + 1] if i + 1 < len(snapshots) else None
        changes = diff_snapshots(older.as_snapshot(), snapshot.as_snapshot()) if older else None
        history.append((snapshot, changes))
    return history


@login_required
def host_detail(request, name):
    host = _get_host_for_user(request.user, name)
    snapshots = list(host.topology_snapshots.order_by("-captured_at", "-id"))
    current = snapshots[0] if snapshots else None
    runs = (
        SweepRun.objects.filter(topology_snapshot__host=host)
        .select_related("deployment")
        .annotate(peak=Max("levels__output_throughput"))
        .order_by("-created")
    )
    runs_by_snapshot = {}
    for run in runs:
        runs_by_snapshot.setdefault(run.topology_snapshot_id, []).append(run)
    figures = {}
    if current and current.links:
        figures["links"] = charts.topology_heatmap(current.links, "Link matrix", "links")
    for kind in P2P_KINDS:
        block = (current.p2p or {}).get(kind) if current else None
        if block:
            figures[f"p2p-{kind}"] = charts.topology_heatmap(block, f"P2P {kind}", "p2p")
    ctx = {
        "nav": "hosts",
        "host": host,
        "gpus": host.gpus.all(),
        "current": current,
        "probed_gpus": current.gpus if current else [],
        "figures": figures,
        "history": [
            (snapshot, changes, runs_by_snapshot.get(snapshot.pk, []))
            for snapshot, changes in _history(snapshots)
        ],
        "deployments": host.deployments.select_related("model"),
    }
    return render(request, "front/host_detail.html", ctx)
