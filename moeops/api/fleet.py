"""Models (config.json → MoE shape), hosts, GPUs, topology snapshots and SLO profiles of /api/v1
(deployments: moeops.api.deployments)."""

import datetime as dt
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from ninja import Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import ConfigDict, Field, model_validator

from domain.slo import SLO_PERCENTILES
from domain.storable import storable_json
from domain.wire.fields import each_once
from domain.wire.runs import TelemetrySample
from moeops.api import lookups
from moeops.api.auth import HostWrite, PersonOnly, require_host
from moeops.api.fields import (
    CreatedRange,
    EpochSeconds,
    HostName,
    In,
    JsonList,
    JsonObject,
    LongText,
    Name,
    Patch,
    PosInt,
    SmallInt,
    in_range,
    one_of,
    text,
)
from moeops.api.openapi import may_answer
from moeops.api.paging import Page
from moeops.api.responses import HostTaskQueued, queued, stored
from moeops.fleet import services
from moeops.fleet.models import (
    READING_STATUSES,
    TOPOLOGY_SOURCES,
    VIRTUALIZATION_KINDS,
    Host,
    ModelSpec,
    SLOProfile,
)

router = Router(tags=["fleet"])

TopologySource = one_of(TOPOLOGY_SOURCES)
VirtualizationKind = one_of(VIRTUALIZATION_KINDS)
ReadingStatus = one_of(READING_STATUSES)


# --------------------------------------------------------------------------- models


class ModelIn(In):
    name: Name
    hf_repo_id: text(200) = ""
    config: JsonObject = Field(description="The model's config.json, as published")
    quant_config: JsonObject | None = Field(
        None, description="A separate hf_quant_config.json (ModelOpt exports), if any"
    )
    provenance: text(300) = ""


class ModelOut(Schema):
    id: int
    name: str
    hf_repo_id: str
    architecture: str
    model_type: str
    num_experts: int | None
    topk: int | None
    hidden_size: int | None
    moe_intermediate_size: int | None
    num_layers: int | None
    quantization: str
    block_shape: list[int] | None
    created: dt.datetime
    moe_shape: dict[str, Any] | None = Field(
        description="MoE shape at tp=1, ep=1 (N = moe_intermediate_size)"
    )

    @staticmethod
    def resolve_moe_shape(obj):
        return obj.shape_for()


class ModelDetail(ModelOut):
    config: dict[str, Any]
    quant_config: dict[str, Any] | None

    @staticmethod
    def resolve_config(obj):
        return obj.config_json

    @staticmethod
    def resolve_quant_config(obj):
        return obj.quant_config_json


@router.post("/models", auth=PersonOnly(), response={200: ModelDetail, 201: ModelDetail})
def model_create(request, payload: ModelIn):
    """Register a model from its raw config.json; answers with the MoE shape read from it."""
    model, created = services.model_register(
        name=payload.name,
        config=payload.config,
        quant_config=payload.quant_config,
        hf_repo_id=payload.hf_repo_id,
        provenance=payload.provenance,
    )
    return stored(created, model)


@router.get("/models", response=list[ModelOut])
@paginate(Page)
def model_list(request, filters: Query[CreatedRange]):
    return in_range(ModelSpec.objects.all(), filters)


@router.get("/models/{ref}", response=ModelDetail)
def model_get(request, ref: str):
    """A model by id or name."""
    return lookups.get_model(ref)


# --------------------------------------------------------------------------- hosts and GPUs


class HostIn(In):
    name: HostName
    description: text(300) = ""
    provenance: text(300) = ""


class HostPatch(Patch):
    description: text(300) | None = None
    # the Host's validators (services.host_update) refuse a negative or too long a number
    price_per_gpu_hour: Decimal | None = Field(
        None, description="what one GPU costs for an hour, in currency; null: unknown"
    )
    currency: text(3) | None = Field(None, description="ISO 4217 code, as USD")

    NULLABLE = ("price_per_gpu_hour",)


