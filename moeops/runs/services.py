"""Writes to sweep runs: create, start (the sweep sent to the host's worker), status moves
(moeops.jobs), failing runs whose worker is lost, levels, telemetry (of sweeps and kernel
tunes), profiled levels (the worker's and traces uploaded by hand), imported files."""

import hashlib
import logging
import secrets
import time
from functools import partial

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from domain import engine as engine_reports
from domain import request_log
from domain.levels import MAX_SEED
from domain.progress import HEARTBEAT_STALE_S, SweepProgress
from domain.step_breakdown import DEFAULT_PROFILE_STEPS
from moeops import jobs
from moeops.celery import send_host_task
from moeops.fleet.endpoints import endpoint_refusal
from moeops.keyed import body_sha256, stored_meanwhile, stored_under
from moeops.runs import capacity, importers, snapshots
from moeops.runs.keys import level_key
from moeops.runs.levels import level_request_log
from moeops.runs.models import LevelResult, LevelRound, RequestLog, SweepRun
from moeops.runs.parameters import parameters_checked
from moeops.runs.workloads import sweep_task_kwargs, workload_lookup
from tuning.moe_params import vocab_size

log = logging.getLogger(__name__)


class RunConflict(Exception):
    """The run cannot do that from where it is (e.g. a finished run asked to run again)."""


def closed_to(run, what):
    """Raise RunConflict when the run (a locked row) is finished: it takes no more `what`."""
    if run.is_finished:
        raise RunConflict(f"run {run.uuid} is {run.status}: a finished run takes no more {what}")


def run_create(
    *,
    deployment,
    run_uuid=None,
    label="",
    parameters=None,
    source="worker",
    kernel_config=None,
    topology_snapshot=None,
    provenance="",
    recipe=None,
    digest=None,
):
    """(SweepRun, created); a run_uuid seen before returns that run (a retried create), or
    KeyConflict when it was created from another body.

    The run's snapshot records the deployment, topology and load as they are now, and the
    launch recipe its engine runs (recipe; default: the one in force, for a managed one).
    digest: the body_sha256 of what the caller was asked (default: of these arguments)."""
    # one schema for every path that writes parameters: ValidationError naming the key
    parameters = parameters_checked(parameters)
    if digest is None:
        digest = body_sha256(
            {
                "label": label,
                "parameters": parameters,
                "source": source,
                "kernel_config": kernel_config and kernel_config.pk,
                "topology_snapshot": topology_snapshot and topology_snapshot.pk,
                "provenance": provenance,
            }
        )
    what = f"run {run_uuid}"
    owned = partial(_same_deployment, deployment=deployment)
    existing = stored_under(SweepRun.objects, run_uuid, digest, what, owned)
    if existing is not None:
        return existing, False
    fields = {
        "body_sha256": digest,
        "deployment": deployment,
        "label": label,
        "parameters": parameters or {},
        "source": source,
        "kernel_config": kernel_config,
        "topology_snapshot": topology_snapshot,
        "provenance": provenance,
        "snapshot": snapshots.initial_snapshot(
            deployment=deployment,
            parameters=parameters or {},
            topology=topology_snapshot,
            source=source,
            recipe=recipe,
        ),
    }
    if run_uuid is not None:
        fields["uuid"] = run_uuid
    try:
        with transaction.atomic():
            return SweepRun.objects.create(**fields), True
    except IntegrityError:
        return stored_meanwhile(SweepRun.objects, run_uuid, digest, what, owned), False


def run_start(*, deployment, parameters, label="", run_uuid=None, topology_snapshot=None, **fields):
    """(SweepRun, created): a queued run whose sweep `workers.run_sweep` is sent to the
    deployment's host once the run is committed; a run_uuid seen before is that run, not sent
    again.

    parameters: levels (list of concurrencies), input_len and output_len (tokens),
    prompts_per_level, warmup (requests), endpoint ("completions" or "chat"), …; base_url,
    model, gpu_indices and vocab_size are set from the deployment (prompt token ids are drawn
    below its model's vocab_size). topology_snapshot: the host's current one unless given;
    fields: as run_create takes them. Raises ValidationError naming the field when the
    deployment has no endpoint URL or levels, input_len or output_len is missing.
    """
    # the load as asked: what run_start adds (a seed, the host's topology now) is no part of it
    digest = body_sha256(
        {
            "start": True,
            "label": label,
            "parameters": parameters,
            "topology_snapshot": topology_snapshot and topology_snapshot.pk,
            **{k: getattr(v, "pk", v) for k, v in fields.items()},
        }
    )
    parameters = sweep_parameters(deployment=deployment, load=parameters)
    with transaction.atomic():
        run, created = run_create(
            deployment=deployment,
            run_uuid=run_uuid,
            label=label,
            parameters=parameters,
            source="worker",
            topology_snapshot=topology_snapshot or deployment.host.current_topology(),
            digest=digest,
            **fields,
        )
        if created:
            _sweep_send(run, deployment.host, parameters)
    return run, created


