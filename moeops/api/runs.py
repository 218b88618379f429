"""Sweep runs, their levels, GPU telemetry, engine samples, and imports of result files."""

import datetime as dt
from typing import Annotated, Any, Literal
from uuid import UUID

from django.db.models import Prefetch, Q
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import ConfigDict, Field, WithJsonSchema

from domain.wire.levels import Level
from domain.wire.runs import (
    EngineSample,
    EngineSamples,
    JobStatus,
    Observed,
    RunPatch,
    Telemetry,
    TelemetrySample,
)
from moeops import jobs
from moeops.api import lookups
from moeops.api.auth import HostWrite, require_host
from moeops.api.fields import (
    CreatedRange,
    In,
    JsonObject,
    LongText,
    PosInt,
    in_range,
    matching,
    one_of,
    text,
)
from moeops.api.openapi import may_answer
from moeops.api.paging import Page
from moeops.api.responses import stored
from moeops.runs import exports, measurements, services, snapshots
from moeops.runs.costs import level_costs
from moeops.runs.importers import FORMATS
from moeops.runs.models import RUN_SOURCES, LevelResult, RequestLog
from moeops.runs.parameters import (
    DEFAULT_PROFILE_STEPS,
    MAX_PROFILE_STEPS,
    Concurrency,
    RunParameters,
)

router = Router(tags=["runs"])

RunSource = one_of(RUN_SOURCES)
ResultFormat = Literal[FORMATS]
# --------------------------------------------------------------------------- runs


class RunIn(In):
    deployment: text(200, min_length=1) = Field(description="deployment id or name")
    uuid: UUID | None = Field(
        None, description="chosen by the client so that a retried create stores one run"
    )
    label: text(200) = ""
    parameters: Annotated[JsonObject, WithJsonSchema(RunParameters.model_json_schema())] = Field(
        {}, description="levels, input_len, output_len, prompts_per_level, warmup, …"
    )
    source: Literal["worker", "manual"] = "worker"
    kernel_config: PosInt | None = Field(None, description="kernel config id")
    topology_snapshot: PosInt | None = Field(None, description="topology snapshot id")
    provenance: text(300) = ""
    start: bool = Field(
        False,
        description="queue the sweep on the deployment's host, as the deployment page's Run "
        "sweep does: parameters need levels, input_len and output_len; base_url, model, "
        "gpu_indices and vocab_size come from the deployment. A capacity search: parameters "
        'kind "capacity", slo_profile (id or name; default: the deployment\'s), start, and '
        "optionally end, budget, mode (concurrency or request_rate), rounds (default 3)",
    )


class RunOut(Schema):
    id: int
    uuid: UUID
    deployment: int = Field(alias="deployment_id")
    deployment_name: str = Field(alias="deployment.name")
    host: str = Field(alias="deployment.host.name")
    label: str
    parameters: dict[str, Any]
    status: str
    source: str
    progress: dict[str, Any]
    kernel_config: int | None = Field(alias="kernel_config_id")
    topology_snapshot: int | None = Field(alias="topology_snapshot_id")
    telemetry_status: str
    telemetry_detail: str
    error: str
    cancel_requested: bool
    provenance: str
    snapshot: dict[str, Any] = Field(
        description="what the run measured, recorded once: engine and version as the engine "
        "answered, its arguments, kernel config in effect, topology, load"
    )
    created: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    capacity: dict[str, Any] | None = Field(
        None,
        description="a capacity search's answer once it ended (docs/metrics.md): load and "
        "load_on_medians (concurrency or req/s), their brackets, end, binding {metric, "
        "percentile, figure, limit, sentence}, at_capacity {output_throughput, per_gpu, "
        "per_user, request_goodput, cap_share, gpu_util, power_w, …} and the probes",
    )
    level_count: int = Field(0, description="levels stored")
    peak_output_throughput: float | None = Field(None, description="tok/s, best level")

    @staticmethod
    def resolve_peak_output_throughput(obj):
        return getattr(obj, "peak", None)


class RunFilter(CreatedRange):
    deployment: text(200) | None = Field(None, description="deployment name or id")
    host: text(200) | None = Field(None, description="host name")
    model: text(200) | None = Field(None, description="model name")
    status: JobStatus | None = None
    source: RunSource | None = None