class HostOut(Schema):
    id: int
    name: str
    description: str
    price_per_gpu_hour: float | None = Field(description="in currency; null: unknown")
    currency: str
    queue_name: str
    worker_seen_at: dt.datetime | None = Field(description="the worker's last heartbeat")
    worker_alive: bool = Field(description="a heartbeat arrived within MOEOPS_WORKER_STALE_S")
    created: dt.datetime

    @staticmethod
    def resolve_worker_alive(obj):
        return obj.worker_alive()


class GPUIn(In):
    index: SmallInt
    name: text(100, min_length=1)
    uuid: text(100) = ""
    compute_capability: text(10) = Field("", description="e.g. 9.0, 12.0")
    memory_total_mib: PosInt | None = None
    power_limit_w: float | None = Field(None, ge=0, le=1e6)


class GPUsIn(In):
    gpus: list[GPUIn] = Field(max_length=1024)

    _unique_indexes = each_once("gpus", "index")


class GPUOut(Schema):
    id: int
    index: int
    name: str
    uuid: str
    compute_capability: str
    sm: str
    memory_total_mib: int | None
    power_limit_w: float | None


class GPUsRecorded(Schema):
    created: int
    updated: int
    gpus: list[GPUOut]


@router.post("/hosts", auth=PersonOnly(), response={200: HostOut, 201: HostOut})
def host_create(request, payload: HostIn):
    """Register a GPU host (idempotent by name); its worker listens on `host.<name>`."""
    host, created = services.host_register(**payload.model_dump())
    return stored(created, host)


@router.get("/hosts", response=list[HostOut])
@paginate(Page)
def host_list(request, filters: Query[CreatedRange]):
    return in_range(Host.objects.all(), filters)


@router.get("/hosts/{ref}", response=HostOut)
def host_get(request, ref: str):
    return lookups.get_host(ref)


@router.patch("/hosts/{ref}", auth=HostWrite(), response=HostOut)
def host_patch(request, ref: str, payload: HostPatch):
    """Change a host's description or its price per GPU-hour and currency."""
    host = lookups.get_host(ref)
    require_host(request, host)
    fields = payload.model_dump(exclude_unset=True)
    if not fields:
        raise HttpError(400, "body: nothing to change")
    return services.host_update(host=host, **fields)


@router.get("/hosts/{ref}/gpus", response=list[GPUOut])
def gpu_list(request, ref: str):
    return lookups.get_host(ref).gpus.all()


@router.post("/hosts/{ref}/gpus", auth=HostWrite(), response={200: GPUsRecorded, 201: GPUsRecorded})
def gpu_record(request, ref: str, payload: GPUsIn):
    """Create or update the host's GPUs by index."""
    host = lookups.get_host(ref)
    require_host(request, host)
    created, updated = services.gpus_record(
        host=host, gpus=[gpu.model_dump() for gpu in payload.gpus]
    )
    body = {"created": created, "updated": updated, "gpus": list(host.gpus.all())}
    return stored(created, body)


class GPUReadingIn(In):
    """Every GPU of the host read once (`workers.gpus_now`), or why NVML could not read them."""

    uuid: UUID | None = Field(
        None, description="chosen by the worker so that a retried push stores one reading"
    )
    taken_at: EpochSeconds | None = Field(None, description="UTC epoch s; default now")
    status: ReadingStatus
    detail: text(300) = Field("", description="why there is no reading")
    gpus: list[TelemetrySample] = Field([], max_length=1024)

    @model_validator(mode="after")
    def _gpus_when_recorded(self):
        if self.status == "recorded" and not self.gpus:
            raise ValueError("gpus: a recorded reading holds at least one GPU")
        return self


class GPUReadingOut(Schema):
    id: int
    uuid: UUID
    host: str
    taken_at: dt.datetime
    status: str
    detail: str
    gpus: list[dict[str, Any]]

    @staticmethod
    def resolve_host(obj):
        return obj.host.name