# What a sweep's parameters take from the deployment rather than from the load asked for.
DEPLOYMENT_PARAMETERS = ("base_url", "model", "gpu_indices", "vocab_size")
# What is a run's own rather than its load's: a run that repeats another's load draws its own
# prompts (a new seed), or the engine's prefix cache serves it the prompts the other warmed.
RUN_OWN_PARAMETERS = ("run_uuid", "seed")


def repeated_load(parameters: dict) -> dict:
    """The load of a run's parameters, to sweep again: without what is the run's own."""
    return {k: v for k, v in parameters.items() if k not in RUN_OWN_PARAMETERS}


def sweep_parameters(*, deployment, load):
    """The parameters of a sweep of the deployment with this load (levels, input_len, …): the
    load checked (ValidationError naming the field) and what comes from the deployment added
    (its endpoint, request model name, GPUs and its model's vocabulary), and a seed of its own
    for the prompts unless the load gives one (RUN_OWN_PARAMETERS). A `workload` named
    in the load (id, name, "name v3", or a run's record of it) becomes its record and spec
    (Workload.run_parameter)."""
    _check_sweep(deployment, load)
    if capacity.is_capacity(load):
        load = capacity.search_parameters(deployment=deployment, load=load)
    parameters = {
        **{k: v for k, v in load.items() if k not in DEPLOYMENT_PARAMETERS},
        "base_url": deployment.endpoint_url,
        "model": deployment.request_model_name,
        "gpu_indices": deployment.gpu_indices(),
        "vocab_size": vocab_size(deployment.model.config_json),
    }
    if parameters.get("seed") is None:
        parameters["seed"] = secrets.randbelow(MAX_SEED + 1)
    if load.get("workload") is not None:
        workload = workload_lookup(load["workload"])
        if workload.kind == "multi_turn":
            # its turns are chat messages: the completions endpoint has no history to send
            parameters["endpoint"] = "chat"
        if workload.kind == "trace":
            _check_trace_load(load)
        parameters["workload"] = workload.run_parameter()
    return parameters


def _check_trace_load(load):
    """A trace sends at its own timestamps: a request rate or a capacity search (which chooses
    loads) would not be what it says."""
    if capacity.is_capacity(load):
        raise ValidationError(
            {"parameters.workload": "a trace sends at its own timestamps: no capacity search"}
        )
    for key in ("request_rate", "request_rates", "burstiness", "ramp_up_s"):
        if load.get(key) not in (None, [], ()):
            raise ValidationError(
                {f"parameters.{key}": "a trace sends at its own timestamps (its speed sets how "
                 "fast): its levels are concurrency caps"}
            )  # fmt: skip


def _check_sweep(deployment, parameters):
    if not deployment.endpoint_url:
        raise ValidationError(
            {"endpoint_url": f"deployment {deployment.name!r} has no endpoint URL to sweep"}
        )
    # an endpoint stored before the allow-list, or since taken off it, is not swept
    refusal = endpoint_refusal(host=deployment.host, url=deployment.endpoint_url)
    if refusal:
        raise ValidationError({"endpoint_url": refusal})
    parameters = parameters_checked(parameters)
    if capacity.is_capacity(parameters):
        if parameters.get("start") is None:
            raise ValidationError({"parameters.start": "a capacity search needs a start load"})
    elif parameters.get("levels") is None:
        raise ValidationError(
            {"parameters.levels": "a sweep needs a list of concurrencies, each at least 1"}
        )
    for key in ("input_len", "output_len"):
        if parameters.get(key) is None:
            raise ValidationError(
                {f"parameters.{key}": "a sweep needs a token count of at least 1"}
            )


def _same_deployment(run, deployment):
    if run.deployment_id != deployment.pk:
        raise RunConflict(f"run {run.uuid} belongs to another deployment")
    return run


