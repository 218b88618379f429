"""Writes to the fleet: models from config.json, hosts, GPUs, topology snapshots, deployments,
health checks and GPU readings, and the checks and readings asked of a host's worker."""

import datetime as dt
from functools import partial

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from domain.levels import LATENCY_METRICS
from domain.topology import diff_snapshots, parse_nvidia_smi_topo, snapshot_fingerprint
from moeops.celery import send_host_task
from moeops.fleet.endpoints import endpoint_change_refusal, endpoint_refusal
from moeops.fleet.models import (
    GPU,
    HEALTH_STATUSES,
    Deployment,
    GPUReading,
    HealthCheck,
    Host,
    ModelSpec,
    SLOProfile,
    TopologySnapshot,
)
from moeops.keyed import body_sha256, stored_meanwhile, stored_under

HEALTH = frozenset(key for key, _ in HEALTH_STATUSES)


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


def host_update(*, host, **fields):
    """Set the given fields of a host (description, price_per_gpu_hour, currency) through the
    model's rules (Host.clean, its validators): raises ValidationError naming the field."""
    for key, value in fields.items():
        setattr(host, key, value)
    # the name is not changed here: one stored before names of digits alone were refused stays
    host.full_clean(exclude=["name"])
    if fields:
        host.save(update_fields=list(fields))
    return host


SLO_PROFILE_FIELDS = (
    *(f"{metric}_{part}" for metric in LATENCY_METRICS for part in ("percentile", "ms")),
    "max_failed_percent",
)


def slo_profile_create(*, name, **fields):
    """(SLOProfile, created). The one rule (SLOProfile.clean, domain.slo.profile_problems)
    raises ValidationError naming the field; the same name with the same limits is the existing
    row (idempotent), with other limits AlreadyExists."""
    profile = SLOProfile(name=name, **fields)
    existing = SLOProfile.objects.filter(name=name).first()
    if existing is not None:
        profile.full_clean(validate_unique=False)
        if any(getattr(existing, key) != getattr(profile, key) for key in SLO_PROFILE_FIELDS):
            raise AlreadyExists(f"SLO profile {name!r} exists with other limits")
        return existing, False
    profile.full_clean()
    try:
        with transaction.atomic():
            profile.save()
    except IntegrityError:
        raise AlreadyExists(f"SLO profile {name!r} exists") from None
    return profile, True


def slo_profile_update(*, profile, **fields):
    """Set the given fields (name, limits, max_failed_percent) under the same rule as
    slo_profile_create: raises ValidationError naming the field, and stores nothing then."""
    for key, value in fields.items():
        setattr(profile, key, value)
    # a name stored before names of digits alone were refused stays while other fields change
    profile.full_clean(exclude=None if "name" in fields else ["name"])
    profile.save()
    return profile


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
        virtualization_layers=virtualization.get("layers") or [],
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


def _moment(epoch_s):
    """A UTC epoch in s as an aware datetime; None is now."""
    if epoch_s is None:
        return timezone.now()
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)


def topology_record(*, host, snapshot, source=None, raw_text="", captured_at=None, provenance=""):
    """(snapshot row, created, changes) for a snapshot in the JSON shape of domain.topology.

    A row is added only when the host differs from its current snapshot; otherwise the
    current row is returned with created False. `changes` lists what differs from the
    previous snapshot, one sentence each ([] for the first). captured_at: UTC epoch s.
    """
    when = _moment(captured_at)
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


def topology_import(*, host, matrix_text, p2p_texts=None, captured_at=None, provenance=""):
    """topology_record of the text `nvidia-smi topo -m` printed and, by kind ("read", "write",
    "nvlink", "atomics"), what `topo -p2p r|w|n|a` printed; the API, the admin and the host page
    all import through it. Raises domain.topology.TopologyParseError naming the line of text
    that is malformed or cut off, before anything is stored."""
    snapshot = parse_nvidia_smi_topo(matrix_text, p2p_texts or {})
    return topology_record(
        host=host,
        snapshot=snapshot,
        raw_text=matrix_text,
        captured_at=captured_at,
        provenance=provenance,
    )