@router.post("/hosts/{ref}/gpus-now", auth=HostWrite(), response={202: HostTaskQueued})
@may_answer(503)
def gpus_now(request, ref: str):
    """Ask the host's worker to read its GPUs once (`workers.gpus_now`); the reading arrives at
    /hosts/{ref}/gpu-readings."""
    host = lookups.get_host(ref)
    require_host(request, host)
    return queued("workers.gpus_now", host, lambda: services.gpu_reading_enqueue(host=host))


@router.post(
    "/hosts/{ref}/gpu-readings", auth=HostWrite(), response={200: GPUReadingOut, 201: GPUReadingOut}
)
def gpu_reading_record(request, ref: str, payload: GPUReadingIn):
    """Store a reading of the host's GPUs (201); a uuid seen before answers that reading (200)."""
    host = lookups.get_host(ref)
    require_host(request, host)
    reading, created = services.gpu_reading_record(
        host=host,
        status=payload.status,
        detail=payload.detail,
        gpus=[gpu.model_dump(exclude={"level_concurrency", "attempt"}) for gpu in payload.gpus],
        taken_at=payload.taken_at,
        reading_uuid=payload.uuid,
    )
    return stored(created, reading)


@router.get("/hosts/{ref}/gpu-readings", response=list[GPUReadingOut])
@paginate(Page)
def gpu_reading_list(request, ref: str):
    """The host's GPU readings, newest first."""
    return lookups.get_host(ref).gpu_readings.select_related("host")


# --------------------------------------------------------------------------- topology


