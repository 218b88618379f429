"""Writes the browser UI starts that no app service covers: sweeps and tunes sent to a host's
worker, and the plan's order.

Each GPU-host task is enqueued after the row that describes it is committed, so the worker
always finds its run; a broker that cannot be reached fails the run with the reason instead of
leaving it queued forever.
"""

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from kombu.exceptions import OperationalError

from moeops.celery import send_host_task
from moeops.fleet.models import Deployment
from moeops.insights.models import PlanItem
from moeops.kernels.models import TuningRun
from moeops.kernels.services import tuning_run_create
from moeops.runs.models import SweepRun
from moeops.runs.services import run_create
from tuning.moe_params import vocab_size

log = logging.getLogger(__name__)


def _enqueue(model, pk, task, host, kwargs):
    try:
        send_host_task(task, host, kwargs=kwargs)
    except OperationalError as exc:
        log.warning("could not enqueue workers.%s on %s: %s", task, host.queue_name, exc)
        model.objects.filter(pk=pk, status="queued").update(
            status="failed",
            error=f"Could not reach the broker to enqueue workers.{task}: {exc}",
            finished_at=timezone.now(),
        )


def _gpu_indices(deployment):
    return sorted(gpu.index for gpu in deployment.gpus.all())


def sweep_start(*, deployment, parameters, label=""):
    """Create a queued SweepRun and enqueue `workers.run_sweep` on the deployment's host.

    parameters: levels (list of concurrencies), input_len and output_len (tokens),
    prompts_per_level, warmup (requests), endpoint ("completions" or "chat"). The prompts' token
    ids are drawn from the model's vocabulary (its config.json's vocab_size).
    """
    parameters = {
        **parameters,
        "base_url": deployment.endpoint_url,
        "model": deployment.served_model_name or deployment.model.name,
        "gpu_indices": _gpu_indices(deployment),
        "vocab_size": vocab_size(deployment.model.config_json),
    }
    with transaction.atomic():
        run, _ = run_create(
            deployment=deployment,
            label=label,
            parameters=parameters,
            source="worker",
            topology_snapshot=deployment.host.current_topology(),
        )
        kwargs = {"run_uuid": str(run.uuid), **parameters}
        host = deployment.host
        transaction.on_commit(lambda: _enqueue(SweepRun, run.pk, "run_sweep", host, kwargs))
    return run


def tuning_start(*, deployment, dtype, batch_sizes):
    """Create a queued TuningRun for the deployment's MoE shape and GPU; enqueue `tune_kernel`.

    The shape is the per-rank one at the deployment's tp/ep (E experts per rank, N the
    intermediate size after silu-and-mul); block fp8 takes the model's weight block shape.
    Raises ValueError when the model's shape cannot be read at that tp/ep.
    """
    shape = deployment.moe_shape()
    if shape is None:
        raise ValueError(
            f"The MoE shape of {deployment.model} cannot be split over tp={deployment.tp}, "
            f"ep={deployment.ep}"
        )
    gpu = deployment.gpus.order_by("index").first() or deployment.host.gpus.first()
    block_shape = shape["block_shape"] if dtype == "fp8_w8a8" else None
    with transaction.atomic():
        tuning, _ = tuning_run_create(
            host=deployment.host,
            deployment=deployment,
            device_name=gpu.name if gpu else "",
            E=shape["experts_per_rank"],
            N=shape["N"],
            hidden_size=shape["hidden_size"],
            topk=shape["topk"],
            dtype=dtype,
            block_shape=block_shape,
            batch_sizes=list(batch_sizes),
        )
        kwargs = {
            "tuning_run_uuid": str(tuning.uuid),
            "E": tuning.E,
            "N": tuning.N,
            "hidden_size": tuning.hidden_size,
            "topk": tuning.topk,
            "dtype": dtype,
            "block_shape": block_shape,
            "batch_sizes": tuning.batch_sizes,
            "device_name": tuning.device_name,
            "gpu_indices": _gpu_indices(deployment),
        }
        host = deployment.host
        transaction.on_commit(lambda: _enqueue(TuningRun, tuning.pk, "tune_kernel", host, kwargs))
    return tuning


def plan_item_add(*, deployment, title, status="pending", note=None):
    """Append an item at the end of the deployment's plan."""
    with transaction.atomic():
        # the deployment's row serializes concurrent appends (no FOR UPDATE with an aggregate)
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        last = PlanItem.objects.filter(deployment=deployment).aggregate(p=Max("position"))["p"]
        position = 0 if last is None else last + 1
        return PlanItem.objects.create(
            deployment=deployment, title=title, status=status, note=note, position=position
        )


def plan_item_move(*, item, offset):
    """Move an item `offset` places (-1 up, +1 down) and renumber the plan 0…n-1."""
    with transaction.atomic():
        items = list(
            PlanItem.objects.select_for_update()
            .filter(deployment_id=item.deployment_id)
            .order_by("position", "id")
        )
        index = next(i for i, other in enumerate(items) if other.pk == item.pk)
        target = min(max(index + offset, 0), len(items) - 1)
        items.insert(target, items.pop(index))
        for position, other in enumerate(items):
            if other.position != position:
                other.position = position
                other.save(update_fields=["position"])
