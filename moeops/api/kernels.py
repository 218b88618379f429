"""Fused-MoE kernel configs in the engines' own file format, and the tuning runs behind them."""

import datetime as dt
import json
from typing import Annotated, Any, Literal
from uuid import UUID

from django.http import HttpResponse
from django.utils.http import content_disposition_header
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import Field, Strict, StringConstraints, field_validator

from domain.wire.fields import Size
from domain.wire.runs import JobStatus, Telemetry
from domain.wire.tunes import (
    KernelEngine,
    KernelPath,
    KernelVersion,
    SourceSha256,
    Timing,
    Timings,
    TuningRunPatch,
)
from moeops.api import lookups
from moeops.api.auth import AnyWrite, HostWrite, require_host
from moeops.api.fields import (
    CreatedRange,
    In,
    JsonObject,
    LongText,
    in_range,
    matching,
    one_of,
    text,
)
from moeops.api.openapi import may_answer
from moeops.api.paging import Page
from moeops.api.responses import stored
from moeops.api.runs import TelemetrySampleOut
from moeops.kernels import services
from moeops.kernels.models import CONFIG_SOURCES, REQUESTED_KERNELS, KernelConfig, TuningRun
from moeops.runs import measurements
from tuning import config_files

router = Router(tags=["kernels"])

KernelDtype = Literal[services.DTYPES]
ConfigSource = one_of(CONFIG_SOURCES)
Style = Literal[config_files.STYLES]
# what the engines' file names can carry: no comma or slash, not blank
DeviceName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=100, pattern=r"^[^,/\x00]*[^,/\s\x00][^,/\x00]*$"),
]
TritonVersion = Annotated[str, StringConstraints(max_length=20, pattern=r"^[\w.+-]*$")]
BlockShape = Annotated[list[Size], Field(min_length=2, max_length=2)]
RequestedKernel = one_of(REQUESTED_KERNELS)


# --------------------------------------------------------------------------- kernel configs


class CheckedKernelIn(In):
    engine: KernelEngine = Field(description="whose kernel it was compiled in: vllm, …")
    version: KernelVersion = ""
    source_sha256: SourceSha256 = ""


class CompileCheckedIn(In):
    """What `python -m tuning compile-check --entries` found compiling the file for its GPU
    (moeops-imports.json beside the files it writes); the file was not timed there."""

    capability: Annotated[str, StringConstraints(pattern=r"^\d{1,2}\.\d$")] = Field(
        description="the GPU's compute capability, e.g. 12.0"
    )
    limit_bytes: Size = Field(description="shared memory one block may opt into there")
    max_shared_bytes: Size | None = Field(None, description="the most an entry's kernels take")
    entries: Size = Field(description="how many entries were compiled: the file's")
    fewer_stages: list[Size] = Field(
        [], max_length=1000, description="batch sizes whose entry lost stages to fit"
    )
    kernel: CheckedKernelIn | None = None
    triton_version: TritonVersion = ""


class KernelConfigImportIn(In):
    file_name: text(300, min_length=1) = Field(
        description="the engine's file name, e.g. E=256,N=256,device_name=NVIDIA_H200.json; "
        "an SGLang triton_3_7_1/ folder in front gives the Triton version"
    )
    content: LongText | JsonObject = Field(description="the file's text, or its JSON object")
    compile_checked: CompileCheckedIn | None = Field(
        None, description="compiled, not timed, for the file's GPU (compile-check --entries)"
    )


class KernelConfigIn(In):
    device_name: DeviceName = Field(description="NVML name, e.g. NVIDIA H200")
    E: Size = Field(description="experts per rank")
    N: Size = Field(description="per-rank intermediate size after silu-and-mul")
    dtype: KernelDtype = "bf16"
    block_shape: BlockShape | None = Field(None, description="[block_n, block_k] for block fp8")
    down_moe: bool = Field(False, description="SGLang's _down file: GEMM 2's own configs")
    triton_version: TritonVersion = ""
    entries: JsonObject = Field(
        description='batch size → {"BLOCK_SIZE_M": …, "num_warps": …, "num_stages": …}'
    )
    source: ConfigSource = "manual"
    provenance: text(300) = ""
    kernel_engine: KernelEngine = Field("", description="the kernel it was tuned on: builtin, …")
    kernel_version: KernelVersion = Field("", description="that engine's version")
    kernel_source_sha256: SourceSha256 = Field("", description="hash of that kernel's code")
    kernel_path: KernelPath = Field("", description="the kernel path tuned: default, tma, sorted_a")
    down_entries: JsonObject | None = Field(
        None, description="vLLM's _down file beside this one (its sorted-A path), one record"
    )
    compile_checked: CompileCheckedIn | None = Field(
        None, description="compiled, not timed, for its GPU (compile-check --entries)"
    )


