"""What the diagnosis rules read of one run (RunData, built by insights.services from the
database), what they propose (Proposal), and the level helpers more than one family uses."""

import math
from dataclasses import dataclass, field

from domain.intervals import compare_rounds


@dataclass(frozen=True)
class Level:
    """One level's numbers: concurrency, output tok/s, achieved concurrency, window (epoch s)."""

    concurrency: int | None
    output_throughput: float | None
    request_rate: float | None = None
    max_concurrent_requests: int | None = None
    requests: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    client_cpu_percent: float | None = None
    completed: int | None = None
    failed: int = 0
    # "HTTP 400: <the engine's message>" when every request of the level failed for one reason
    all_failed_with: str | None = None
    # the sweep stopped inside the level: its numbers cover only the requests finished by then
    partial: bool = False
    # the 95 % interval (low, high) of output tok/s over the level's rounds; None for one round
    throughput_interval: tuple[float, float] | None = None
    # output tok/s of each of the level's rounds, what two levels are judged by
    throughput_rounds: tuple[float, ...] = ()
    # what the level did to the engine, from its /metrics counters (LevelResult.engine_figures)
    engine: dict = field(default_factory=dict)

    @property
    def timed(self):
        return self.started_at is not None and self.finished_at is not None

    @property
    def all_failed(self):
        """Every request of the level failed: it measured the error, not the engine."""
        return self.completed == 0 and bool(self.failed)


@dataclass(frozen=True)
class GpuSample:
    gpu_index: int
    ts: float
    level_concurrency: int | None = None
    gpu_util: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class EngineSample:
    ts: float
    level_concurrency: int | None = None
    running: float | None = None
    queued: float | None = None
    kv_cache_usage: float | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str = ""
    power_limit_w: float | None = None


@dataclass(frozen=True)
class Topology:
    """A TopologySnapshot's fields, in the JSON shape of domain.topology."""

    virtualization: str = "unknown"
    technology: str = ""
    layers: list = field(default_factory=list)
    links: dict | None = None
    p2p: dict | None = None
    affinity: list = field(default_factory=list)
    gpus: list = field(default_factory=list)

    def knows_gpus(self) -> bool:
        """Whether it names any GPU: in its GPU list, link or P2P matrices or affinities (a CPU
        box, a stand-in's host, names none)."""
        blocks = [self.links, *(self.p2p or {}).values()]
        labels = [label for block in blocks if block for label in block.get("labels") or []]
        labels += [entry.get("gpu") or "" for entry in self.affinity]
        return bool(self.gpus) or any(str(label).startswith("GPU") for label in labels)


@dataclass(frozen=True)
class Rule:
    """An enabled IncompatibilityRule; blank fields match anything."""

    id: int
    name: str
    finding_text: str
    compute_capability: str = ""
    engine: str = ""
    launch_argument: str = ""
    launch_value: str = ""
    severity: str = "warning"
    note_id: int | None = None


@dataclass(frozen=True)
class TunedFile:
    """The kernel config on record whose file the engine loaded (the run snapshot's file, matched
    by its SHA-256) and the kernel it was tuned in; untimed: KernelConfig.untimed_in's sentence
    when that kernel is another engine's."""

    config_id: int
    name: str
    kernel_engine: str = ""
    kernel_version: str = ""
    kernel_source_sha256: str = ""
    untimed: str = ""


@dataclass(frozen=True)
class PreviousRun:
    """The deployment's previous comparable run (see `comparable_key`)."""

    id: int
    uuid: str
    label: str
    levels: tuple[Level, ...]
    # what differs from that run to this one, as phrases ("engine version 0.31.0 → 0.32.0")
    changes: tuple[str, ...] = ()
    # {"engine", "from", "to"}: the engine's version changed since that run under the same
    # tuned kernel file (moeops.runs.snapshots.engine_moved)
    engine_moved: dict | None = None