def _run_out(run):
    return lookups.get_run(run.pk, summary=True)


@router.post("/runs", auth=HostWrite(), response={200: RunOut, 201: RunOut})
@may_answer(503)
def run_create(request, payload: RunIn):
    """Create a queued run, and with `start` send its sweep to the host's worker; with a `uuid`
    seen before, the existing run (200)."""
    deployment = lookups.get_deployment(payload.deployment)
    require_host(request, deployment.host)
    kernel_config = topology = None
    if payload.kernel_config is not None:
        kernel_config = lookups.get_kernel_config(payload.kernel_config)
    if payload.topology_snapshot is not None:
        topology = lookups.by_id(
            deployment.host.topology_snapshots.all(), "topology snapshot", payload.topology_snapshot
        )
    fields = {
        "deployment": deployment,
        "run_uuid": payload.uuid,
        "label": payload.label,
        "parameters": payload.parameters,
        "kernel_config": kernel_config,
        "topology_snapshot": topology,
        "provenance": payload.provenance,
    }
    if payload.start:
        if payload.source != "worker":
            raise HttpError(400, "source: a started sweep is run by the host's worker")
        run, created = services.run_start(**fields)
        if created and jobs.never_sent(run):
            # the run is kept, failed with the reason; the client must not take it as started
            raise HttpError(
                503, f"{run.error}. Run {run.uuid} was stored as failed; start a new one."
            )
    else:
        run, created = services.run_create(source=payload.source, **fields)
    return stored(created, _run_out(run))


@router.get("/runs", response=list[RunOut])
@paginate(Page)
def run_list(request, filters: Query[RunFilter]):
    """Runs, newest first, with their level count and peak output throughput."""
    queryset = in_range(lookups.runs_with_summary(), filters)
    if filters.deployment is not None:
        condition = Q(deployment__name=filters.deployment)
        pk = lookups.as_id(filters.deployment)
        if pk is not None:
            condition |= Q(deployment_id=pk)
        queryset = queryset.filter(condition)
    return matching(
        queryset,
        filters,
        "status",
        "source",
        host="deployment__host__name",
        model="deployment__model__name",
    )


class Change(Schema):
    section: str
    key: str
    a: Any = None
    b: Any = None


class RunDiffOut(Schema):
    a: UUID
    b: UUID
    changes: list[Change]
    unknown: list[str] = Field(description="what one of the runs did not record")


@router.get("/runs/diff", response=RunDiffOut)
@may_answer(404)
def run_diff(request, a: UUID, b: UUID):
    """What differs from run a to run b: engine version, each launch argument, the kernel
    config in effect, topology and load, from their snapshots."""
    run_a, run_b = lookups.get_run(a), lookups.get_run(b)
    diff = snapshots.snapshot_diff(run_a.snapshot, run_b.snapshot)
    return {"a": run_a.uuid, "b": run_b.uuid, **diff}


# --------------------------------------------------------------------------- imports


class RunImportIn(In):
    format: ResultFormat = Field(
        description="sglang: bench_serving --output-file JSONL; vllm: --save-result JSON "
        "(--save-detailed: its requests kept); moeops: a run's per-request export (JSONL or "
        "CSV); aiperf: profile_export_aiperf.json; guidellm: benchmarks.json (its requests "
        "kept); inference-perf: stage_N_lifecycle_metrics.json"
    )
    deployment: text(200, min_length=1) = Field(description="deployment id or name")
    content: LongText = Field(description="the file's text")
    requests_content: LongText = Field(
        "",
        description="the file beside content. aiperf: the level's per-request records "
        "(profile_export.jsonl, beside the summary), kept as its request log; inference-perf: "
        "its run configuration (the config.yml given to --config_file, or its report folder's "
        "config.yaml), which names the model and engine",
    )
    file_name: text(300) = ""
    label: text(200) = ""
    accept_mismatch: bool = Field(
        False,
        description="import a file that states another model, TP, GPU count or engine than "
        "the deployment's (else 409 naming what differs); a file of another model then feeds "
        "none of the deployment's estimates, headlines or comparisons",
    )


class RunImported(Schema):
    run: RunOut
    levels: int