class KernelConfigOut(Schema):
    id: int
    device_name: str
    E: int
    N: int
    dtype: str
    block_shape: list[int] | None
    down_moe: bool
    triton_version: str
    entries: dict[str, Any]
    source: str
    version: int
    original_file_name: str
    provenance: str
    kernel_engine: str
    kernel_version: str
    kernel_source_sha256: str
    kernel_path: str
    down_entries: dict[str, Any] | None
    compile_checked: dict[str, Any] | None
    created: dt.datetime
    file_names: dict[str, str] = Field(
        description="the name each engine looks up (style → name); vLLM has no _down files"
    )

    @staticmethod
    def resolve_file_names(obj):
        return {style: obj.file_name(style) for style in obj.styles}


class KernelConfigFilter(CreatedRange):
    device_name: text(200) | None = None
    # a query string spells every number as text: read it as one
    E: Annotated[Size, Strict(False)] | None = None
    N: Annotated[Size, Strict(False)] | None = None
    dtype: KernelDtype | None = None
    down_moe: bool | None = None
    source: ConfigSource | None = None


@router.post(
    "/kernel-configs/import", auth=AnyWrite(), response={200: KernelConfigOut, 201: KernelConfigOut}
)
def kernel_config_import(request, payload: KernelConfigImportIn):
    """Import an SGLang/vLLM config file by its name and content; an unchanged file is 200.

    Any writing token may store configs, host-bound ones too: tuning workers push their result.
    """
    content = payload.content
    text_content = content if isinstance(content, str) else json.dumps(content)
    checked = payload.compile_checked
    config, created = services.kernel_config_import(
        file_name=payload.file_name,
        text=text_content,
        compile_checked=checked.model_dump() if checked else None,
    )
    return stored(created, config)


@router.post(
    "/kernel-configs", auth=AnyWrite(), response={200: KernelConfigOut, 201: KernelConfigOut}
)
def kernel_config_create(request, payload: KernelConfigIn):
    """Store a config from its fields; a new version unless the newest one is identical (200)."""
    config, created = services.kernel_config_store(**payload.model_dump())
    return stored(created, config)


@router.get("/kernel-configs", response=list[KernelConfigOut])
@paginate(Page)
def kernel_config_list(request, filters: Query[KernelConfigFilter]):
    fields = ("device_name", "E", "N", "dtype", "down_moe", "source")
    return matching(in_range(KernelConfig.objects.all(), filters), filters, *fields)


@router.get("/kernel-configs/{ref}", response=KernelConfigOut)
def kernel_config_get(request, ref: str):
    return lookups.get_kernel_config(ref)


@router.get("/kernel-configs/{ref}/file")
@may_answer(400)
def kernel_config_file(request, ref: str, style: Style = "vllm"):
    """Download the file under the exact name and with the exact content the engine loads.

    X-Config-Path says where the engine looks for it relative to its configs folder
    (SGLang: a triton_X_Y_Z/ folder). A _down config exists for SGLang only: style=vllm is 400.
    """
    config = lookups.get_kernel_config(ref)
    if style not in config.styles:
        raise HttpError(
            400, f"config {config.pk} is an SGLang _down file (GEMM 2's configs); vLLM has none"
        )
    name = config.file_name(style)
    response = HttpResponse(config.engine_file_text(style), content_type="application/json")
    response["Content-Disposition"] = content_disposition_header(True, name)
    try:
        path = config_files.config_file_relpath(name, style, config.triton_version or None)
    except config_files.ConfigFileError:
        path = name
    response["X-Config-Path"] = path
    return response


# --------------------------------------------------------------------------- engine diffs


class EngineDiffIn(In):
    report: JsonObject = Field(
        description="the report `python -m tuning engine-diff --json` writes: engine, shape, "
        "device_name and both versions' records (old, new)"
    )
    provenance: text(300) = ""