def deployment_create(
    *, name, host, model=None, new_model=None, gpu_indexes=(), user=None, **fields
):
    """(Deployment, created); an existing deployment of that name is returned unchanged.

    model: one on record, or new_model {"name", "config"}: a model registered from its
    config.json (model_register) in the same transaction. gpu_indexes picks GPUs of the host;
    an index the host lacks raises GPU.DoesNotExist. An endpoint_url that fleet.endpoints
    refuses (user: who sets it, a User or permissions.API_TOKEN; None is nobody) raises
    ValidationError naming endpoint_url.
    """
    existing = Deployment.objects.filter(name=name).first()
    if existing is not None:
        return existing, False
    _check_endpoint(host=host, url=fields.get("endpoint_url", ""), current="", user=user)
    with transaction.atomic():
        if new_model is not None:
            model, _ = model_register(
                name=new_model["name"],
                config=new_model["config"],
                provenance="config.json given in the new-deployment form",
            )
        gpus = [host.gpus.get(index=index) for index in gpu_indexes]
        try:
            with transaction.atomic():
                deployment = Deployment.objects.create(name=name, model=model, host=host, **fields)
        except IntegrityError:
            return Deployment.objects.get(name=name), False
        deployment.gpus.set(gpus)
    return deployment, True


def deployment_update(*, deployment, user=None, trigger="api", gpus=None, **fields):
    """Set the given fields (launch arguments, endpoint, a status such as stopped, …) and, with
    gpus (GPU rows of its host), the GPUs it uses.

    A health status (healthy, degraded, failed) with its status_detail is a check reported
    (trigger: "api", or "edit" from the deployment's form): health_check_record keeps it in
    the history and sets the status. An endpoint_url that fleet.endpoints refuses (user: who
    sets it, a User or permissions.API_TOKEN; None is nobody) raises ValidationError naming
    endpoint_url.
    """
    if "endpoint_url" in fields:
        _check_endpoint(
            host=deployment.host,
            url=fields["endpoint_url"],
            current=deployment.endpoint_url,
            user=user,
        )
    with transaction.atomic():
        if fields.get("status") in HEALTH:
            health_check_record(
                deployment=deployment,
                status=fields.pop("status"),
                detail=fields.pop("status_detail", ""),
                trigger=trigger,
            )
        for key, value in fields.items():
            setattr(deployment, key, value)
        if fields:
            deployment.save(update_fields=[*fields, "updated"])
        if gpus is not None:
            deployment.gpus.set(gpus)
    return deployment


def _check_endpoint(*, host, url, current, user):
    refusal = endpoint_change_refusal(host=host, url=url, current=current, user=user)
    if refusal:
        raise ValidationError({"endpoint_url": refusal})


def health_check_record(
    *,
    deployment,
    status,
    trigger,
    up=None,
    detail="",
    checked_at=None,
    check_uuid=None,
    latency_ms=None,
    engine="",
    version="",
    served_models=(),
    max_running_requests=None,
):
    """(HealthCheck, created): one check of the deployment's engine, kept in its history.

    The one place that a check sets the deployment's status, status_detail and
    status_checked_at (not a status set by hand, trigger "edit"); only the newest check does,
    so that a check replayed late from a worker's spool joins the history without undoing a
    newer one. up: the engine answered
    (default: the status is not failed); checked_at: UTC epoch s (default now); latency_ms in
    ms. A check_uuid seen before returns that check (a retried push), or KeyConflict when it
    was stored from another body.
    """
    digest = body_sha256(
        {
            "status": status,
            "trigger": trigger,
            "up": up,
            "detail": detail,
            "checked_at": checked_at,
            "latency_ms": latency_ms,
            "engine": engine,
            "version": version,
            "served_models": list(served_models),
            "max_running_requests": max_running_requests,
        }
    )
    what = f"health check {check_uuid}"
    owned = partial(_same_deployment, deployment=deployment)
    existing = stored_under(HealthCheck.objects, check_uuid, digest, what, owned)
    if existing is not None:
        return existing, False
    when = _moment(checked_at)
    row = HealthCheck(
        deployment=deployment,
        checked_at=when,
        status=status,
        up=status != "failed" if up is None else up,
        latency_ms=latency_ms,
        engine=engine or "",
        version=version or "",
        served_models=list(served_models),
        max_running_requests=max_running_requests,
        detail=detail,
        trigger=trigger,
        body_sha256=digest,
    )
    if check_uuid is not None:
        row.uuid = check_uuid
    with transaction.atomic():
        # one check at a time per deployment, so that the newest one is the one that sets status
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            return stored_meanwhile(HealthCheck.objects, check_uuid, digest, what, owned), False
        if not deployment.health_checks.filter(checked_at__gt=when).exists():
            deployment.status = status
            deployment.status_detail = detail
            # a status set by hand is on record, but nothing checked the engine
            if trigger != "edit":
                deployment.status_checked_at = when
            deployment.save(
                update_fields=["status", "status_detail", "status_checked_at", "updated"]
            )
    return row, True


