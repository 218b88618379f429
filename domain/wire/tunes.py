"""A kernel tune's bodies: its status, progress and the kernel it timed, and its timings per
batch size."""

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from domain.wire.fields import (
    Attempt,
    Body,
    JsonObject,
    LongText,
    Patch,
    PosInt,
    Size,
    each_once,
    text,
)
from domain.wire.runs import JobStatus, TelemetryStatus

# Whose fused-MoE kernel timings were taken on (tuning.engines.ENGINES).
KERNEL_ENGINES = (("builtin", "moeops' builtin"), ("vllm", "vLLM"), ("sglang", "SGLang"))
# Which launch of the fused-MoE kernel a config is for (tuning's VllmBackend.kernel_path).
KERNEL_PATHS = (
    ("default", "the default path: one config for both GEMMs, B read by pointers"),
    ("tma", "the default path with B read through a TMA descriptor (USE_TMA per batch size)"),
    ("sorted_a", "the sorted-A path: GEMM 2 from a _down file of its own, A read through TMA"),
)
# Where a tune's written config comes from at a batch size: the search replaces the engine's own
# config only when faster head to head by more than the noise.
PICKS = (
    ("tuned", "the search's best"),
    ("default", "the engine's default"),
    ("shipped", "the engine's shipped file"),
)

# "": not recorded
KernelEngine = Literal[("", *(key for key, _ in KERNEL_ENGINES))]
KernelVersion = Annotated[str, StringConstraints(max_length=100, pattern=r"^[\w.+-]*$")]
SourceSha256 = Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{64})?$")]
KernelPath = Literal[("", *(key for key, _ in KERNEL_PATHS))]
Pick = Literal[("", *(key for key, _ in PICKS))]


class TuningRunPatch(Patch):
    """A tune's status, progress, result and the kernel it timed, as its worker reports them
    (PATCH /tuning-runs/{ref})."""

    NULLABLE = ("result", "wall_s")

    status: JobStatus | None = None
    progress: JsonObject | None = None
    result: PosInt | None = Field(None, description="id of the kernel config it produced")
    wall_s: float | None = Field(None, ge=0)
    error: LongText | None = None
    telemetry_status: TelemetryStatus | None = None
    telemetry_detail: text(300) | None = Field(
        None, description="why no GPU samples were recorded (NVML not importable, no GPU, …)"
    )
    kernel_engine: KernelEngine | None = Field(None, description="the kernel the worker timed")
    kernel_version: KernelVersion | None = None
    kernel_source_sha256: SourceSha256 | None = None
    kernel_path: KernelPath | None = None
    kernel_note: text(300) | None = Field(
        None, description="which kernel and why (e.g. builtin: the engine is not installed)"
    )
    takeover: Attempt | None = Field(
        None,
        description="a new delivery takes the running tune over as this attempt: "
        "compare-and-set on the attempt before it (409 when another delivery took it first); "
        "progress is then the tune's new progress",
    )


class TimedUnder(Body):
    """The written config, the engine's default and its shipped entry timed head to head again
    under another routing than the tune's (a skewed tune's: uniform), µs."""

    model_config = ConfigDict(strict=True)

    routing: JsonObject = Field(description='tuning.routing\'s record: {"kind": "uniform"}, …')
    tuned_us: float | None = Field(None, ge=0)
    default_us: float | None = Field(None, ge=0)
    shipped_us: float | None = Field(None, ge=0)


class Timing(Body):
    """One batch size M: the written config's, the engine's default and shipped configs' and the
    floor's times (µs) of one fused-MoE layer; picked: where the written config comes from.
    Strict, as a sweep's level is: true or "5" is refused rather than stored as 1 or 5."""

    model_config = ConfigDict(strict=True)

    batch_size: Size
    tuned_us: float | None = Field(None, ge=0, description="the written config's")
    default_us: float | None = Field(None, ge=0)
    shipped_us: float | None = Field(None, ge=0, description="the engine's shipped file's entry")
    picked: Pick = Field("", description="tuned (the search's), default or shipped")
    floor_us: float | None = Field(None, ge=0)
    grouped_mm_us: float | None = Field(None, ge=0)
    config: JsonObject | None = None
    candidates_tried: PosInt | None = None
    also_under: TimedUnder | None = Field(
        None, description="the same head-to-head under another routing than the tune's"
    )


class Timings(Body):
    """A tune's timings, one per batch size (POST /tuning-runs/{ref}/timings)."""

    timings: list[Timing] = Field(max_length=4096)

    _unique_batch_sizes = each_once("timings", "batch_size")