def run_transition(*, run, status, error=""):
    """Move the run to `status` (moeops.jobs.transition); the same status again is a no-op.
    Raises RunConflict when the run's status does not lead there (it moved meanwhile, or
    finished)."""
    if run.status == status:
        return run
    if not jobs.transition(run, status, **({"error": error} if error else {})):
        raise RunConflict(f"run {run.pk} is {run.status}; it cannot become {status}")
    return run


def run_heartbeat_age(run, now_epoch):
    """s since the run's worker last pushed its progress heartbeat (an epoch), or None."""
    beat = SweepProgress.read(run.progress).heartbeat
    return None if beat is None else max(now_epoch - beat, 0.0)


def run_heartbeat_stale(run, now_epoch, limit_s):
    """Whether a running run's worker is gone: no heartbeat for limit_s (s), counting from its
    start when it never sent one."""
    if run.status != "running":
        return False
    age = run_heartbeat_age(run, now_epoch)
    if age is None:
        started = run.started_at.timestamp() if run.started_at else None
        age = now_epoch - started if started is not None else None
    return age is not None and age > limit_s


def run_fail_stale(*, now=None):
    """Fail each running run whose own heartbeat is older than MOEOPS_RUN_STALE_S (its worker
    pushes one every second), finished levels kept; returns how many. Without this a sweep
    whose worker died waits for the broker's visibility timeout (hours) to be handed out
    again."""
    epoch = (now or timezone.now()).timestamp()
    limit = settings.MOEOPS_RUN_STALE_S
    failed = 0
    for run in SweepRun.objects.filter(status="running"):
        if not run_heartbeat_stale(run, epoch, limit):
            continue
        resent = SweepProgress.read(run.progress).resent_at
        if resent is not None and epoch - resent <= limit:
            # sent again to the worker that came back (run_resend_orphaned): its turn
            continue
        error = (
            f"The worker stopped sending heartbeats {jobs.ago(run_heartbeat_age(run, epoch))}: "
            "it was lost mid-sweep. Finished levels are kept. It will not be resumed: no worker "
            f"of the host took it back within {_minutes(limit)}; start a new sweep "
            "for the levels left."
        )
        failed += jobs.transition(run, "failed", error=error)
    return failed


def _minutes(seconds):
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def run_resend_orphaned(*, now=None):
    """Send the sweep of each running run whose worker was lost again, once the host's worker
    is back; returns how many. A worker killed whole leaves its task unacknowledged in Redis,
    which hands it out again only after the visibility timeout (hours): this is how a restarted
    worker takes the sweep back, as attempt + 1, from its stored levels.

    Lost and back: the run sent no progress heartbeat for HEARTBEAT_STALE_S (a sweeping worker
    sends one every second) and the host's worker has sent one of its own more than
    HEARTBEAT_STALE_S after the run's last, so it is alive and not sweeping this run. Sent once
    per loss (progress.resent_at); the delivery takes the run over by the takeover rule
    (workers.sweep), and a duplicate finds it busy or finished."""
    now = now or timezone.now()
    epoch = now.timestamp()
    resent = 0
    for run in SweepRun.objects.filter(status="running", source="worker").select_related(
        "deployment__host"
    ):
        loss = run.worker_loss(now)
        # not lost; lost and its worker not back yet; or sent again already for this loss
        if loss is None or not loss.back or loss.resent_at is not None:
            continue
        beat, host = SweepProgress.read(run.progress).heartbeat, run.deployment.host
        with transaction.atomic():
            locked = SweepRun.objects.select_for_update().get(pk=run.pk)
            # a worker that reported meanwhile is sweeping it
            if locked.status != "running" or SweepProgress.read(locked.progress).heartbeat != beat:
                continue
            SweepRun.objects.filter(pk=run.pk).update(
                progress={**locked.progress, "resent_at": epoch}
            )
            _sweep_send(run, host, run.parameters, fail=_resend_failed)
        resent += 1
        log.info("run %s: its worker is back; sweep sent again", run.uuid)
    return resent


def _sweep_send(run, host, parameters, **options):
    """Send the run's sweep (workers.run_sweep of these parameters) to the host's queue once the
    run is committed; options: jobs.enqueue's (fail=)."""
    kwargs = sweep_task_kwargs(run.uuid, parameters)
    jobs.enqueue(
        run,
        lambda: send_host_task("run_sweep", host, kwargs=kwargs),
        what="workers.run_sweep",
        **options,
    )


