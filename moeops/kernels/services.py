"""Writes to kernel configs and tuning runs: the start of a tune on a host's worker, its status
moves (moeops.jobs), failing tunes whose worker is lost."""

import json
from functools import partial

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from domain import engine_diff_report
from moeops import jobs, permissions
from moeops.celery import send_host_task
from moeops.insights import services as insights_services
from moeops.kernels.models import KERNEL_DTYPES, EngineDiff, KernelConfig, TuningRun, TuningTiming
from moeops.keyed import body_sha256, stored_meanwhile, stored_under
from tuning import config_files, devices
from tuning.engines import ENGINE_TITLES
from tuning.routing import routing_problem

DTYPES = tuple(key for key, _ in KERNEL_DTYPES)


class TuningConflict(Exception):
    """The tuning run cannot do that from where it is (e.g. succeeded → running)."""


def kernel_config_import(
    *, file_name, text, down_text=None, source="imported", provenance="", compile_checked=None
):
    """(KernelConfig, created) from an engine's config file: its name and its exact text.

    The name gives E, N, device, dtype, block shape and whether it is SGLang's `_down` file (an
    SGLang `triton_X_Y_Z/` folder in front gives the Triton version when the content has
    none). down_text: vLLM's `_down` file beside it (its sorted-A path), stored with it as one
    record; a vLLM `_down` file comes only so. compile_checked: what compiling it for its GPU
    found (kernel_config_store). Raises ValidationError naming "file_name", "content",
    "down_content" or "compile_checked".
    """
    try:
        name = config_files.parse_config_file_name(file_name)
    except config_files.ConfigFileError as exc:
        raise ValidationError({"file_name": str(exc)}) from None
    if name.per_channel_quant:
        raise ValidationError({"file_name": "SGLang per-channel configs are not stored yet"})
    if name.down_moe and name.style == "vllm":
        raise ValidationError(
            {
                "file_name": "a vLLM _down file goes with its up file: import the up file with "
                "this one as its down_content"
            }
        )
    try:
        triton_version, entries = config_files.loads_config(text)
    except config_files.ConfigEntryError as exc:
        raise ValidationError({"content": exc.errors}) from None
    down_entries = None
    if down_text is not None:
        if name.down_moe or name.style == "sglang":
            raise ValidationError(
                {"down_content": "only a vLLM up file has a _down file beside it in one record"}
            )
        try:
            _, down_entries = config_files.loads_config(down_text, vllm_down=True)
        except config_files.ConfigEntryError as exc:
            raise ValidationError({"down_content": exc.errors}) from None
    return kernel_config_store(
        device_name=config_files.nvml_device_name(name.device_name),
        E=name.E,
        N=name.N,
        dtype=name.dtype or "bf16",
        block_shape=list(name.block_shape) if name.block_shape else None,
        down_moe=name.down_moe,
        triton_version=triton_version or name.triton_version or "",
        entries=entries,
        down_entries=down_entries,
        source=source,
        original_file_name=file_name,
        provenance=provenance,
        compile_checked=compile_checked,
    )