def _same_deployment(check, deployment):
    if check.deployment_id != deployment.pk:
        raise AlreadyExists(f"health check {check.uuid} belongs to another deployment")
    return check


def deployment_check_enqueue(*, deployment, trigger, expires_s=None):
    """Send `workers.check_deployment` for the deployment to its host's queue once the current
    transaction commits; returns the task's kwargs.

    Raises ValidationError naming endpoint_url when the deployment has none or one that
    fleet.endpoints refuses, and kombu's OperationalError when the broker cannot be reached
    (at once where no transaction is open, as in a view or a task). expires_s: a check no
    worker started by then is dropped (s).
    """
    if not deployment.endpoint_url:
        raise ValidationError(
            {"endpoint_url": f"deployment {deployment.name!r} has no endpoint URL to check"}
        )
    # an endpoint stored before the allow-list, or since taken off it, is not fetched
    refusal = endpoint_refusal(host=deployment.host, url=deployment.endpoint_url)
    if refusal:
        raise ValidationError({"endpoint_url": refusal})
    kwargs = {
        "deployment": deployment.pk,
        "base_url": deployment.endpoint_url,
        "model": deployment.request_model_name,
        "engine": deployment.engine,
        "trigger": trigger,
    }
    host = deployment.host
    options = {"expires": expires_s} if expires_s else {}
    transaction.on_commit(
        lambda: send_host_task("check_deployment", host, kwargs=kwargs, **options)
    )
    return kwargs


def gpu_reading_enqueue(*, host):
    """Send `workers.gpus_now` to the host's queue once the current transaction commits.

    Raises kombu's OperationalError when the broker cannot be reached, as
    deployment_check_enqueue does.
    """
    transaction.on_commit(lambda: send_host_task("gpus_now", host))


def gpu_reading_record(*, host, status, detail="", gpus=(), taken_at=None, reading_uuid=None):
    """(GPUReading, created): every GPU of the host read once, or why there is no reading.

    gpus: dicts of workers.telemetry samples; taken_at: UTC epoch s (default now). A
    reading_uuid seen before returns that reading (a retried push), or KeyConflict when it was
    stored from another body.
    """
    gpus = list(gpus)
    body = {"status": status, "detail": detail, "gpus": gpus, "taken_at": taken_at}
    digest = body_sha256(body)
    what = f"GPU reading {reading_uuid}"
    owned = partial(_same_host, host=host)
    existing = stored_under(GPUReading.objects, reading_uuid, digest, what, owned)
    if existing is not None:
        return existing, False
    row = GPUReading(
        host=host,
        taken_at=_moment(taken_at),
        status=status,
        detail=detail,
        gpus=gpus,
        body_sha256=digest,
    )
    if reading_uuid is not None:
        row.uuid = reading_uuid
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        return stored_meanwhile(GPUReading.objects, reading_uuid, digest, what, owned), False
    return row, True


def _same_host(reading, host):
    if reading.host_id != host.pk:
        raise AlreadyExists(f"GPU reading {reading.uuid} belongs to another host")
    return reading


def host_heartbeat_record(*, host, status):
    """The host's worker is alive: its last-seen time is now and status what it says of itself
    (worker, managed engines, spool). Returns the host."""
    now = timezone.now()
    Host.objects.filter(pk=host.pk).update(worker_seen_at=now, worker_status=status)
    host.worker_seen_at, host.worker_status = now, status
    return host