def _resend_failed(run, error):
    # the run stays running: the reaper fails it if no worker takes it back in time
    log.warning("run %s could not be sent again: %s", run.uuid, error)


def run_take_over(*, run, attempt, progress):
    """A new delivery of a running run whose worker is gone takes it over as `attempt`
    (moeops.jobs.take_over: compare-and-set on the attempt it follows; RunConflict for the
    delivery that comes second)."""
    return jobs.take_over(run, attempt=attempt, progress=progress, conflict=RunConflict, what="run")


def run_update(*, run, status=None, error="", takeover=None, **fields):
    """Status (compare-and-set) and progress, telemetry status, label … in one transaction.
    takeover: the attempt a resumed delivery takes the running run over as (run_take_over,
    with the progress given); else a progress of an attempt older than the run's is refused
    (RunConflict), the status change with it. A finished run takes only a new label, or the
    push that finished it again (RunConflict for anything else it would change)."""
    with transaction.atomic():
        locked = SweepRun.objects.select_for_update().get(pk=run.pk)
        # a takeover of a finished run is refused by run_take_over, in its own words
        if locked.is_finished and takeover is None:
            changed = [k for k, v in fields.items() if k != "label" and getattr(locked, k) != v]
            if error and error != locked.error:
                changed.append("error")
            if changed:
                closed_to(locked, f"writes ({', '.join(changed)})")
        if takeover is not None:
            run_take_over(run=run, attempt=takeover, progress=fields.pop("progress", None))
        elif "progress" in fields:
            jobs.progress_update(run, fields.pop("progress"), conflict=RunConflict, what="run")
        if status is not None:
            run_transition(run=run, status=status, error=error)
            if run.is_finished and run.is_capacity_search:
                run_capacity_record(run=run)
        elif error:
            fields["error"] = error
        if fields:
            SweepRun.objects.filter(pk=run.pk).update(**fields)
            for key, value in fields.items():
                setattr(run, key, value)
    return run


def on_run_finished(run):
    """A capacity search that ended without its answer stored (cancelled, its worker lost, ended
    by the reaper) gets it from the levels it stored (a finished handler, jobs.Step.RECORD:
    before the analysis, which reads it). Returns the answer stored, None when there was nothing
    to do."""
    if not run.is_capacity_search or run.capacity:
        return None
    return run_capacity_record(run=run)


def run_capacity_record(*, run):
    """Store a capacity search's answer from its levels (moeops.runs.capacity.run_answer)."""
    levels = list(run.levels.all())
    run.capacity = capacity.run_answer(run, levels)
    SweepRun.objects.filter(pk=run.pk).update(capacity=run.capacity)
    return run.capacity


def run_record_observed(*, run, observed):
    """Add what the worker observed at the start of the sweep (snapshots.OBSERVED_KEYS) to the
    run's snapshot. A part already recorded is kept as it is: the snapshot is written once, and a
    resumed sweep does not rewrite what the first attempt saw. Returns whether anything was added.
    """
    with transaction.atomic():
        locked = SweepRun.objects.select_for_update().get(pk=run.pk)
        snapshot = dict(locked.snapshot or {})
        added = {
            k: v
            for k, v in observed.items()
            if k in snapshots.OBSERVED_KEYS and v is not None and k not in snapshot
        }
        if added:
            closed_to(locked, "snapshot parts")
            snapshot.update(added)
            SweepRun.objects.filter(pk=run.pk).update(snapshot=snapshot)
        run.snapshot = snapshot
    return bool(added)


def run_profile_again(*, run, concurrency=None, steps=DEFAULT_PROFILE_STEPS):
    """(the queued run, created) that sweeps one level of run's load again with a profiled pass
    after its rounds: `concurrency`, or the run's peak level (its highest output tok/s), where
    a plateau's step is the one to look inside. ValidationError naming the field: a run that no
    worker swept, a capacity search, a concurrency the run did not sweep."""
    if run.source != "worker" or not (run.parameters or {}).get("levels"):
        raise ValidationError({"run": f"{run} was not swept by a worker: no load to repeat"})
    if capacity.is_capacity(run.parameters):
        raise ValidationError({"run": "a capacity search chooses its levels: profile a sweep"})
    if concurrency is None:
        peak = run.peak_level()
        if peak is None:
            raise ValidationError({"concurrency": f"{run} measured no level to profile"})
        concurrency = peak.concurrency
    if concurrency not in run.parameters["levels"]:
        raise ValidationError(
            {"concurrency": f"{run} swept {run.parameters['levels']}, not {concurrency}"}
        )
    load = {
        **repeated_load(run.parameters),
        "levels": [concurrency],
        "profile": {"levels": [concurrency], "steps": steps},
    }
    label = f"{run.display_label()}: inside the step at {concurrency}"[:200]
    return run_start(deployment=run.deployment, parameters=load, label=label)