@router.post("/runs/import", auth=HostWrite(), response={200: RunImported, 201: RunImported})
def run_import(request, payload: RunImportIn):
    """Import a result file as a finished run, one level per object (the same file again: 200).

    A line that is not JSON or lacks the throughput keys is a 400 listing the line numbers; a
    file that states another model, TP, GPU count or engine than the deployment is a 409 naming
    each, unless accept_mismatch. Then nothing is stored.
    """
    deployment = lookups.get_deployment(payload.deployment)
    require_host(request, deployment.host)
    run, created = services.run_import(
        deployment=deployment,
        fmt=payload.format,
        text=payload.content,
        label=payload.label,
        file_name=payload.file_name,
        accept_mismatch=payload.accept_mismatch,
        requests_text=payload.requests_content,
    )
    run = _run_out(run)
    return stored(created, {"run": run, "levels": run.level_count})


@router.get("/runs/{ref}", response=RunOut)
def run_get(request, ref: str):
    """A run by id or UUID; workers read `cancel_requested` here between requests."""
    return lookups.get_run(ref, summary=True)


@router.patch("/runs/{ref}", auth=HostWrite(), response=RunOut)
def run_patch(request, ref: str, payload: RunPatch):
    """Status by compare-and-set (409 on an illegal move such as succeeded → running), progress."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    services.run_update(run=run, **payload.model_dump(exclude_unset=True))
    return _run_out(run)


@router.post("/runs/{ref}/snapshot", auth=HostWrite(), response={200: RunOut, 201: RunOut})
def run_record_observed(request, ref: str, payload: Observed):
    """Add what the worker observed to the run's snapshot: 201 when something was added, 200
    when every part was already recorded (a snapshot is written once and never rewritten)."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    added = services.run_record_observed(run=run, observed=payload.model_dump(exclude_none=True))
    return stored(added, _run_out(run))


@router.post("/runs/{ref}/cancel", auth=HostWrite(), response=RunOut)
def run_cancel(request, ref: str):
    """A queued run is cancelled; a running one gets cancel_requested for its worker."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    services.run_cancel(run=run)
    return _run_out(run)


class ProfileAgainIn(In):
    """Which level of a finished sweep to sweep again with a profiled pass."""

    concurrency: Concurrency | None = Field(
        None, description="one of the run's levels (default: its peak output tok/s level)"
    )
    steps: Annotated[int, Field(strict=True, ge=1, le=MAX_PROFILE_STEPS)] = DEFAULT_PROFILE_STEPS


@router.post("/runs/{ref}/profile-again", auth=HostWrite(), response={201: RunOut})
def run_profile_again(request, ref: str, payload: ProfileAgainIn):
    """A new queued run of one level of this run's load, profiled after its rounds."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    again, _ = services.run_profile_again(
        run=run, concurrency=payload.concurrency, steps=payload.steps
    )
    return Status(201, _run_out(again))


# --------------------------------------------------------------------------- levels


class LevelOut(Schema, Level):
    """A level: with several rounds, the median of its rounds' figures (counts summed) and a
    95 % interval over them (docs/metrics.md)."""

    # read from stored rows, whose types the write already held to Level's
    model_config = ConfigDict(strict=False)

    id: int
    run: int = Field(alias="run_id")
    key: str
    request_rate: float | None = None
    round: int = Field(description="the last round stored")
    rounds: list[int] = Field(description="the rounds stored; [1] for a level run once")
    # a list of two, not tuple[float, float]: schemathesis (4.32) validates answers against the
    # prefixItems a tuple gives as if they were draft 4's `items` and fails (its issue 3842)
    intervals: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]] = Field(
        description="figure → [low, high], 95 % over the rounds; empty for one round"
    )
    created: dt.datetime
    request_log: int = Field(0, description="requests stored with the level, all rounds")
    engine_figures: dict[str, float | str | None] = Field(
        description="what the level did to the engine, from its /metrics counters: "
        "prefix_cache_hit_rate, preemptions, spec_acceptance_rate, spec_accept_length, "
        "engine_prompt_tokens, engine_generation_tokens, prompt_tokens_gap, "
        "generation_tokens_gap (docs/metrics.md); empty without counters"
    )

    @staticmethod
    def resolve_engine_figures(obj):
        return obj.engine_figures()

    @staticmethod
    def resolve_request_log(obj):
        return sum(log.count for log in obj.request_logs.all())

    @staticmethod
    def resolve_rounds(obj):
        return [r.round for r in obj.stored_rounds()]

    @staticmethod
    def resolve_round(obj):
        return max(r.round for r in obj.stored_rounds())


