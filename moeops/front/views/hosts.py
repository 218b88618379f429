"""GPU hosts: their GPUs and what they do now, link and P2P matrices, and the topology history
with what changed."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from domain.topology import P2P_KINDS, TopologyParseError, diff_snapshots
from moeops.fleet import services as fleet_services
from moeops.fleet.forms import TopologyTextForm
from moeops.fleet.models import Host
from moeops.front.charts.hosts import topology_heatmap
from moeops.runs.models import SweepRun


def _host_or_404(name):
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


def _pcie(gpu):
    pcie = gpu.get("pcie") or {}
    if not any(pcie.values()):
        return None
    return (
        f"Gen{pcie.get('gen_max') or '?'} x{pcie.get('width_max') or '?'} / "
        f"Gen{pcie.get('gen_current') or '?'} x{pcie.get('width_current') or '?'}"
    )


def gpu_rows(gpus, probed):
    """One row per GPU index: what the current snapshot read, else what the host's GPU rows
    hold (an nvidia-smi import knows the links, not the GPUs' names)."""
    known = {gpu.index: gpu for gpu in gpus}
    seen = {g.get("index"): g for g in probed if g.get("index") is not None}
    rows = []
    for index in sorted(known.keys() | seen.keys()):
        row, snap = known.get(index), seen.get(index, {})
        rows.append(
            {
                "index": index,
                "name": snap.get("name") or (row.name if row else None),
                "arch": snap.get("sm") or (row.sm if row else None),
                "pci_bus_id": snap.get("pci_bus_id"),
                "memory_total_mib": snap.get("memory_total_mib")
                or (row.memory_total_mib if row else None),
                "power_limit_w": snap.get("power_limit_w") or (row.power_limit_w if row else None),
                "pcie": _pcie(snap),
                "nvlinks_active": snap.get("nvlinks_active"),
                "uuid": snap.get("uuid") or (row.uuid if row else None),
            }
        )
    return rows


@login_required
def host_detail(request, name):
    return _host_page(request, _host_or_404(name))


@login_required
@require_POST
def topology_upload(request, name):
    """A snapshot from pasted `nvidia-smi topo -m` (and `-p2p`) text, through the parser and the
    service the API uses; text that does not parse is refused with a sentence on the form."""
    host = _host_or_404(name)
    form = TopologyTextForm(request.POST)
    if form.is_valid():
        try:
            _, created, changes = fleet_services.topology_import(
                host=host, provenance=f"pasted by {request.user}", **form.import_fields()
            )
        except TopologyParseError as error:
            form.add_parse_error(error)
        else:
            if not created:
                messages.info(request, "Nothing changed from the current snapshot: none added.")
            else:
                messages.success(
                    request,
                    "Topology snapshot added" + (f": {'; '.join(changes)}." if changes else "."),
                )
            return redirect(reverse("host-detail", args=[host.name]) + "#topology")
    return _host_page(request, host, topology_form=form, status=400)


def _host_page(request, host, topology_form=None, status=200):
    snapshots = list(host.topology_snapshots.order_by("-captured_at", "-id"))
    current = snapshots[0] if snapshots else None
    runs = (
        SweepRun.objects.filter(topology_snapshot__host=host)
        .select_related("deployment")
        .with_summary()
        .order_by("-created")
    )
    runs_by_snapshot = {}
    for run in runs:
        runs_by_snapshot.setdefault(run.topology_snapshot_id, []).append(run)
    figures = {}
    if current and current.links:
        figures["links"] = topology_heatmap(current.links, "Link matrix", "links")
    for kind in P2P_KINDS:
        block = (current.p2p or {}).get(kind) if current else None
        if block:
            figures[f"p2p-{kind}"] = topology_heatmap(block, f"P2P {kind}", "p2p")
    ctx = {
        "nav": "hosts",
        "host": host,
        "gpus": gpu_rows(host.gpus.all(), current.gpus if current else []),
        "current": current,
        "figures": figures,
        "history": [
            (snapshot, changes, runs_by_snapshot.get(snapshot.pk, []))
            for snapshot, changes in _history(snapshots)
        ],
        "deployments": host.deployments.select_related("model"),
        "reading": host.gpu_readings.first(),
        "topology_form": topology_form or TopologyTextForm(),
    }
    return render(request, "front/host_detail.html", ctx, status=status)


@login_required
@require_POST
def gpus_now(request, name):
    """Ask the host's worker to read its GPUs once."""
    host = _host_or_404(name)
    try:
        fleet_services.gpu_reading_enqueue(host=host)
    except OperationalError as exc:
        messages.error(request, f"Could not reach the broker to ask for a GPU reading: {exc}")
    else:
        messages.success(request, f"GPU reading queued on {host.queue_name}.")
    return redirect(f"{reverse('host-detail', args=[host.name])}#gpus-now")
