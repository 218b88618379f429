"""Where an engine step's time goes: the breakdown of a profiled window, as both tiers read it.

A worker (or `python -m workers.cli step-breakdown`, or the web tier for traces uploaded by hand)
reads the engine's torch-profiler traces with `domain.step_trace.read_breakdown` and gets a
`StepBreakdown`; the worker pushes it in a `LevelProfile` body, the web tier stores it as JSON and
reads it back with `StepBreakdown.model_validate`. Class names and how a step is cut are defined in
docs/metrics.md ("Inside the step").
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The classes of a step's time, in the order the pages stack them.
CLASSES = (
    "moe",
    "attention",
    "communication",
    "gemm",
    "norm",
    "sampling",
    "memory",
    "other",
    "idle",
)
StepClass = Literal[
    "moe", "attention", "communication", "gemm", "norm", "sampling", "memory", "other", "idle"
]
# decode: every request of the step generates one token; prefill: none does; mixed: both
StepKindName = Literal["decode", "prefill", "mixed"]
STEP_KINDS = ("decode", "prefill", "mixed")
# engine steps a profiled level's window records unless its run asks for another number: a few
# seconds of decode
DEFAULT_PROFILE_STEPS = 40


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopName(_Wire):
    """One kernel (GPU trace) or op (CPU trace) of a class: its mean time per step (µs)."""

    name: str = Field(max_length=400)
    time_us: float = Field(ge=0)


class ClassTime(_Wire):
    """One class in a kind of step: mean time per step (µs), its share of the mean step's wall
    time (0–1) and its top names (at most 5, longest first)."""

    name: StepClass
    time_us: float = Field(ge=0)
    share: float = Field(ge=0)
    top: list[TopName] = Field(default_factory=list, max_length=5)


class KindBreakdown(_Wire):
    """The steps of one kind in one rank's window: how many, their wall time (µs: median, 10th
    and 90th percentile) and every class of CLASSES (their shares sum to 1 within 5 %)."""

    kind: StepKindName
    steps: int = Field(ge=1)
    step_us_median: float = Field(ge=0)
    step_us_p10: float = Field(ge=0)
    step_us_p90: float = Field(ge=0)
    classes: list[ClassTime]

    def share(self, name: str) -> float:
        return next((c.share for c in self.classes if c.name == name), 0.0)

    def time_us(self, name: str) -> float:
        return next((c.time_us for c in self.classes if c.name == name), 0.0)


class StepPoint(_Wire):
    """One step of the window: its start (ms after the window's first step), kind, wall time
    (µs), tokens (prefill, decode) and the time of each class in it (µs, zeros left out)."""

    start_ms: float
    kind: StepKindName
    wall_us: float = Field(ge=0)
    prefill_tokens: int = Field(ge=0)
    decode_tokens: int = Field(ge=0)
    classes: dict[StepClass, float]


class RankBreakdown(_Wire):
    """One rank's trace: its file (name and size in bytes), whether its times are device kernel
    time ("gpu") or op self time ("cpu"), one KindBreakdown per kind of step seen and its steps."""

    rank: int = Field(ge=0)
    file: str = Field(max_length=400)
    size_bytes: int = Field(ge=0)
    device: Literal["gpu", "cpu"]
    kinds: list[KindBreakdown]
    steps: list[StepPoint] = Field(default_factory=list, max_length=10_000)

    def kind(self, kind: str) -> KindBreakdown | None:
        return next((k for k in self.kinds if k.kind == kind), None)


class StepBreakdown(_Wire):
    """A window's breakdown: the engine and version the traces name, the kernel-name table used
    (`rules`, e.g. "vllm 0.32"), one RankBreakdown per rank (ascending) and notes in sentences
    (files skipped, ranks that differ)."""

    engine: str = Field(max_length=40)
    engine_version: str = Field(default="", max_length=40)
    rules: str = Field(max_length=80)
    ranks: list[RankBreakdown] = Field(min_length=1, max_length=1024)
    notes: list[str] = Field(default_factory=list, max_length=50)

    def kinds(self) -> list[str]:
        """The kinds of step any rank saw, in STEP_KINDS order."""
        seen = {k.kind for r in self.ranks for k in r.kinds}
        return [k for k in STEP_KINDS if k in seen]

    def mean_share(self, kind: str, name: str) -> float | None:
        """A class's share of a `kind` step, the mean over the ranks that saw such steps (None:
        no rank did)."""
        shares = [k.share(name) for r in self.ranks if (k := r.kind(kind))]
        return sum(shares) / len(shares) if shares else None


class ProfileTrace(_Wire):
    """A trace file the window wrote, left on its host: where (host, path) and its size (bytes)."""

    host: str = Field(max_length=255)
    path: str = Field(max_length=4096)
    size_bytes: int = Field(ge=0)


class ProfileCost(_Wire):
    """What the window cost the level: its output throughput while profiled against the level's
    own rounds unprofiled (tok/s), and their ratio (unprofiled / profiled: 1.4 = 40 % slower)."""

    profiled_tok_s: float = Field(ge=0)
    unprofiled_tok_s: float = Field(ge=0)
    ratio: float | None = Field(default=None, ge=0)


PROFILE_STATUSES = ("captured", "unavailable", "failed")


class LevelProfile(_Wire):
    """A profiled level as the worker pushes it (`POST /api/v1/runs/{uuid}/profiles`) and the API
    returns it. status: captured (breakdown set), unavailable (the engine was not started with a
    profiler: `reason` says how to start it so) or failed (`reason` says why). steps_asked: the
    window's bound in engine steps; window_s: how long it ran (s)."""

    concurrency: int = Field(ge=1, le=65_536)
    request_rate: float | None = Field(default=None, gt=0, le=1e6)
    attempt: int = Field(default=1, ge=1, le=1000)
    status: Literal["captured", "unavailable", "failed"]
    reason: str = Field(default="", max_length=2000)
    steps_asked: int = Field(ge=1, le=10_000)
    window_s: float | None = Field(default=None, ge=0)
    traces: list[ProfileTrace] = Field(default_factory=list, max_length=1024)
    cost: ProfileCost | None = None
    breakdown: StepBreakdown | None = None