def kernel_config_store(
    *,
    device_name,
    E,
    N,
    dtype,
    block_shape,
    triton_version,
    entries,
    down_moe=False,
    down_entries=None,
    source="manual",
    original_file_name="",
    provenance="",
    kernel_engine="",
    kernel_version="",
    kernel_source_sha256="",
    kernel_path="",
    compile_checked=None,
):
    """(KernelConfig, created): a new version of the (device, E, N, dtype, block, down) series.

    down_moe: SGLang's `_down` file (GEMM 2's configs), a series of its own. down_entries:
    vLLM's `_down` file beside this one (its sorted-A path), stored in the same record.
    kernel_*: the kernel it was tuned on (engine, version, source hash, kernel path), kept
    beside the file, never in it. compile_checked: compiled, not timed, for its GPU
    (tuning.compile_check.EntriesCheck.record): its capability must be the GPU's where moeops
    knows the GPU, and every entry must have fitted.

    entries: {batch size: kernel parameters}. When the newest version already holds the same
    entries, Triton version and kernel, that version is returned (created False). Raises
    ValidationError naming dtype, E, N, block_shape (config_files.shape_problems), entries or
    down_entries.
    """
    if dtype not in DTYPES:
        raise ValidationError({"dtype": f"must be one of {', '.join(DTYPES)}, got {dtype!r}"})
    problems = config_files.shape_problems(E, N, block_shape)
    if problems:
        raise ValidationError(problems)
    try:
        checked = config_files.validate_entries(entries)
    except config_files.ConfigEntryError as exc:
        raise ValidationError({"entries": exc.errors}) from None
    stored = {str(m): entry for m, entry in checked.items()}
    stored_down = _checked_down(down_entries, down_moe=down_moe, block_shape=block_shape)
    _check_compile_checked(compile_checked, device_name=device_name, entries=len(stored))
    config = KernelConfig(
        device_name=device_name,
        E=E,
        N=N,
        dtype=dtype,
        block_shape=block_shape,
        down_moe=down_moe,
        triton_version=triton_version or "",
        entries=stored,
        down_entries=stored_down,
        source=source,
        original_file_name=original_file_name,
        provenance=provenance,
        kernel_engine=kernel_engine,
        kernel_version=kernel_version,
        kernel_source_sha256=kernel_source_sha256,
        kernel_path=kernel_path,
        compile_checked=compile_checked,
    )
    with transaction.atomic():
        newest = max(config.series(), key=lambda c: c.version, default=None)
        if (
            newest is not None
            and _canonical(newest.entries) == _canonical(stored)
            and _canonical(newest.down_entries) == _canonical(stored_down)
            and _tuned_on(newest) == _tuned_on(config)
        ):
            return newest, False
        config.save_new_version()
    return config, True


def _checked_down(down_entries, *, down_moe, block_shape):
    """down_entries as stored ({"M": entry}), None where there are none; ValidationError
    naming down_entries where they cannot be a vLLM `_down` file beside this one."""
    if down_entries is None:
        return None
    if down_moe or not block_shape:
        raise ValidationError(
            {"down_entries": "vLLM reads a _down file beside a block-quantised up file only"}
        )
    try:
        checked = config_files.validate_entries(down_entries, vllm_down=True)
    except config_files.ConfigEntryError as exc:
        raise ValidationError({"down_entries": exc.errors}) from None
    return {str(m): entry for m, entry in checked.items()}


def _check_compile_checked(record, *, device_name, entries):
    """ValidationError naming compile_checked where the record cannot be of this file on this
    GPU: another capability than the GPU's, another count of entries, more shared memory than
    the limit."""
    if record is None:
        return
    known = devices.capability_of(device_name)
    if known is not None and record["capability"] != devices.capability_text(known):
        raise ValidationError(
            {
                "compile_checked": f"checked for compute capability {record['capability']}, "
                f"but {device_name} is {devices.capability_text(known)}"
            }
        )
    if record["entries"] != entries:
        raise ValidationError(
            {"compile_checked": f"checked {record['entries']} entries, the file has {entries}"}
        )
    most = record.get("max_shared_bytes")
    if most is not None and most > record["limit_bytes"]:
        raise ValidationError(
            {
                "compile_checked": f"max_shared_bytes {most} is over limit_bytes "
                f"{record['limit_bytes']}: a file that does not fit is not stored as checked"
            }
        )


def _canonical(entries):
    return json.dumps(entries, sort_keys=True)


def _tuned_on(config):
    # the same entries tuned with another Triton or kernel are another record of them
    return (
        config.triton_version,
        config.kernel_engine,
        config.kernel_version,
        config.kernel_source_sha256,
        config.kernel_path,
        _canonical(config.compile_checked),
    )