class EngineDiffOut(Schema):
    id: int
    engine: str
    from_version: str
    to_version: str
    device_name: str
    shape: dict[str, Any]
    created: dt.datetime
    lines: list[str] = Field(description="what changed, as the CLI prints it")

    @staticmethod
    def resolve_lines(obj):
        return obj.lines()


@router.post("/engine-diffs", auth=AnyWrite(), response={201: EngineDiffOut})
def engine_diff_create(request, payload: EngineDiffIn):
    """Store what changed in an engine's kernel between two versions (a host where both are
    installed ran `python -m tuning engine-diff --json`); the engine-diff page shows it."""
    diff = services.engine_diff_store(report=payload.report, provenance=payload.provenance)
    return Status(201, diff)


# --------------------------------------------------------------------------- tuning runs


class TuningRunIn(In):
    uuid: UUID | None = Field(
        None, description="chosen by the client so that a retried create stores one run"
    )
    host: text(100) | None = Field(None, description="host id or name")
    deployment: text(200) | None = Field(None, description="deployment id or name")
    device_name: text(100) = ""
    E: Size
    N: Size
    hidden_size: Size
    topk: Size
    dtype: KernelDtype = "bf16"
    block_shape: BlockShape | None = None
    batch_sizes: list[Size] = Field([], max_length=1024)
    engine: RequestedKernel = Field(
        "builtin", description="whose kernel is asked for: the deployment's engine's or builtin"
    )
    kernel_engine: KernelEngine = ""
    kernel_version: KernelVersion = ""
    kernel_source_sha256: SourceSha256 = ""
    kernel_path: KernelPath = ""
    kernel_note: text(300) = ""
    status: JobStatus = "queued"


class TimingOut(Schema, Timing):
    speedup: float | None = Field(None, description="default_us / tuned_us")
    shipped_speedup: float | None = Field(None, description="shipped_us / tuned_us")
    floor_fraction: float | None = Field(None, description="floor_us / tuned_us")


class TuningRunOut(Schema):
    id: int
    uuid: UUID
    host: str | None
    deployment: int | None = Field(alias="deployment_id")
    device_name: str
    E: int
    N: int
    hidden_size: int
    topk: int
    dtype: str
    block_shape: list[int] | None
    batch_sizes: list[Any]
    engine: str
    routing: str
    kernel_engine: str
    kernel_version: str
    kernel_source_sha256: str
    kernel_path: str
    kernel_note: str
    status: str
    progress: dict[str, Any]
    result: int | None = Field(alias="result_id")
    wall_s: float | None
    error: str
    telemetry_status: str
    telemetry_detail: str
    created: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @staticmethod
    def resolve_host(obj):
        return obj.host.name if obj.host_id else None


class TuningRunDetail(TuningRunOut):
    timings: list[TimingOut]

    @staticmethod
    def resolve_timings(obj):
        return list(obj.timings.all())


class TimingsRecorded(Schema):
    created: int
    existing: int


class TuningBatchOut(Schema):
    tuning_run: int = Field(alias="tuning_run_id")
    batch_id: str
    kind: str
    count: int


class TuningRunFilter(CreatedRange):
    host: text(200) | None = Field(None, description="host name")
    deployment: text(200) | None = Field(None, description="deployment name")
    status: JobStatus | None = None


@router.post(
    "/tuning-runs", auth=HostWrite(), response={200: TuningRunDetail, 201: TuningRunDetail}
)
def tuning_run_create(request, payload: TuningRunIn):
    """Create a tuning run; with a `uuid` seen before, the existing run (200)."""
    fields = payload.model_dump()
    deployment = None
    host = lookups.get_host(fields["host"]) if fields["host"] is not None else None
    if fields["deployment"] is not None:
        deployment = lookups.get_deployment(fields["deployment"])
        # the deployment's host is whose data this is, as for sweeps
        require_host(request, deployment.host)
        host = host or deployment.host
    require_host(request, host)
    for key in ("uuid", "host", "deployment"):
        fields.pop(key)
    tuning_run, created = services.tuning_run_create(
        run_uuid=payload.uuid, host=host, deployment=deployment, **fields
    )
    return stored(created, tuning_run)


