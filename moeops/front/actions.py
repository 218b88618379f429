"""Writes the browser UI starts that no app service covers: a deployment with its new model,
and kernel tunes sent to a host's worker. Sweeps start through moeops.runs.services.run_start,
which the API's POST /runs shares; the plan's writes are moeops.insights.services'.
"""

from django.db import transaction

from moeops.engines.services import require_staff
from moeops.fleet import services as fleet_services
from moeops.insights.models import PlanItem
from moeops.kernels.models import TuningRun
from moeops.kernels.services import tuning_run_create
from moeops.runs.services import run_enqueue, run_start
from moeops.runs.snapshots import kernel_shape
from tuning.config_files import TUNED_BATCH_SIZES


def sweep_start(*, deployment, parameters, label=""):
    """A queued SweepRun of the deployment whose sweep is sent to its host (see run_start)."""
    run, _ = run_start(deployment=deployment, parameters=parameters, label=label)
    return run


_UNREAD = object()


def tuning_preflight(*, deployment, has_gpus=None, topology=_UNREAD) -> str:
    """Why a tune of the deployment cannot run on its host now, in one sentence, or "".

    Asked before a tune is enqueued: a tune sent to a host without a CUDA GPU fails in its
    worker, and one sent to a host whose worker is gone waits in its queue. has_gpus (the host
    has GPUs recorded) and topology (its current snapshot, or None) where the caller has them.
    """
    host = deployment.host
    if has_gpus is None:
        has_gpus = host.gpus.exists()
    if topology is _UNREAD:
        topology = host.current_topology()
    if not has_gpus:
        return (
            f"Host {host.name} has no GPU recorded (its worker's probe found none), and a "
            "kernel tune times the kernel on a CUDA GPU."
        )
    if topology is not None and topology.source == "probe" and not topology.cuda_version:
        return (
            f"Host {host.name}'s worker found no CUDA driver when it probed the host, and a "
            "kernel tune needs CUDA."
        )
    return host.worker_absence()


def deployment_create(*, model=None, new_model=None, gpu_indexes=(), **fields):
    """(Deployment, created) of a model on record or, with new_model {"name", "config"}, of
    that model registered from its config.json in the same transaction (fleet.services)."""
    with transaction.atomic():
        if new_model is not None:
            model, _ = fleet_services.model_register(
                name=new_model["name"],
                config=new_model["config"],
                provenance="config.json given in the new-deployment form",
            )
        return fleet_services.deployment_create(model=model, gpu_indexes=gpu_indexes, **fields)


def tuning_start(*, deployment, dtype, batch_sizes, engine="builtin", force=False):
    """Create a queued TuningRun for the deployment's MoE shape and GPU; enqueue `tune_kernel`.

    The shape is the per-rank one at the deployment's tp/ep (E experts per rank, N the
    intermediate size after silu-and-mul); block fp8 takes the model's weight block shape.
    engine: whose kernel is asked for, the deployment's engine or "builtin" (the worker falls
    back to builtin where the engine is not installed); force: tune FP4 experts all the same
    (the worker refuses them otherwise, as their kernels read no Triton config).
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
            engine=engine,
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
            "gpu_indices": deployment.gpu_indices(),
            "engine": engine,
            "quantization": deployment.weight_quantization,
            "force": force,
        }
        run_enqueue(run=tuning, task="tune_kernel", host=deployment.host, kwargs=kwargs)
    return tuning


# The findings whose plan item is "Tune for <engine> <version> and re-sweep".
RETUNE_FINDINGS = ("kernel_provenance",)


def plan_item_retunes(item) -> bool:
    """Whether the item is a re-tune for the engine's kernel that a button can start now (one
    pending: a tune it started puts it in progress)."""
    return (
        item.status == "pending"
        and item.finding is not None
        and item.finding.kind in RETUNE_FINDINGS
        and item.deployment.engine in ("vllm", "sglang")
    )


def plan_item_retune(*, item, user):
    """Start the re-tune a plan item asks for: the deployment's engine's own kernel at its MoE
    shape, dtype and GPU, the usual batch sizes. The item is in progress; once the tune succeeds
    a managed deployment's engine gets the config, restarts and is re-swept
    (moeops.engines.services.engine_action_tune_finished), so only staff may start it there.
    Raises PermissionDenied, or ValueError with the sentence that says why not."""
    deployment = item.deployment
    if deployment.is_managed:
        require_staff(user)
    if not plan_item_retunes(item):
        raise ValueError(f"Plan item “{item.title}” starts no tune.")
    shape = kernel_shape(deployment)
    if shape is None or shape.get("dtype") is None:
        reason = (shape or {}).get("reason") or "its MoE shape cannot be read"
        raise ValueError(f"{deployment} loads no kernel config: {reason}.")
    refusal = tuning_preflight(deployment=deployment)
    if refusal:
        raise ValueError(refusal)
    with transaction.atomic():
        tuning = tuning_start(
            deployment=deployment,
            dtype=shape["dtype"],
            batch_sizes=TUNED_BATCH_SIZES,
            engine=deployment.engine,
        )
        TuningRun.objects.filter(pk=tuning.pk).update(plan_item=item)
        PlanItem.objects.filter(pk=item.pk).update(status="in_progress")
    tuning.plan_item, item.status = item, "in_progress"
    return tuning