def tuning_run_create(*, run_uuid=None, host=None, deployment=None, digest=None, **fields):
    """(TuningRun, created); a run_uuid seen before returns that run (a retried create), or
    KeyConflict when it was created from another body.

    A deployment's tune runs on the deployment's host: another host raises ValidationError
    naming host; a run_uuid of another host's or deployment's tune raises TuningConflict.
    digest: the body_sha256 of what the caller was asked (default: of these arguments)."""
    if digest is None:
        digest = body_sha256(
            {"host": host and host.pk, "deployment": deployment and deployment.pk, **fields}
        )
    what = f"tuning run {run_uuid}"
    if deployment is not None and host is not None and deployment.host_id != host.pk:
        raise ValidationError(
            {
                "host": f"deployment {deployment.name!r} runs on host "
                f"{deployment.host.name!r}, not {host.name!r}"
            }
        )
    owned = partial(_same_owner, host=host, deployment=deployment)
    existing = stored_under(TuningRun.objects, run_uuid, digest, what, owned)
    if existing is not None:
        return existing, False
    if run_uuid is not None:
        fields["uuid"] = run_uuid
    if fields.get("status") == "running":
        # created running (the tuning CLI's tunes): it starts now, as jobs.transition would say
        fields["started_at"] = timezone.now()
    try:
        with transaction.atomic():
            row = TuningRun.objects.create(
                host=host, deployment=deployment, body_sha256=digest, **fields
            )
            return row, True
    except IntegrityError:
        return stored_meanwhile(TuningRun.objects, run_uuid, digest, what, owned), False


def tuning_start(
    *,
    deployment,
    dtype,
    batch_sizes,
    engine="builtin",
    force=False,
    run_uuid=None,
    routing="uniform",
    also_under="",
):
    """(TuningRun, created): a queued tune of the deployment's MoE shape on its kernel GPU
    whose `workers.tune_kernel` is sent to its host once committed; a run_uuid seen before is
    that tune, not sent again.

    The shape is the per-rank one at the deployment's tp/ep (E experts per rank, N the
    intermediate size after silu-and-mul); block fp8 takes the model's weight block shape.
    engine: whose kernel is asked for, the deployment's engine (vLLM, SGLang) or "builtin" (the
    worker falls back to builtin where the engine is not installed); force: tune FP4 experts all
    the same (their kernels read no Triton config). Raises ValidationError naming "deployment"
    when its host cannot run a tune now (Deployment.tune_refusal) or its shape does not split
    over its tp/ep, "engine" for another engine's kernel, "force" for FP4 experts unforced,
    "routing" for a routing the worker cannot time under (tuning.routing: uniform, zipf:S,
    dirichlet:A; the tune's timings draw their router choices under it), "also_under" for
    another routing to time the written file and the engine's own under ("": none beyond the
    uniform one a skewed tune times them under).
    """
    routing = routing.strip()
    problem = routing_problem(routing)
    if problem:
        raise ValidationError({"routing": problem})
    also_under = also_under.strip()
    problem = routing_problem(also_under) if also_under else None
    if problem:
        raise ValidationError({"also_under": problem})
    refusal = deployment.tune_refusal()
    if refusal:
        raise ValidationError({"deployment": refusal})
    shape = deployment.moe_shape()
    if shape is None:
        raise ValidationError(
            {
                "deployment": f"The MoE shape of {deployment.model} does not split over "
                f"tp={deployment.tp}, ep={deployment.ep}."
            }
        )
    # moeops reads vLLM's and SGLang's kernels only
    own = deployment.engine if deployment.engine in ENGINE_TITLES else None
    if engine not in ("builtin", own):
        asked = f"{own} (its engine's own) or builtin" if own else "builtin"
        raise ValidationError({"engine": f"a tune of {deployment} asks for {asked}, not {engine}"})
    unread = config_files.triton_config_unread(deployment.weight_quantization)
    if unread and not force:
        raise ValidationError({"force": unread})
    gpu = deployment.kernel_gpu()
    recipe = deployment.launch_recipe()
    block_shape = shape["block_shape"] if dtype == "fp8_w8a8" else None
    with transaction.atomic():
        tuning, created = tuning_run_create(
            run_uuid=run_uuid,
            host=deployment.host,
            deployment=deployment,
            device_name=gpu.name if gpu else "",
            E=shape["experts_per_rank"],
            N=shape["N"],
            hidden_size=shape["hidden_size"],
            topk=shape["topk"],
            dtype=dtype,
            block_shape=block_shape,
            batch_sizes=sorted(batch_sizes),
            engine=engine,
            routing=routing,
            # what was asked: the shape follows the deployment, which may change between retries
            digest=body_sha256(
                {
                    "dtype": dtype,
                    "batch_sizes": sorted(batch_sizes),
                    "engine": engine,
                    "force": force,
                    # a uniform tune's digest is what it was before routings
                    **({"routing": routing} if routing != "uniform" else {}),
                    **({"also_under": also_under} if also_under else {}),
                }
            ),
        )
        if created:
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
                # the worker reads from them which kernel path vLLM takes (and which files)
                "launch_env": recipe.env if recipe else None,
                "launch_argv": recipe.argv if recipe else None,
                **({"routing": routing} if routing != "uniform" else {}),
                **({"also_under": also_under} if also_under else {}),
            }
            host = deployment.host
            jobs.enqueue(
                tuning,
                lambda: send_host_task("tune_kernel", host, kwargs=kwargs),
                what="workers.tune_kernel",
            )
    return tuning, created


