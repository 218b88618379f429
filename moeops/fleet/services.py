"""Writes to the fleet: models from config.json, hosts, GPUs, topology snapshots, deployments."""

import datetime as dt

from django.db import IntegrityError, transaction
from django.utils import timezone

from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, TopologySnapshot
from workers.topology import diff_snapshots, snapshot_fingerprint


class AlreadyExists(Exception):
    """A row with this name exists and differs from what was sent."""


def model_register(*, name, config, quant_config=None, hf_repo_id="", provenance=""):
    """(ModelSpec, created) for a config.json; the MoE shape is read from it.

    The same name with the same config is the existing row (idempotent); with another config
    it raises AlreadyExists. Raises MoEConfigError (one line naming the key) when the config
    yields no MoE shape.
    """
    existing = ModelSpec.objects.filter(name=name).first()
    if existing is not None:
        return _same_model(existing, config, quant_config), False
    model = ModelSpec(
        name=name,
        config_json=config,
        quant_config_json=quant_config,
        hf_repo_id=hf_repo_id,
        provenance=provenance,
    )
    model.fill_shape()
    try:
        with transaction.atomic():
            model.save()
    except IntegrityError:
        return _same_model(ModelSpec.objects.get(name=name), config, quant_config), False
    return model, True


def _same_model(existing, config, quant_config):
    if existing.config_json != config or existing.quant_config_json != quant_config:
        raise AlreadyExists(f"model {existing.name!r} exists with another config.json")
    return existing


def host_register(*, name, description="", provenance=""):
    """(Host, created); an existing host of that name is returned unchanged."""
    return Host.objects.get_or_create(
        name=name, defaults={"description": description, "provenance": provenance}
    )


def gpus_record(*, host, gpus):
    """Create or update the host's GPUs by index; `gpus` are dicts of GPU fields.

    Returns (created, updated) counts.
    """
    created = updated = 0
    with transaction.atomic():
        Host.objects.select_for_update().filter(pk=host.pk).first()
        current = {gpu.index: gpu for gpu in host.gpus.all()}
        for fields in gpus:
            gpu = current.get(fields["index"])
            if gpu is None:
                GPU.objects.create(host=host, **fields)
                created += 1
            elif any(getattr(gpu, key) != value for key, value in fields.items()):
                GPU.objects.filter(pk=gpu.pk).update(**fields)
                updated += 1
    return created, updated


def _snapshot_row(host, snapshot, *, source, raw_text, captured_at, provenance):
    virtualization = snapshot.get("virtualization") or {}
    return TopologySnapshot(
        host=host,
        captured_at=captured_at,
        source=source or snapshot.get("source") or "probe",
        virtualization=virtualization.get("kind") or "unknown",
        virtualization_technology=virtualization.get("technology") or "",
        virtualization_evidence=virtualization.get("evidence") or [],
        driver_version=snapshot.get("driver_version") or "",
        cuda_version=snapshot.get("cuda_version") or "",
        gpus=snapshot.get("gpus") or [],
        links=snapshot.get("links"),
        p2p=snapshot.get("p2p"),
        affinity=snapshot.get("affinity") or [],
        nics=snapshot.get("nics") or [],
        raw_text=raw_text,
        provenance=provenance,
    )


def topology_record(*, host, snapshot, source=None, raw_text="", captured_at=None, provenance=""):
    """(snapshot row, created, changes) for a snapshot in the JSON shape of workers.topology.

    A row is added only when the host differs from its current snapshot; otherwise the
    current row is returned with created False. `changes` lists what differs from the
    previous snapshot, one sentence each ([] for the first). captured_at: UTC epoch s.
    """
    when = timezone.now()
    if captured_at is not None:
        when = dt.datetime.fromtimestamp(captured_at, tz=dt.UTC)
    row = _snapshot_row(
        host, snapshot, source=source, raw_text=raw_text, captured_at=when, provenance=provenance
    )
    # Both sides are compared as stored, so keys the table does not keep never count as change.
    row.fingerprint = snapshot_fingerprint(row.as_snapshot())
    with transaction.atomic():
        # one probe at a time per host, so that two identical snapshots never both insert
        Host.objects.select_for_update().filter(pk=host.pk).first()
        previous = host.current_topology()
        if previous is None:
            row.save()
            return row, True, []
        if snapshot_fingerprint(previous.as_snapshot()) == row.fingerprint:
            return previous, False, []
        row.save()
        return row, True, diff_snapshots(previous.as_snapshot(), row.as_snapshot())


def deployment_create(*, name, model, host, gpu_indexes=(), **fields):
    """(Deployment, created); an existing deployment of that name is returned unchanged.

    gpu_indexes picks GPUs of the host; an index the host lacks raises GPU.DoesNotExist.
    """
    existing = Deployment.objects.filter(name=name).first()
    if existing is not None:
        return existing, False
    with transaction.atomic():
        gpus = [host.gpus.get(index=index) for index in gpu_indexes]
        try:
            with transaction.atomic():
                deployment = Deployment.objects.create(name=name, model=model, host=host, **fields)
        except IntegrityError:
            return Deployment.objects.get(name=name), False
        deployment.gpus.set(gpus)
    return deployment, True


def deployment_update(*, deployment, **fields):
    """Set the given fields (status after a health check, launch arguments, …)."""
    if "status" in fields and "status_checked_at" not in fields:
        fields["status_checked_at"] = timezone.now()
    for key, value in fields.items():
        setattr(deployment, key, value)
    deployment.save(update_fields=[*fields, "updated"])
    return deployment
