"""A sweep run's bodies other than its levels: its status and progress, what the worker observed
of the engine as the sweep started, and its GPU and engine samples."""

from typing import Literal

from pydantic import Field

from domain.jobs import JOB_STATUSES
from domain.wire.fields import (
    Attempt,
    Body,
    EpochSeconds,
    Gauge,
    JsonObject,
    LongText,
    Patch,
    Percent,
    PosInt,
    SmallInt,
    text,
)

TELEMETRY_STATUSES = (
    ("pending", "Not yet known"),
    ("recorded", "Recorded"),
    ("unavailable", "Unavailable (no NVML on the host)"),
    ("not_collected", "Not collected"),
)
JobStatus = Literal[tuple(key for key, _ in JOB_STATUSES)]
TelemetryStatus = Literal[tuple(key for key, _ in TELEMETRY_STATUSES)]
# The API takes up to this many samples a request.
MAX_SAMPLES = 100_000


class RunPatch(Patch):
    """A sweep run's status, progress and telemetry as its worker reports them
    (PATCH /runs/{ref})."""

    status: JobStatus | None = Field(
        None, description="compare-and-set: queued→running→succeeded|failed|cancelled"
    )
    error: LongText | None = None
    progress: JsonObject | None = Field(
        None, description="level_index, levels_total, requests_done, …"
    )
    telemetry_status: TelemetryStatus | None = None
    telemetry_detail: text(300) | None = None
    label: text(200) | None = None
    takeover: Attempt | None = Field(
        None,
        description="a resumed delivery takes the running run over as this attempt: "
        "compare-and-set on the attempt before it (409 when another delivery took it first); "
        "progress is then the run's new progress",
    )


class Observed(Body):
    """What a worker saw when the sweep started (workers.engine_info)."""

    engine: JsonObject | None = Field(None, description="what the engine said of itself")
    kernel_config: JsonObject | None = Field(
        None, description="the fused-MoE config file the engine would load, or engine default"
    )
    client: JsonObject | None = Field(None, description="the load generator's host")
    engine_paths: JsonObject | None = Field(
        None, description="the engine's fast paths with their evidence (domain.engine_paths)"
    )


class TelemetrySample(Body):
    """One NVML reading of one GPU: % utilization, W, MiB, MHz, °C; ts in UTC epoch s."""

    gpu_index: SmallInt
    ts: EpochSeconds
    level_concurrency: PosInt | None = None
    gpu_util: Percent | None = None
    mem_util: Percent | None = None
    power_w: Gauge | None = None
    power_limit_w: Gauge | None = None
    mem_used_mib: Gauge | None = None
    mem_total_mib: Gauge | None = None
    sm_clock_mhz: Gauge | None = None
    temperature_c: Gauge | None = None
    attempt: Attempt = 1


class SampleBatch(Body):
    """A batch of samples under the id that stores it once however often it is sent."""

    batch_id: text(100, min_length=1) = Field(description="client-chosen; a resend stores once")


class Telemetry(SampleBatch):
    """A batch of GPU samples of a sweep or a tune."""

    samples: list[TelemetrySample] = Field(max_length=MAX_SAMPLES)


class EngineSample(Body):
    """One scrape of the engine's /metrics: running and queued requests, KV-cache use 0–1."""

    ts: EpochSeconds
    level_concurrency: PosInt | None = None
    running: Gauge | None = None
    queued: Gauge | None = None
    kv_cache_usage: Gauge | None = None
    attempt: Attempt = 1


class EngineSamples(SampleBatch):
    """A batch of engine samples of a sweep."""

    samples: list[EngineSample] = Field(max_length=MAX_SAMPLES)