def _same_owner(tuning_run, host, deployment):
    # a retry may leave out what the first create named, never name another
    if (host is not None and tuning_run.host_id != host.pk) or (
        deployment is not None and tuning_run.deployment_id != deployment.pk
    ):
        raise TuningConflict(f"tuning run {tuning_run.uuid} belongs to another host or deployment")
    return tuning_run


def tuning_run_update(*, tuning_run, status=None, takeover=None, **fields):
    """Progress, then status (moeops.jobs.transition: a finished one runs the job-finished
    hook), result, wall_s … in one transaction. Raises TuningConflict for a status the tune
    cannot move to. takeover: the attempt a new delivery takes the running tune over as
    (moeops.jobs.take_over, with the progress given); else a progress of an attempt older than
    the tune's is refused (TuningConflict), the status change with it."""
    with transaction.atomic():
        if takeover is not None:
            progress = fields.pop("progress", None)
            jobs.take_over(
                tuning_run,
                attempt=takeover,
                progress=progress,
                conflict=TuningConflict,
                what="tuning run",
            )
        elif "progress" in fields:
            progress = fields.pop("progress")
            jobs.progress_update(tuning_run, progress, conflict=TuningConflict, what="tuning run")
        if status is not None and status != tuning_run.status:
            _tuning_transition(tuning_run, status)
        if fields:
            TuningRun.objects.filter(pk=tuning_run.pk).update(**fields)
            for key, value in fields.items():
                setattr(tuning_run, key, value)
    return tuning_run


def tuning_run_cancel(*, tuning_run):
    """Cancel a queued or running tune. A running tune's worker reads the status with its next
    progress push and stops its GPU processes; what it tuned stays in its log on the host.
    Raises TuningConflict when the tune has finished."""
    _tuning_transition(tuning_run, "cancelled")
    return tuning_run


def tuning_run_fail_stale(*, now=None):
    """Fail each running tune whose host's worker is lost (moeops.jobs.worker_lost); returns
    how many. A tune pushes no heartbeat of its own: its host's worker's stands for it."""
    now = now or timezone.now()
    failed = 0
    for tune in TuningRun.objects.filter(status="running", host__isnull=False).select_related(
        "host"
    ):
        if jobs.worker_lost(tune.host, now):
            error = (
                f"The worker of host {tune.host.name} stopped sending heartbeats "
                f"{jobs.ago(tune.host.silent_for(now))}: the tune was lost."
            )
            failed += jobs.transition(tune, "failed", error=error)
    return failed