def breakdown_changes(
    a: StepBreakdown, b: StepBreakdown, kind: str = "decode"
) -> list[tuple[str, float, float, float]]:
    """Each class's share of a `kind` step in two breakdowns, side by side: [(class, share in a,
    share in b, change in percentage points)] in CLASSES order; shares are 0–1 means over the
    ranks (StepBreakdown.mean_share), the change is (b - a) × 100 (12 % → 31 % is +19.0). []
    when either breakdown saw no step of that kind."""
    if a.mean_share(kind, CLASSES[0]) is None or b.mean_share(kind, CLASSES[0]) is None:
        return []
    rows = []
    for name in CLASSES:
        share_a, share_b = a.mean_share(kind, name), b.mean_share(kind, name)
        rows.append((name, share_a, share_b, (share_b - share_a) * 100))
    return rows


# Names that say a kernel is an all-reduce (vLLM's custom one is cross_device_reduce_1stage or
# _2stage, NCCL's ncclDevKernel_AllReduce_…, NCCL's one-rank oneRankReduce, the CPU build's
# _C::shm_allreduce), an RMSNorm, or both fused in one.
ALL_REDUCE_WORDS = ("allreduce", "all_reduce", "all-reduce", "cross_device_reduce", "onerankreduce")
RMS_NORM_WORDS = ("rmsnorm", "rms_norm")
FUSED_WORDS = ("fusion", "fused", "rms", "norm")


def top_names(breakdown: StepBreakdown, name: str, kind: str = "decode") -> list[str]:
    """The top kernel or op names of one class in a `kind` step, over every rank, longest
    first and each once."""
    timed = {}
    for rank in breakdown.ranks:
        step = rank.kind(kind)
        for c in step.classes if step else ():
            if c.name == name:
                for top in c.top:
                    timed[top.name] = max(timed.get(top.name, 0.0), top.time_us)
    return sorted(timed, key=timed.get, reverse=True)


def unfused_all_reduce(breakdown: StepBreakdown, kind: str = "decode") -> tuple[str, str] | None:
    """(all-reduce name, RMSNorm name) when a `kind` step's top names hold an all-reduce kernel
    and a separate RMSNorm kernel and no communication kernel that names a fusion; else None."""
    comms = top_names(breakdown, "communication", kind)
    norms = top_names(breakdown, "norm", kind)
    reduce = next((n for n in comms if any(w in n.lower() for w in ALL_REDUCE_WORDS)), None)
    norm = next((n for n in norms if any(w in n.lower() for w in RMS_NORM_WORDS)), None)
    fused = any(any(w in n.lower() for w in FUSED_WORDS) for n in comms)
    if reduce is None or norm is None or fused:
        return None
    return reduce, norm