def run_cancel(*, run):
    """A queued run is cancelled at once; a running one is asked to stop (cancel_requested),
    or cancelled at once when its worker is gone: no progress heartbeat for HEARTBEAT_STALE_S
    (the rule a new delivery takes a run over by; a sweeping worker sends one every second)."""
    if run.status == "queued":
        try:
            return run_transition(run=run, status="cancelled")
        except RunConflict:
            pass
    now = time.time()
    if run.status == "running" and run_heartbeat_stale(run, now, HEARTBEAT_STALE_S):
        silent = run_heartbeat_age(run, now)
        if silent is None and run.started_at is not None:
            silent = now - run.started_at.timestamp()
        try:
            return run_transition(
                run=run,
                status="cancelled",
                error=f"Cancelled while its worker was gone (its last heartbeat "
                f"{jobs.ago(silent)}); finished levels kept.",
            )
        except RunConflict:
            pass
    if run.status == "running":
        SweepRun.objects.filter(pk=run.pk).update(cancel_requested=True)
        run.cancel_requested = True
        return run
    raise RunConflict(f"run {run.pk} is {run.status}; there is nothing to cancel")


# an imported file's model where the file names none: never the deployment's
UNNAMED_MODEL = "an unnamed model"


def _served(model, tp, gpus, engine, version):
    """ "GLM-5 at TP8 (8 GPUs) on SGLang 0.5.5" of what is known."""
    text = model or UNNAMED_MODEL
    if tp:
        text += f" at TP{tp}"
    if gpus:
        text += f" ({gpus} GPU{'s' if gpus != 1 else ''})"
    if engine:
        text += f" on {engine_reports.label({'engine': engine, 'version': version or ''})}"
    return text


def _import_mismatch(deployment, stated):
    """The ResultFileMismatch of a file whose stated facts disagree with the deployment's,
    else None; a fact either side leaves unsaid is no disagreement."""
    names = [deployment.model.name, deployment.model.hf_repo_id, deployment.served_model_name]
    gpus = deployment.num_gpus()
    differences = []
    # a file that names no model is never filed as the deployment's
    if not importers.same_model(stated["model_names"], names):
        differences.append("model")
    if stated["tp"] and stated["tp"] != deployment.tp:
        differences.append("TP")
    if stated["gpu_count"] and gpus and stated["gpu_count"] != gpus:
        differences.append("GPU count")
    if stated["engine"] and stated["engine"] != deployment.engine:
        differences.append("engine")
    else:
        version, recorded = stated["engine_version"], deployment.engine_version
        if version and recorded and version != recorded:
            differences.append("engine version")
    if not differences:
        return None
    measured = _served(
        *(stated[k] for k in ("model", "tp", "gpu_count", "engine", "engine_version"))
    )
    serves = _served(
        deployment.model.name,
        deployment.tp,
        gpus if stated["gpu_count"] else None,
        deployment.engine,
        deployment.engine_version,
    )
    sentence = (
        f"the file measured {measured}; the deployment {deployment.name} serves {serves} "
        f"(they differ in {', '.join(differences)})"
    )
    return importers.ResultFileMismatch(sentence, differences)