def tuning_start_for_plan_item(*, item, user):
    """Start the re-tune a plan item asks for (PlanItem.retunes): the deployment's engine's own
    kernel at its MoE shape, dtype and GPU, the usual batch sizes. The item is in progress; once
    the tune succeeds a managed deployment's engine gets the config, restarts and is re-swept
    (moeops.engines.services.engine_action_tune_finished), so only staff may start it there.
    Raises PermissionDenied, or ValueError with the sentence that says why not."""
    deployment = item.deployment
    permissions.require_tune_for_plan_item(user, deployment)
    if not item.retunes():
        raise ValueError(f"Plan item “{item.title}” starts no tune.")
    shape = deployment.kernel_shape()
    if shape is None or shape.get("dtype") is None:
        reason = (shape or {}).get("reason") or "its MoE shape cannot be read"
        raise ValueError(f"{deployment} loads no kernel config: {reason}.")
    with transaction.atomic():
        try:
            # first: a tune started for an item that moved meanwhile is rolled back unsent
            insights_services.plan_item_transition(
                item=item, status="in_progress", expected="pending"
            )
            tuning, _ = tuning_start(
                deployment=deployment,
                dtype=shape["dtype"],
                batch_sizes=config_files.TUNED_BATCH_SIZES,
                engine=deployment.engine,
            )
        except ValidationError as exc:
            raise ValueError(" ".join(exc.messages)) from exc
        TuningRun.objects.filter(pk=tuning.pk).update(plan_item=item)
    tuning.plan_item = item
    return tuning


def _tuning_transition(tuning_run, status):
    if not jobs.transition(tuning_run, status):
        raise TuningConflict(
            f"tuning run {tuning_run.pk} is {tuning_run.status}; it cannot become {status}"
        )


def tuning_timings_record(*, tuning_run, timings):
    """Store per-batch-size timings once each; returns (created, already stored) counts.

    timings: dicts of TuningTiming fields (tuned_us, default_us, shipped_us, floor_us in µs;
    picked). A batch size stored before with the same figures is a repeat (a resent push);
    TuningConflict for one stored with other figures, or a new batch size of a finished tune.
    """
    with transaction.atomic():
        locked = TuningRun.objects.select_for_update().get(pk=tuning_run.pk)
        known = {t.batch_size: t for t in locked.timings.all()}
        for timing in timings:
            stored = known.get(timing["batch_size"])
            if stored is not None and _timing_fields(stored, timing) != timing:
                raise TuningConflict(
                    f"the timing of batch size {timing['batch_size']} was stored with other "
                    "figures; a stored timing is not replaced"
                )
        fresh = [t for t in timings if t["batch_size"] not in known]
        if fresh and locked.is_finished:
            raise TuningConflict(
                f"tuning run {locked.uuid} is {locked.status}: "
                "a finished tune takes no more timings"
            )
        TuningTiming.objects.bulk_create([TuningTiming(run=tuning_run, **t) for t in fresh])
    return len(fresh), len(timings) - len(fresh)


def _timing_fields(stored, timing):
    """The stored timing's values of the fields a push names, to compare with the push."""
    return {name: getattr(stored, name) for name in timing}


def engine_diff_store(*, report, provenance=""):
    """An EngineDiff from a `python -m tuning engine-diff --json` report (a worker's push or an
    upload); raises ValidationError naming "report" with the field that is wrong."""
    try:
        engine_diff_report.checked_report(report)
    except engine_diff_report.ReportError as exc:
        raise ValidationError({"report": str(exc)}) from None
    if report["engine"] not in ENGINE_TITLES:
        raise ValidationError({"report": f"engine must be one of {', '.join(ENGINE_TITLES)}"})
    return EngineDiff.objects.create(
        engine=report["engine"],
        from_version=report["old"]["version"][:100],
        to_version=report["new"]["version"][:100],
        device_name=report["device_name"][:100],
        shape=report["shape"],
        report=report,
        provenance=provenance[:300],
    )
