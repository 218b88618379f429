"""Finding the rows a request names: by id, name or UUID; 404 with the name when absent."""

import uuid

from django.db.models import Q
from django.http import Http404

from domain.storable import storable_text
from moeops.fleet.models import Deployment, Host, ModelSpec
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.runs.models import SweepRun

MAX_ID = 2**63 - 1


def as_id(ref):
    """The integer id a path segment spells, or None (ids beyond 64 bits match nothing)."""
    ref = str(ref)
    if ref.isascii() and ref.isdigit() and 0 < int(ref) <= MAX_ID:
        return int(ref)
    return None


def _as_uuid(ref):
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        return None


def _one(queryset, what, ref, condition):
    # PostgreSQL refuses NUL and lone surrogates in a query; no name holds one (never stored)
    try:
        storable_text(str(ref))
    except ValueError:
        condition = None
    found = queryset.filter(condition).first() if condition is not None else None
    if found is None:
        raise Http404(f"{what} {ref!r} not found")
    return found


def by_id(queryset, what, ref):
    pk = as_id(ref)
    return _one(queryset, what, ref, Q(pk=pk) if pk is not None else None)


def by_id_or_name(queryset, what, ref, field="name"):
    pk = as_id(ref)
    condition = Q(**{field: str(ref)})
    if pk is not None:
        condition |= Q(pk=pk)
    return _one(queryset, what, ref, condition)


def by_id_or_uuid(queryset, what, ref):
    pk, key = as_id(ref), _as_uuid(ref)
    if pk is not None:
        return _one(queryset, what, ref, Q(pk=pk))
    return _one(queryset, what, ref, Q(uuid=key) if key is not None else None)


def get_model(ref):
    return by_id_or_name(ModelSpec.objects.all(), "model", ref)


def get_host(ref):
    return by_id_or_name(Host.objects.all(), "host", ref)


def get_deployment(ref):
    return by_id_or_name(Deployment.objects.select_related("model", "host"), "deployment", ref)


def runs_with_summary():
    """Runs with their level count and peak output tok/s (SweepRun.objects.with_summary), for
    lists and the CLI table."""
    return SweepRun.objects.select_related("deployment", "deployment__host").with_summary()


def get_run(ref, summary=False):
    queryset = (
        runs_with_summary()
        if summary
        else SweepRun.objects.select_related("deployment", "deployment__host")
    )
    return by_id_or_uuid(queryset, "run", ref)


def get_kernel_config(ref):
    return by_id(KernelConfig.objects.all(), "kernel config", ref)


def get_tuning_run(ref):
    return by_id_or_uuid(TuningRun.objects.select_related("host"), "tuning run", ref)