class LooseIn(In):
    """A part of a probe snapshot: known keys are checked, others kept as jsonb can store them."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _storable_extras(self):
        # keys the schema does not name skip the field types' checks (Any), not jsonb's
        storable_json(self.model_extra or {})
        return self


Cell = text(100) | None


class Matrix(In):
    labels: list[text(100)] = Field(max_length=1024)
    matrix: list[list[Cell]] = Field(max_length=1024)


class PCIe(LooseIn):
    gen_max: PosInt | None = None
    gen_current: PosInt | None = None
    width_max: PosInt | None = None
    width_current: PosInt | None = None


class SnapshotGPU(LooseIn):
    index: SmallInt | None = None
    name: text(100) | None = None
    uuid: text(100) | None = None
    pci_bus_id: text(100) | None = None
    compute_capability: text(10) | None = None
    sm: text(10) | None = None
    memory_total_mib: float | None = None
    power_limit_w: float | None = None
    pcie: PCIe | None = None
    nvlinks_active: PosInt | None = None


class Affinity(LooseIn):
    # the diff keys affinity by GPU label and NICs by name, so neither may be missing
    gpu: text(100, min_length=1)
    cpu: text(1000) | None = None
    numa: text(100) | None = None
    gpu_numa: text(100) | None = None


class NIC(LooseIn):
    name: text(100, min_length=1)
    device: text(100) | None = None


class Layer(LooseIn):
    kind: text(50) | None = None
    technology: text(50) | None = None
    hypervisor: text(50) | None = None


class Virtualization(LooseIn):
    kind: VirtualizationKind = "unknown"
    technology: text(50) | None = None
    evidence: JsonList = []
    layers: list[Layer] = []


class P2P(In):
    read: Matrix | None = None
    write: Matrix | None = None
    nvlink: Matrix | None = None
    atomics: Matrix | None = None


class Snapshot(LooseIn):
    """A snapshot in the JSON shape of `python -m workers.topology probe`."""

    source: TopologySource = "probe"
    virtualization: Virtualization = Virtualization()
    driver_version: text(50) | None = None
    cuda_version: text(50) | None = None
    gpus: list[SnapshotGPU] = Field([], max_length=1024)
    links: Matrix | None = None
    p2p: P2P | None = None
    affinity: list[Affinity] = Field([], max_length=1024)
    nics: list[NIC] = Field([], max_length=1024)
    hostname: text(255) | None = None


class NvidiaSmiP2P(In):
    read: LongText | None = None
    write: LongText | None = None
    nvlink: LongText | None = None
    atomics: LongText | None = None


class TopologyIn(In):
    """A probe snapshot, or `nvidia-smi topo -m` text (and `topo -p2p r|w|n|a` texts)."""

    snapshot: Snapshot | None = None
    nvidia_smi_topo: LongText | None = None
    nvidia_smi_p2p: NvidiaSmiP2P | None = None
    captured_at: EpochSeconds | None = Field(None, description="UTC epoch s; default now")
    provenance: text(300) = ""

    @model_validator(mode="after")
    def _one_source(self):
        if (self.snapshot is None) == (self.nvidia_smi_topo is None):
            raise ValueError("send either snapshot or nvidia_smi_topo (exactly one)")
        if self.nvidia_smi_p2p is not None and self.nvidia_smi_topo is None:
            raise ValueError("nvidia_smi_p2p goes with nvidia_smi_topo")
        return self


class TopologyOut(Schema):
    id: int
    host: str
    captured_at: dt.datetime
    source: str
    virtualization: str
    virtualization_technology: str
    virtualization_evidence: list[Any]
    virtualization_layers: list[Any] = Field(description="every layer, outermost first")
    driver_version: str
    cuda_version: str
    gpus: list[Any]
    links: dict[str, Any] | None
    p2p: dict[str, Any] | None
    affinity: list[Any]
    nics: list[Any]
    fingerprint: str
    provenance: str

    @staticmethod
    def resolve_host(obj):
        return obj.host.name


class TopologyRecorded(Schema):
    snapshot: TopologyOut
    created: bool
    changes: list[str] = Field(description="What differs from the previous snapshot")


@router.post(
    "/hosts/{ref}/topology",
    auth=HostWrite(),
    response={200: TopologyRecorded, 201: TopologyRecorded},
)
def topology_record(request, ref: str, payload: TopologyIn):
    """Store a topology snapshot when the host changed (201), else return the current one (200)."""
    host = lookups.get_host(ref)
    require_host(request, host)
    if payload.snapshot is not None:
        row, created, changes = services.topology_record(
            host=host,
            snapshot=payload.snapshot.model_dump(),
            captured_at=payload.captured_at,
            provenance=payload.provenance,
        )
    else:
        p2p = payload.nvidia_smi_p2p.model_dump(exclude_none=True) if payload.nvidia_smi_p2p else {}
        row, created, changes = services.topology_import(
            host=host,
            matrix_text=payload.nvidia_smi_topo,
            p2p_texts=p2p,
            captured_at=payload.captured_at,
            provenance=payload.provenance,
        )
    return stored(created, {"snapshot": row, "created": created, "changes": changes})


@router.get("/hosts/{ref}/topology", response=list[TopologyOut])
@paginate(Page)
def topology_list(request, ref: str, filters: Query[CreatedRange]):
    """The host's snapshots, newest first; the date range applies to captured_at."""
    host = lookups.get_host(ref)
    return in_range(host.topology_snapshots.select_related("host"), filters, "captured_at")


# --------------------------------------------------------------------------- SLO profiles


Percentile = Literal[SLO_PERCENTILES]
METRIC_FIELDS = (("ttft_percentile", "ttft_ms"), ("tpot_percentile", "tpot_ms"))
METRIC_FIELDS += (("itl_percentile", "itl_ms"), ("e2el_percentile", "e2el_ms"))


def _limits_come_with_percentiles(schema):
    """The schema says what SLOProfile.clean requires: a limit and its percentile together, and
    no default percentile (it once said "", which the profile's rule refuses with a limit)."""
    for percentile, limit in METRIC_FIELDS:
        schema["properties"][percentile].pop("default", None)
        schema["properties"][limit].pop("default", None)
        schema.setdefault("dependentRequired", {})[percentile] = [limit]
        schema["dependentRequired"][limit] = [percentile]