@dataclass
class RunData:
    """Everything the rules read about one run, its deployment and what is on record."""

    run_label: str = ""
    parameters: dict = field(default_factory=dict)
    levels: list[Level] = field(default_factory=list)
    telemetry_status: str = "pending"
    telemetry_detail: str = ""
    gpu_samples: list[GpuSample] = field(default_factory=list)
    engine_samples: list[EngineSample] = field(default_factory=list)
    engine: str = ""
    # the engine as the deployment records it, when it differs from the one that answered
    recorded_engine: str = ""
    # what the engine said of itself when the sweep started (the run snapshot's "engine")
    observed: dict = field(default_factory=dict)
    tp: int = 1
    ep: int = 1
    max_running_requests: int | None = None
    # deployment fields and launch_args as flag -> value, unset ones left out
    launch: dict = field(default_factory=dict)
    # the deployment's GPUs, or the host's when the deployment records none
    gpus: list[Gpu] = field(default_factory=list)
    # GPU indexes the deployment records using; None when it records none
    used_gpu_indexes: list[int] | None = None
    moe_shape: dict | None = None
    quantization: str = ""
    # (device_name, E, N, dtype, block_shape tuple or None) of the kernel configs on record
    kernel_configs: set = field(default_factory=set)
    # whether the deployment's newest run measured a tuned kernel config in effect (its
    # snapshot, moeops.runs.keys.kernel_state), whether or not moeops holds the file
    newest_run_tuned: bool = False
    # the tuned file on record that the engine loaded for this run, when moeops holds it
    tuned_file: TunedFile | None = None
    # the source hash of the answering engine version's kernel, where moeops has timed it
    serving_kernel_sha256: str = ""
    topology: Topology | None = None
    previous: PreviousRun | None = None
    rules: list[Rule] = field(default_factory=list)
    # a capacity search's stored answer (domain.capacity.capacity_answer), else None
    capacity: dict | None = None
    # the profiled levels (domain.step_breakdown.LevelProfile), the newest of each: read by
    # step_rules alone, never as a level's figures
    profiles: list = field(default_factory=list)
    # the engine's fast paths the worker recorded at the sweep's start (the snapshot's
    # engine_paths, domain.engine_paths.EnginePaths' JSON): read by path_rules
    engine_paths: dict | None = None


@dataclass
class Proposal:
    """A finding a rule proposes. scope "run" ties it to the run, "deployment" to the deployment
    alone (its current configuration, not one sweep). plan: titles of proposed plan items."""

    kind: str
    key: str
    severity: str
    title: str
    text: str
    evidence: dict
    scope: str = "run"
    plan: list[str] = field(default_factory=list)
    note_id: int | None = None
    # a deployment-wide finding that follows from the launch recipe (its flags, environment or
    # kernel configs): superseded when another recipe comes in force (decision 55)
    recipe_bound: bool = False


def _curve_levels(levels):
    """{concurrency: level} of the levels at unlimited rate, whole, with a throughput."""
    best = {}
    for level in levels:
        unlimited = level.request_rate is None or math.isinf(level.request_rate)
        # a level stopped part-way ran down its last requests at less than its concurrency
        whole = not level.partial
        if unlimited and whole and level.concurrency and level.output_throughput is not None:
            best[level.concurrency] = level
    return dict(sorted(best.items()))


def _within_noise(a, b):
    """Whether two levels' output tok/s are within the noise of their rounds
    (domain.intervals.compare_rounds); None where the rounds are too few to tell."""
    judged = _rounds_compared(a, b).verdict
    return None if judged == "unknown" else judged == "within"


def _rounds_compared(now, before):
    # a level given without its rounds is its own one round
    return compare_rounds(
        now.throughput_rounds or (now.output_throughput,),
        before.throughput_rounds or (before.output_throughput,),
    )


def _level_of(sample, levels):
    """The level a sample was taken in: its tag, else the level whose window holds it."""
    if sample.level_concurrency is not None:
        match = [lv for lv in levels if lv.concurrency == sample.level_concurrency]
        return match[0] if match else Level(sample.level_concurrency, None)
    for level in levels:
        if level.timed and level.started_at <= sample.ts <= level.finished_at:
            return level
    return None