@router.post("/runs/{ref}/levels", auth=HostWrite(), response={200: LevelOut, 201: LevelOut})
def level_record(request, ref: str, payload: Level):
    """Store a level once per (run, concurrency, request rate): 201 the first time, 200 after."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    level, created = measurements.level_record(run=run, **payload.model_dump())
    return stored(created, level)


class DerivedFigure(Schema):
    """A figure derived from what is recorded (docs/metrics.md), or null with the reason."""

    value: float | None
    unit: str
    absent_because: str = Field(
        description="why value is null; empty when it is not", alias="reason"
    )


class LevelWithCostOut(LevelOut):
    cost_per_million_output_tokens: DerivedFigure = Field(
        description="in the host's currency per 10⁶ output tokens", alias="costs.cost"
    )
    energy_per_output_token: DerivedFigure = Field(
        description="J per output token", alias="costs.energy"
    )


@router.get("/runs/{ref}/levels", response=list[LevelWithCostOut])
def level_list(request, ref: str):
    """The run's levels, each with its rounds, its cost per million output tokens and energy per
    output token (or why either is absent)."""
    run = lookups.get_run(ref)
    logs = Prefetch("request_logs", queryset=RequestLog.objects.defer("data"))
    levels = list(LevelResult.objects.filter(run=run).prefetch_related("rounds", logs))
    costs = level_costs(run, levels, run.measured_gpu_count())
    for level in levels:
        level.costs = costs[level.key]
    return levels


@router.get("/runs/{ref}/vllm-results", response=list[dict[str, Any]])
def level_vllm_results(request, ref: str):
    """The run's levels as `vllm bench serve --save-result` objects, one per level under vLLM's
    key names (`request_rate` "inf" when unlimited): the summary.json that `vllm bench sweep
    plot` reads, and that `import-results --format vllm` takes back (docs/formats.md)."""
    run = lookups.get_run(ref)
    return exports.vllm_results(run, exports.levels_in_order(run))


# --------------------------------------------------------------------------- telemetry


class BatchOut(Schema):
    run: int = Field(alias="run_id")
    batch_id: str
    kind: str
    count: int


class TelemetrySampleOut(Schema, TelemetrySample):
    ts: float


class EngineSampleOut(Schema, EngineSample):
    ts: float


def _samples_record(request, ref, payload, record):
    """Store a batch of the run's samples with `record` (measurements.telemetry_record or
    engine_samples_record) once the token may write the run's host: 201, or 200 for a batch
    stored before."""
    run = lookups.get_run(ref)
    require_host(request, run.deployment.host)
    samples = [sample.__dict__ for sample in payload.samples]
    batch, created = record(run=run, batch_id=payload.batch_id, samples=samples)
    return stored(created, batch)


@router.post("/runs/{ref}/telemetry", auth=HostWrite(), response={200: BatchOut, 201: BatchOut})
def telemetry_record(request, ref: str, payload: Telemetry):
    """Store a batch of GPU samples once per batch_id (thousands per request)."""
    return _samples_record(request, ref, payload, measurements.telemetry_record)


@router.get("/runs/{ref}/telemetry", response=list[TelemetrySampleOut])
@paginate(Page)
def telemetry_list(request, ref: str):
    """The run's GPU samples in time order."""
    return lookups.get_run(ref).telemetry.order_by("ts", "gpu_index", "id")


@router.post(
    "/runs/{ref}/engine-samples", auth=HostWrite(), response={200: BatchOut, 201: BatchOut}
)
def engine_samples_record(request, ref: str, payload: EngineSamples):
    """Store a batch of engine /metrics samples once per batch_id."""
    return _samples_record(request, ref, payload, measurements.engine_samples_record)


@router.get("/runs/{ref}/engine-samples", response=list[EngineSampleOut])
@paginate(Page)
def engine_sample_list(request, ref: str):
    return lookups.get_run(ref).engine_samples.order_by("ts", "id")