class SLOProfileFields(In):
    """Each limit is a percentile (p50, p90, p95, p99) and a limit in ms; leave both out for
    none. The profile's own rule (SLOProfile.clean) refuses what is wrong, naming the field."""

    model_config = ConfigDict(json_schema_extra=_limits_come_with_percentiles)

    ttft_percentile: Percentile = Field(None, description="with ttft_ms")
    ttft_ms: float = Field(None, description="TTFT limit (ms)")
    tpot_percentile: Percentile = Field(None, description="with tpot_ms")
    tpot_ms: float = Field(None, description="TPOT limit (ms)")
    itl_percentile: Percentile = Field(None, description="with itl_ms")
    itl_ms: float = Field(None, description="ITL limit (ms)")
    e2el_percentile: Percentile = Field(None, description="with e2el_ms")
    e2el_ms: float = Field(None, description="E2E latency limit (ms)")
    max_failed_percent: float = Field(1.0, description="largest share of failed requests (%)")

    def profile_fields(self):
        """The fields as SLOProfile stores them: no percentile is ""."""
        fields = self.model_dump()
        for percentile, _ in METRIC_FIELDS:
            fields[percentile] = fields[percentile] or ""
        return fields


class SLOProfileIn(SLOProfileFields):
    name: Name


class SLOProfilePatch(Patch):
    """A limit is taken off with its percentile: `{"ttft_ms": null, "ttft_percentile": ""}`."""

    NULLABLE = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")

    name: Name | None = None
    ttft_percentile: Percentile | Literal[""] | None = None
    ttft_ms: float | None = None
    tpot_percentile: Percentile | Literal[""] | None = None
    tpot_ms: float | None = None
    itl_percentile: Percentile | Literal[""] | None = None
    itl_ms: float | None = None
    e2el_percentile: Percentile | Literal[""] | None = None
    e2el_ms: float | None = None
    max_failed_percent: float | None = None


class SLOProfileOut(Schema):
    id: int
    name: str
    ttft_percentile: str
    ttft_ms: float | None
    tpot_percentile: str
    tpot_ms: float | None
    itl_percentile: str
    itl_ms: float | None
    e2el_percentile: str
    e2el_ms: float | None
    max_failed_percent: float
    summary: str
    created: dt.datetime
    updated: dt.datetime

    @staticmethod
    def resolve_summary(obj):
        return obj.summary()


# An SLO is a team's decision: a host's worker token may not write one.
SLO_WRITE = PersonOnly(refusal="is a host's worker token: it may not change SLO profiles")


@router.post("/slo-profiles", auth=SLO_WRITE, response={200: SLOProfileOut, 201: SLOProfileOut})
def slo_profile_create(request, payload: SLOProfileIn):
    """Create an SLO profile (the same name with the same limits again: 200; other limits: 409)."""
    profile, created = services.slo_profile_create(**payload.profile_fields())
    return stored(created, profile)


@router.get("/slo-profiles", response=list[SLOProfileOut])
@paginate(Page)
def slo_profile_list(request, filters: Query[CreatedRange]):
    return in_range(SLOProfile.objects.all(), filters)


@router.get("/slo-profiles/{ref}", response=SLOProfileOut)
def slo_profile_get(request, ref: str):
    """An SLO profile by id or name."""
    return lookups.by_id_or_name(SLOProfile.objects.all(), "SLO profile", ref)


@router.patch("/slo-profiles/{ref}", auth=SLO_WRITE, response=SLOProfileOut)
def slo_profile_patch(request, ref: str, payload: SLOProfilePatch):
    """Change an SLO profile's name or limits; a limit set to null is taken off (with its
    percentile set to "")."""
    profile = lookups.by_id_or_name(SLOProfile.objects.all(), "SLO profile", ref)
    fields = payload.model_dump(exclude_unset=True)
    if not fields:
        raise HttpError(400, "body: nothing to change")
    return services.slo_profile_update(profile=profile, **fields)