class TuningStartIn(In):
    uuid: UUID | None = Field(
        None, description="chosen by the client so that a retried start queues one tune"
    )
    dtype: KernelDtype = "bf16"
    batch_sizes: list[Size] = Field(
        default_factory=lambda: list(config_files.TUNED_BATCH_SIZES),
        min_length=1,
        max_length=1024,
        description="batch sizes M to tune",
    )
    engine: RequestedKernel = Field(
        "builtin", description="whose kernel is asked for: the deployment's engine's or builtin"
    )
    force: bool = Field(
        False, description="tune FP4 experts all the same (their kernels read no Triton config)"
    )
    routing: text(40, min_length=1) = Field(
        "uniform",
        description="the routing the timings draw router choices under: uniform, zipf:S "
        "(expert popularity ∝ 1/rank^S) or dirichlet:A (a popularity drawn per set)",
    )
    also_under: text(40) = Field(
        "",
        description="another routing to time the written file and the engine's own configs "
        "under, saying where the file loses there (a skewed tune: uniform as well)",
    )

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, batch_sizes):
        if len(batch_sizes) != len(set(batch_sizes)):
            raise ValueError("give each batch size once")
        return batch_sizes


@router.post(
    "/deployments/{ref}/tuning-runs",
    auth=HostWrite(),
    response={200: TuningRunDetail, 201: TuningRunDetail},
)
def tuning_start(request, ref: str, payload: TuningStartIn):
    """Queue a tune of the deployment's MoE shape on its host's worker, as the deployment page's
    Tune does; with a `uuid` seen before, that tune (200), not sent again."""
    deployment = lookups.get_deployment(ref)
    require_host(request, deployment.host)
    tuning_run, created = services.tuning_start(
        deployment=deployment, run_uuid=payload.uuid, **payload.model_dump(exclude={"uuid"})
    )
    return stored(created, lookups.get_tuning_run(tuning_run.pk))


@router.get("/tuning-runs", response=list[TuningRunOut])
@paginate(Page)
def tuning_run_list(request, filters: Query[TuningRunFilter]):
    return matching(
        in_range(TuningRun.objects.select_related("host"), filters),
        filters,
        "status",
        host="host__name",
        deployment="deployment__name",
    )


@router.get("/tuning-runs/{ref}", response=TuningRunDetail)
def tuning_run_get(request, ref: str):
    """A tuning run by id or UUID, with its per-batch-size timings."""
    return lookups.get_tuning_run(ref)


@router.patch("/tuning-runs/{ref}", auth=HostWrite(), response=TuningRunDetail)
def tuning_run_patch(request, ref: str, payload: TuningRunPatch):
    """Status by compare-and-set (409 on an illegal move), progress, result config, wall_s,
    telemetry status and why it is not "recorded", the kernel the worker timed and why."""
    tuning_run = lookups.get_tuning_run(ref)
    require_host(request, tuning_run.host)
    fields = payload.model_dump(exclude_unset=True)
    if fields.get("result") is not None:
        fields["result"] = lookups.get_kernel_config(fields["result"])
    services.tuning_run_update(tuning_run=tuning_run, **fields)
    return lookups.get_tuning_run(tuning_run.pk)


@router.post(
    "/tuning-runs/{ref}/timings",
    auth=HostWrite(),
    response={200: TimingsRecorded, 201: TimingsRecorded},
)
def tuning_timings_record(request, ref: str, payload: Timings):
    """Store per-batch-size timings; a batch size already stored is kept as it was."""
    tuning_run = lookups.get_tuning_run(ref)
    require_host(request, tuning_run.host)
    created, existing = services.tuning_timings_record(
        tuning_run=tuning_run, timings=[t.model_dump() for t in payload.timings]
    )
    return stored(created, {"created": created, "existing": existing})


@router.post(
    "/tuning-runs/{ref}/telemetry",
    auth=HostWrite(),
    response={200: TuningBatchOut, 201: TuningBatchOut},
)
def tuning_telemetry_record(request, ref: str, payload: Telemetry):
    """Store a batch of GPU samples of the tune (every GPU it runs on) once per batch_id."""
    tuning_run = lookups.get_tuning_run(ref)
    require_host(request, tuning_run.host)
    batch, created = measurements.telemetry_record(
        tuning_run=tuning_run,
        batch_id=payload.batch_id,
        samples=[s.__dict__ for s in payload.samples],
    )
    return stored(created, batch)


@router.get("/tuning-runs/{ref}/telemetry", response=list[TelemetrySampleOut])
@paginate(Page)
def tuning_telemetry_list(request, ref: str):
    """The tune's GPU samples in time order."""
    return lookups.get_tuning_run(ref).telemetry.order_by("ts", "gpu_index", "id")