def _import_snapshot(deployment, levels, fmt, file_name, stated, mismatch):
    """The imported run's snapshot: the deployment as recorded, with the model, parallelism,
    GPU count, engine and version the file states in place of the deployment's, and the
    differences a confirmed mismatch had (file.mismatch)."""
    snapshot = snapshots.initial_snapshot(
        deployment=deployment, parameters={}, topology=None, source="import"
    )
    snapshot["file"], engine = importers.snapshot_parts(levels, fmt, file_name)
    if engine is not None:
        snapshot["engine"] = engine
    snapshot["file"]["stated"] = {k: v for k, v in stated.items() if k != "model_names"}
    record = snapshot["deployment"]
    if mismatch is not None:
        snapshot["file"]["mismatch"] = mismatch.differences
    if mismatch is not None and "model" in mismatch.differences:
        snapshot["file"]["other_model"] = stated["model"] or UNNAMED_MODEL
        record.update({key: stated.get(key) for key in snapshots.SERVING_KEYS})
        # the deployment's MoE shape and GPUs are not the other model's
        snapshot["kernel_shape"] = None
        record["gpus"] = []
    else:
        # the same model keeps the deployment's name for it: compared runs differ in no model
        serving = {k: v for k, v in stated.items() if k in snapshots.SERVING_KEYS and k != "model"}
        record.update({k: v for k, v in serving.items() if v is not None})
        # GPUs the file does not state (vLLM's never does) are not the host's
        if stated["gpu_count"] != len(record["gpus"]):
            record["gpus"] = []
    return snapshot


def run_import(
    *,
    deployment,
    fmt,
    text,
    label="",
    file_name="",
    provenance="",
    accept_mismatch=False,
    requests_text="",
):
    """(SweepRun, created) for a benchmark result file; each object becomes one level.

    The run is stored finished, with source "import", and its snapshot holds the model,
    parallelism, GPU count, engine and version the file states. The same file imported again
    for the same deployment returns the first run. Raises importers.ResultFileError listing the
    bad lines, or importers.ResultFileMismatch where the file states another model, TP, GPU
    count or engine than the deployment's (unless accept_mismatch); then nothing is stored. A
    file of another model, imported all the same, feeds none of the deployment's estimates,
    headlines or comparisons (models.of_the_deployment), nor its findings. requests_text, the
    file beside it: AIPerf's per-request records of its summary, kept as the level's requests,
    or inference-perf's run configuration, which names the model and engine.
    """
    levels = importers.parse_results(text, fmt, requests_text)
    # the file beside a summary (records, a configuration) is part of what was imported
    whole = f"{text}\0{requests_text}" if requests_text else text
    digest = hashlib.sha256(whole.encode("utf-8", errors="surrogatepass")).hexdigest()
    existing = SweepRun.objects.filter(
        deployment=deployment, source="import", parameters__import_sha256=digest
    ).first()
    if existing is not None:
        return existing, False
    stated = importers.stated_facts(levels, fmt)
    mismatch = _import_mismatch(deployment, stated)
    if mismatch is not None and not accept_mismatch:
        raise mismatch
    now = timezone.now()
    # the file's levels are its rows; "levels" is a sweep's list of concurrencies, not a count
    parameters = parameters_checked(
        {"format": fmt, "file_name": file_name, "import_sha256": digest}
    )
    snapshot = _import_snapshot(deployment, levels, fmt, file_name, stated, mismatch)
    with transaction.atomic():
        run = SweepRun.objects.create(
            deployment=deployment,
            label=label or file_name or f"{fmt} import",
            source="import",
            status="succeeded",
            parameters=parameters,
            snapshot=snapshot,
            telemetry_status="not_collected",
            telemetry_detail="imported from a result file",
            provenance=provenance or f"imported {fmt} result file {file_name}".strip(),
            started_at=now,
            finished_at=now,
        )
        rows, logs, rounds = [], [], []
        for level in levels:
            fields = {k: v for k, v in level.items() if k not in ("line", "requests", "rounds")}
            key = level_key(fields["concurrency"], fields["request_rate"])
            row = LevelResult(run=run, key=key, body_sha256=body_sha256(fields), **fields)
            rows.append(row)
            if level.get("requests") is not None:
                logs.append((row, level_request_log(request_log.pack(level["requests"]), fields)))
            # a per-request export's rounds: each its figures (a level of several) and its log
            for number, figures, columns in level.get("rounds") or ():
                if len(level["rounds"]) > 1:
                    digest = body_sha256(figures)
                    rounds.append(
                        (row, LevelRound(round=number, figures=figures, body_sha256=digest))
                    )
                log = level_request_log(request_log.pack(columns), figures)
                log.round = number
                logs.append((row, log))
        LevelResult.objects.bulk_create(rows)
        for row, item in logs + rounds:
            item.level = row
        LevelRound.objects.bulk_create([r for _, r in rounds])
        RequestLog.objects.bulk_create([log for _, log in logs])
        # stored finished: what follows a finished sweep follows it too (the analysis)
        jobs.job_finished_enqueue(run)
    return run, True
