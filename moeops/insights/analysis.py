"""Diagnosis rules: each reads one finished run's gathered data and proposes findings.

The rules are plain functions of a `RunData` (built by `services.run_analyze` from the database)
and return `Proposal`s; they touch no database, so each is tested on data built by hand.

Every proposal's evidence holds the numbers it rests on and, under "chart", one figure the UI
can plot as is:

    {"type": "line" | "bar", "x": [...], "x_label": "...", "y_label": "...",
     "series": [{"name": "...", "y": [...]}, ...]}
    {"type": "heatmap", "x": [...], "y": [...], "z": [[...], ...], "x_label": ..., "y_label": ...}

Units: throughput in tok/s, utilization in %, power in W, fractions as 0–1, times in epoch s.

Where the data a rule needs is missing, the rule proposes nothing (or, for GPU telemetry, says
"no GPU evidence"); it never reads absence as a symptom.
"""

import hashlib
import math
from dataclasses import dataclass, field
from statistics import fmean

from domain.capacity import limited_by_cap
from domain.engine import CAP_FLAGS, reported_running_cap
from domain.engine import label as engine_label
from domain.engine_counters import TOKEN_GAP
from domain.intervals import FALSE_ALARM, compare_rounds, with_interval
from domain.numbers import is_integer, is_number
from domain.topology import virtualization_words, vm_layer
from domain.workloads import workload_identity
from moeops.insights import path_rules, step_rules
from moeops.runs.telemetry import no_gpu_samples_text
from tuning.config_files import file_device_name, kernel_dtype

# Plateau: a step of the sweep that adds less than this much output throughput per doubling of
# concurrency is flat; 806 -> 879 tok/s (128 -> 256) is +9.1%, so the write-up's curve is flat.
# Where both levels of a step ran in rounds, the step is flat only if its rise is not beyond the
# noise (domain.intervals.compare_rounds): rounds 990, 1,000, 1,010, 1,005 -> 1,070, 1,080,
# 1,090, 1,085 at 128 -> 256 are +8% but measurably a rise, so no plateau; 900, 1,000, 1,100,
# 950 -> 980, 1,080, 1,180, 1,000 is flat.
PLATEAU_GAIN = 0.10

# Idle GPUs: mean utilization below this (%) while requests are outstanding; a busy decode loop
# keeps a kernel running nearly all the time, so even an inefficient engine reads far above it.
IDLE_UTIL_PERCENT = 30.0
# Idle GPUs when no utilization is recorded: mean power below this fraction of the power limit
# (the write-up's 85 W of 600 W is 0.14).
IDLE_POWER_FRACTION = 0.25

# Queueing: the engine's running count within this fraction of the cap counts as "at the cap"
# (scrapes land between scheduler steps, when a finished request has just left the batch).
CAP_FULL_FRACTION = 0.95
KV_CACHE_FULL = 0.9
# Findings whose plan item "Raise <flag> above <cap>" changes the engine's running-request cap.
CAP_FINDINGS = ("queueing", "plateau", "capacity")

# Regression: a level whose output throughput is more than this fraction below the previous
# comparable run's, and beyond the noise: both levels ran in rounds and this run's 95 % interval
# lies wholly below the previous run's. 1,234 (1,180–1,290) -> 1,050 (1,010–1,090) is a
# regression; 1,234 (1,000–1,470) -> 1,050 (850–1,250), a 15 % drop of the medians, is within
# the noise and says nothing. Where a level has one round (no interval) a drop > 10 % is only a
# "possible regression" at info severity, as one round cannot tell a drop from noise (real vLLM's
# rounds spread ±20–40 %); and none where the one-round figure lies inside the other's interval.
REGRESSION_DROP = 0.10
# Regression: at most this many of the changes between the two runs are named in the text.
REGRESSION_CHANGES_SHOWN = 6

# Client-bound: the load generator's CPU at or above this (%) during a level is saturated.
CLIENT_CPU_SATURATED_PERCENT = 90.0
# Client-bound: achieved concurrency below this fraction of the target (or of the requests the
# level sent, when it sent fewer than the target) means the client did not keep the load up.
CLIENT_CONCURRENCY_FRACTION = 0.90
# Keys of LevelResult.raw (the load generator's level result) that carry the client's CPU use:
# a percentage given as is, else CPU seconds over its processes (workers.loadgen.run_level).
CLIENT_CPU_PERCENT_KEY = "client_cpu_percent"
CLIENT_CPU_SECONDS_KEY = "client_cpu_s"

# P2P statuses of `nvidia-smi topo -p2p` that say nothing against P2P: self, OK, unknown.
P2P_NOT_FAILED = ("X", "OK", "unknown", "U", None)
# Link types of `nvidia-smi topo -m` that cross the SMP interconnect between NUMA nodes
# (SOC is the pre-2017 name of SYS).
CROSS_NUMA_LINKS = ("SYS", "SOC")


FINDING_KEY_MAX = 100


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
    # snapshot, moeops.runs.models.kernel_state), whether or not moeops holds the file
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


def analyze(data: RunData) -> list[Proposal]:
    """Every rule's proposals for one run, in rule order: RULES, then the step breakdown's
    (step_rules.RULES) and the engine paths' (path_rules.RULES; both read at call time, as
    those modules build on this one's Proposal)."""
    rules = (*RULES, *step_rules.RULES, *path_rules.RULES)
    return [proposal for rule in rules for proposal in rule(data)]


# -- plateau ---------------------------------------------------------------------------------


def plateau(data: RunData) -> list[Proposal]:
    """The concurrency from which every later step of the sweep adds < 10% per doubling.

    Uses the levels at unlimited request rate with a concurrency and an output throughput; a
    step's gain is normalized to one doubling of concurrency, so 128 -> 512 counts as two.
    Requiring the flat part to run to the top of the sweep keeps one noisy step low in the
    curve from being called a plateau; where a step's levels ran in rounds, it is flat only if
    their rounds do not rise beyond the noise (PLATEAU_GAIN's example).
    """
    by_concurrency = _curve_levels(data.levels)
    curve = [(c, level.output_throughput) for c, level in by_concurrency.items()]
    if len(curve) < 2:
        return []
    gains = [
        _gain_per_doubling(c0, t0, c1, t1)
        for (c0, t0), (c1, t1) in zip(curve, curve[1:], strict=False)
    ]
    steps = list(by_concurrency.values())
    noise = [_within_noise(a, b) for a, b in zip(steps, steps[1:], strict=False)]
    start = len(gains)
    while (
        start > 0
        and gains[start - 1] is not None
        and gains[start - 1] < PLATEAU_GAIN
        # a step measured in rounds whose rise is beyond its noise is a rise, however small
        and noise[start - 1] is not False
    ):
        start -= 1
    if start == len(gains):
        return []
    at_c, at_t = curve[start]
    top_c, top_t = curve[-1]
    step_gain = gains[start]
    concurrency = [c for c, _ in curve]
    throughput = [t for _, t in curve]
    plan = ["Find the bottleneck behind the throughput plateau"]
    if start == len(gains) - 1:
        # only the sweep's last step is flat: one more level tells a plateau from noise
        plan.insert(0, f"Sweep above concurrency {top_c} to confirm the plateau")
    title = f"Throughput plateaus from concurrency {at_c} ({at_t:.0f} tok/s)"
    text = (
        f"Output throughput {_change_per_doubling(step_gain)} per doubling of concurrency after "
        f"{at_c} ({at_t:.0f} → {curve[start + 1][1]:.0f} tok/s) and reaches only "
        f"{top_t:.0f} tok/s at {top_c}: more concurrent requests no longer buy "
        f"throughput, so something other than the offered load limits it."
    )
    if all(noise[start:]):
        text += (
            " Every step from there rises within the noise of the levels' rounds (a "
            f"permutation test at {FALSE_ALARM * 100:.0f} % false alarms)."
        )
    cap, cap_source = running_cap(data)
    # from the cap on the engine runs no more requests at once: the rest queue
    at_cap = bool(cap) and at_c >= cap
    evidence = {
        "concurrency": concurrency,
        "output_throughput": throughput,
        "gain_per_doubling": [_round(g) for g in gains],
        # per step, whether its rise is within the levels' intervals; None for one round
        "within_noise": noise,
        "plateau_at": at_c,
        "plateau_throughput": at_t,
        "threshold": PLATEAU_GAIN,
        "running_cap": cap,
        "at_running_cap": at_cap,
        "chart": _line(
            concurrency,
            "concurrency",
            "output tok/s",
            [("output throughput", throughput)],
        ),
    }
    if at_cap:
        flag = _cap_flag(data)
        title += f", at the engine's cap ({flag} {cap})"
        text += (
            f" The flat part starts at or above the engine's running-request cap ({flag} {cap}, "
            f"{cap_source}): beyond {cap} concurrent requests the engine only queues the rest, "
            "so the cap is what the plateau coincides with; raise it first."
        )
        # the queue-cap finding's plan item, word for word: one action serves both
        plan.insert(0, _raise_cap_plan(flag, cap))
        # and its cap evidence, from which the item's change (and its button) is read
        evidence.update(
            {"cap": cap, "cap_source": cap_source, "flag": flag, "tested_concurrency": top_c}
        )
    return [
        Proposal(
            kind="plateau",
            key="throughput",
            severity="warning",
            title=title,
            text=text,
            evidence=evidence,
            plan=plan,
        )
    ]


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


def _gain_per_doubling(c0, t0, c1, t1):
    if t0 <= 0 or c1 <= c0:
        return None
    return (t1 / t0) ** (1 / math.log2(c1 / c0)) - 1


# -- idle GPUs under load --------------------------------------------------------------------


def idle_gpus(data: RunData) -> list[Proposal]:
    """GPUs idle while requests are outstanding: mean utilization (else power/limit) too low.

    A sample is under load when it is tagged with a level or falls inside a level's
    started_at..finished_at window. Samples outside every window of a timed run fell between
    levels and are left out. In a run whose levels carry no timing, untagged samples cannot be
    placed: they are used, but the finding is only "info" and says so (the write-up's one
    nvidia-smi reading is such a sample). No recorded telemetry gives "no GPU evidence".
    """
    if not data.levels:
        return []
    used = set(data.used_gpu_indexes) if data.used_gpu_indexes else None
    samples = [s for s in data.gpu_samples if used is None or s.gpu_index in used]
    if data.telemetry_status != "recorded" or not samples:
        text = no_gpu_samples_text("run", data.telemetry_status, data.telemetry_detail)
        return [_no_gpu_evidence(text)]
    loaded = [(s, level) for s in samples if (level := _level_of(s, data.levels)) is not None]
    timed = any(level.timed for level in data.levels)
    if loaded:
        basis = "levels"
    elif not timed:
        basis = "run"
        loaded = [(s, None) for s in samples]
    else:
        return [
            _no_gpu_evidence(
                f"None of the {len(samples)} GPU samples was taken inside a level's window, "
                "so none shows the GPUs while requests were outstanding."
            )
        ]
    limits = {gpu.index: gpu.power_limit_w for gpu in data.gpus}
    util = [s.gpu_util for s, _ in loaded if s.gpu_util is not None]
    # (W, limit W) of the samples that have both: power means nothing without its limit
    power = [
        (s.power_w, limit)
        for s, _ in loaded
        if s.power_w is not None and (limit := s.power_limit_w or limits.get(s.gpu_index))
    ]
    mean_util = fmean(util) if util else None
    mean_fraction = fmean(w / limit for w, limit in power) if power else None
    if mean_util is None and mean_fraction is None:
        return [
            _no_gpu_evidence(
                "The GPU samples carry neither utilization nor power with a known limit."
            )
        ]
    if mean_util is not None:
        idle = mean_util < IDLE_UTIL_PERCENT
    else:
        idle = mean_fraction < IDLE_POWER_FRACTION
    if not idle:
        return []

    mean_power = fmean(w for w, _ in power) if power else None
    mean_limit = fmean(limit for _, limit in power) if power else None
    parts = []
    if mean_util is not None:
        parts.append(f"{mean_util:.0f}% utilization")
    if power:
        parts.append(f"{mean_power:.0f} W of {mean_limit:.0f} W ({mean_fraction:.0%})")
    summary = ", ".join(parts)
    gpu_indexes = sorted({s.gpu_index for s, _ in loaded})
    evidence = {
        "basis": basis,
        "samples": len(loaded),
        "gpus": gpu_indexes,
        "mean_gpu_util_percent": _round(mean_util),
        "mean_power_w": _round(mean_power),
        "mean_power_limit_w": _round(mean_limit),
        "power_fraction": _round(mean_fraction),
        "thresholds": {
            "gpu_util_percent": IDLE_UTIL_PERCENT,
            "power_fraction": IDLE_POWER_FRACTION,
        },
    }
    if basis == "levels":
        by_level = sorted({level.concurrency for _, level in loaded if level.concurrency})
        evidence["chart"] = _line(
            by_level,
            "concurrency",
            "% (utilization, power of limit)",
            [
                ("GPU utilization %", [_mean_at(loaded, c, "util", limits) for c in by_level]),
                ("power % of limit", [_mean_at(loaded, c, "power", limits) for c in by_level]),
            ],
        )
        return [
            Proposal(
                kind="idle_gpus",
                key="under-load",
                severity="warning",
                title=f"GPUs idle under load: {summary}",
                text=(
                    f"While requests were outstanding the GPUs averaged {summary} over "
                    f"{len(loaded)} samples: the engine is not keeping them busy, so the limit is "
                    "in the software (kernels, scheduling, communication), not the hardware."
                ),
                evidence=evidence,
                plan=["Profile the engine: the GPUs idle while requests are outstanding"],
            )
        ]
    evidence["chart"] = _bar(
        gpu_indexes,
        "GPU",
        "% (utilization, power of limit)",
        [
            ("GPU utilization %", [_mean_of_gpu(loaded, i, "util", limits) for i in gpu_indexes]),
            ("power % of limit", [_mean_of_gpu(loaded, i, "power", limits) for i in gpu_indexes]),
        ],
    )
    return [
        Proposal(
            kind="idle_gpus",
            key="run",
            severity="info",
            title=f"GPUs idle in the run's readings: {summary}",
            text=(
                f"The run's GPU readings average {summary}, but they are tied to no level and "
                "the levels carry no timing, so it is not known that requests were outstanding "
                "when they were taken. Sweep with telemetry to see the GPUs under load."
            ),
            evidence=evidence,
        )
    ]


def _no_gpu_evidence(text):
    return Proposal(
        kind="other",
        key="no-gpu-evidence",
        severity="info",
        title="No GPU evidence for this run",
        text=text + " Whether the GPUs were busy or idle is unknown.",
        evidence={"chart": None},
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


def _sample_value(sample, what, limits):
    if what == "util":
        return sample.gpu_util
    limit = sample.power_limit_w or limits.get(sample.gpu_index)
    if sample.power_w is None or not limit:
        return None
    return 100.0 * sample.power_w / limit


def _mean_at(loaded, concurrency, what, limits):
    values = [
        v
        for s, level in loaded
        if level.concurrency == concurrency and (v := _sample_value(s, what, limits)) is not None
    ]
    return _round(fmean(values)) if values else None


def _mean_of_gpu(loaded, index, what, limits):
    values = [
        v
        for s, _ in loaded
        if s.gpu_index == index and (v := _sample_value(s, what, limits)) is not None
    ]
    return _round(fmean(values)) if values else None


# -- queueing behind max-running-requests ----------------------------------------------------


def queueing(data: RunData) -> list[Proposal]:
    """Requests queued in the engine while its running count sits at the cap.

    The cap is the one the engine reported when the sweep started (the run snapshot), else the
    deployment's recorded max_running_requests. With engine samples the rule
    fires on samples with queued > 0 and running at the cap. Without engine samples it fires
    ("info") only when a level's achieved (else target) concurrency exceeded the cap, which
    queues the excess by construction of a continuous-batching engine; so does a run whose
    samples show no queue at the cap (vLLM's gauges read 0 between some of its steps). A queue
    below the cap with the KV cache full (or, where the engine does not report its cache, any
    queue below the cap) is the cache running short: no finding.
    """
    cap, cap_source = running_cap(data)
    if not cap:
        return []
    levels = sorted((lv for lv in data.levels if lv.concurrency), key=lambda lv: lv.concurrency)
    flag = _cap_flag(data)
    tested = max((lv.concurrency for lv in levels), default=None)
    at_cap = [
        s
        for s in data.engine_samples
        if (s.queued or 0) > 0 and (s.running or 0) >= CAP_FULL_FRACTION * cap
    ]
    evidence = {
        "cap": cap,
        "cap_source": cap_source,
        "flag": flag,
        "tested_concurrency": tested,
        "engine_samples": len(data.engine_samples),
    }
    plan = [_raise_cap_plan(flag, cap)]
    if not at_cap and any(_kv_cache_short(s) for s in data.engine_samples):
        return []
    if at_cap:
        concurrency = [lv.concurrency for lv in levels]
        per_level = {lv.concurrency: [] for lv in levels}
        for s in data.engine_samples:
            level = _level_of(s, data.levels)
            if level is not None and level.concurrency in per_level:
                per_level[level.concurrency].append(s)
        max_queued = max(s.queued for s in at_cap)
        evidence.update(
            {
                "basis": "engine_samples",
                "samples_queued_at_cap": len(at_cap),
                "max_queued": max_queued,
                "chart": _line(
                    concurrency,
                    "concurrency",
                    "requests",
                    [
                        ("max running", [_max_of(per_level[c], "running") for c in concurrency]),
                        ("max queued", [_max_of(per_level[c], "queued") for c in concurrency]),
                        ("cap", [cap] * len(concurrency)),
                    ],
                ),
            }
        )
        return [
            Proposal(
                kind="queueing",
                key="running-cap",
                severity="warning",
                title=f"Requests queue behind {flag} {cap}",
                text=(
                    f"In {len(at_cap)} of {len(data.engine_samples)} engine samples the engine ran "
                    f"{cap} requests (its cap) with up to {max_queued:.0f} more waiting: the cap, "
                    "not the GPUs, limits the batch at the concurrency tested."
                ),
                evidence=evidence,
                plan=plan,
            )
        ]
    # max_concurrent_requests counts requests per 1 s bucket, so it may exceed the concurrency
    offered = {
        lv.concurrency: min(lv.concurrency, lv.max_concurrent_requests or lv.concurrency)
        for lv in levels
    }
    above = [c for c in offered if offered[c] > cap]
    if not above:
        return []
    concurrency = list(offered)
    evidence.update(
        {
            "basis": "configuration",
            "levels_above_cap": above,
            "chart": _line(
                concurrency,
                "concurrency",
                "requests",
                [
                    ("concurrent requests offered", [offered[c] for c in concurrency]),
                    ("cap", [cap] * len(concurrency)),
                ],
            ),
        }
    )
    return [
        Proposal(
            kind="queueing",
            key="running-cap",
            severity="info",
            title=f"Levels above {flag} {cap} queue requests",
            text=(
                f"The engine runs at most {cap} requests at once; the sweep offered up to "
                f"{max(offered.values())}, so the rest waited in its queue. "
                + (
                    "The engine's samples did not catch the queue at the cap (its gauges read "
                    "between scheduler steps)."
                    if data.engine_samples
                    else "No engine samples were recorded to show the queue itself."
                )
            ),
            evidence=evidence,
            plan=plan,
        )
    ]


def _kv_cache_short(sample) -> bool:
    """A queue below the cap with the KV cache (nearly) full: the cache, not the cap, holds
    requests back. Where the engine reports its cache usage that decides: the running count
    alone misleads, since requests of one length finish in the same step and the gauges can
    read below the cap between steps while the cap is what queues."""
    if not (sample.queued or 0) > 0:
        return False
    if sample.kv_cache_usage is not None:
        return sample.kv_cache_usage >= KV_CACHE_FULL
    return True


def _cap_flag(data):
    """The engine's flag for its running-request cap."""
    # the stand-in takes SGLang's spelling, and so does an engine moeops does not know
    return CAP_FLAGS.get(data.engine, CAP_FLAGS["sglang"])


def _raise_cap_plan(flag, cap):
    """The plan item that raises the running-request cap: the queue-cap and the plateau
    findings propose it in these words, so that one item (and one engine action) serves both."""
    return f"Raise {flag} above {cap} and re-sweep"


@dataclass(frozen=True)
class CapChange:
    """The change a plan item that raises the running-request cap proposes: flag above cap
    (requests run at once), to target."""

    flag: str
    cap: int
    target: int

    def in_force(self, running_cap: int | None) -> bool:
        """Whether an engine running with running_cap has the change."""
        return running_cap is not None and running_cap > self.cap


def cap_change(title: str, kind: str, evidence: dict, engine: str = "") -> CapChange | None:
    """The cap change of the plan item titled `title` whose finding (kind, evidence) names the
    engine's cap, or None: the item _raise_cap_plan words for it, to the largest concurrency the
    sweep offered, else twice the cap. engine: the deployment's, for the flag of a finding that
    names none."""
    if kind not in CAP_FINDINGS:
        return None
    flag = evidence.get("flag") or CAP_FLAGS.get(engine)
    cap, tested = evidence.get("cap"), evidence.get("tested_concurrency")
    if not isinstance(flag, str) or not flag.startswith("--"):
        return None
    if not is_integer(cap) or cap < 1:
        return None
    if title != _raise_cap_plan(flag, cap):
        return None
    target = tested if is_integer(tested) and tested > cap else 2 * cap
    return CapChange(flag, cap, target)


def running_cap(data: RunData) -> tuple[int | None, str | None]:
    """(cap, where it came from): what the engine reported first, then the deployment."""
    reported = reported_running_cap(data.observed)
    if reported:
        source = data.observed.get("max_running_requests_source") or "the engine"
        return reported, f"reported by the engine ({source})"
    if data.max_running_requests:
        return data.max_running_requests, "deployment"
    return None, None


def _max_of(samples, attr):
    values = [getattr(s, attr) for s in samples if getattr(s, attr) is not None]
    return max(values) if values else None


# -- no tuned kernel config ------------------------------------------------------------------


def no_tuned_kernel(data: RunData) -> list[Proposal]:
    """No KernelConfig on record for the deployment's device, per-rank E and N, and dtype, while
    the deployment's newest run did not measure a tuned config in effect either.

    dtype follows the weights: none/bf16 -> "bf16", fp16 -> "fp16", fp8 -> "fp8_w8a8" (with the
    model's block shape); FP4 weights (nvfp4, mxfp4) run through the engines' FP4 kernels, which
    take no Triton config, so the rule says that instead. Other quantizations: nothing.
    """
    shape = data.moe_shape
    names = list(dict.fromkeys(gpu.name for gpu in data.gpus if gpu.name))
    if not shape or not names or data.newest_run_tuned:
        # a tuned file the engine loads is the point, whether or not moeops holds it
        return []
    quantization = (data.quantization or "").lower()
    E, N = shape["experts_per_rank"], shape["N"]
    if "fp4" in quantization:
        return [
            Proposal(
                kind="other",
                key=_key("kernel-not-triton", quantization),
                severity="info",
                title=f"No fused-MoE Triton config applies to {quantization} weights",
                text=(
                    f"The engines run {quantization} experts through their FP4 MoE kernels "
                    "(CUTLASS, FlashInfer), which read no Triton config file; tuning the "
                    "fused-MoE Triton kernel does not change them."
                ),
                evidence={"quantization": quantization, "E": E, "N": N, "chart": None},
                scope="deployment",
            )
        ]
    dtype = kernel_dtype(quantization)
    if dtype is None:
        return []
    block = shape.get("block_shape") if dtype == "fp8_w8a8" else None
    block = tuple(block) if block else None
    on_record = {(file_device_name(d), e, n, t, b) for d, e, n, t, b in data.kernel_configs}
    proposals = []
    for name in names:
        if (file_device_name(name), E, N, dtype, block) in on_record:
            continue
        block_text = f" block {block[0]}×{block[1]}" if block else ""
        what = f"{name} E={E} N={N} {dtype}{block_text}"
        tune = {
            "device_name": name,
            "E": E,
            "N": N,
            "hidden_size": shape["hidden_size"],
            "topk": shape["topk"],
            "dtype": dtype,
            "block_shape": list(block) if block else None,
        }
        proposals.append(
            Proposal(
                kind="no_tuned_kernel",
                key=_key("kernel", name, E, N, dtype, block),
                severity="warning",
                title=f"No tuned fused-MoE kernel config for {what}",
                text=(
                    f"No kernel config is on record for {what} (tp {data.tp}, ep {data.ep}), so "
                    "the engine runs the fused-MoE kernel with default block sizes that were "
                    "never tuned for this GPU and shape."
                ),
                evidence={
                    "tune": tune,
                    "num_experts": shape["num_experts"],
                    "moe_intermediate_size": shape["moe_intermediate_size"],
                    "tp": data.tp,
                    "ep": data.ep,
                    "quantization": quantization or None,
                    "chart": None,
                },
                scope="deployment",
                plan=[f"Tune the fused-MoE kernel for {what}"],
                # a recipe that brings a tuned file in answers it
                recipe_bound=True,
            )
        )
    return proposals


# -- kernel provenance -----------------------------------------------------------------------


def kernel_provenance(data: RunData) -> list[Proposal]:
    """The tuned file the engine loaded was tuned in another version of the engine's kernel.

    A file tuned in vLLM 0.33.0's kernel, served by vLLM 0.34.0: 0.34 launches the kernel
    otherwise (TMA reads of B), and 0.33's best tiles ran 0.92× of 0.34's default at M=2048
    for GLM-5 fp8 (bench/RESULTS.md). Where both kernels' source hashes are known and equal (a
    patch release that left the kernel alone) nothing is raised. Without a recorded kernel for
    the file, an engine version that changed since the previous comparable run under the same
    tuned file says as much. A file tuned in another engine's kernel: its own finding.
    """
    engine, version = data.observed.get("engine"), data.observed.get("version")
    if engine not in ("vllm", "sglang") or not version:
        return []
    tuned = data.tuned_file
    serving = engine_label({"engine": engine, "version": version})
    plan = [retune_title(engine, version)]
    if tuned is not None and tuned.untimed:
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("other-engine", tuned.config_id),
                severity="warning",
                title=f"{tuned.name} was never timed in {engine_label(engine)}'s kernel",
                text=f"The engine loaded {tuned.name}. {tuned.untimed}",
                evidence={"kernel_config": tuned.config_id, "engine": engine, "chart": None},
                plan=plan,
            )
        ]
    if tuned is not None and tuned.kernel_engine == engine and tuned.kernel_version:
        if tuned.kernel_version == version:
            return []
        same_kernel = tuned.kernel_source_sha256 and (
            tuned.kernel_source_sha256 == data.serving_kernel_sha256
        )
        if same_kernel:
            return []
        tuned_on = engine_label({"engine": engine, "version": tuned.kernel_version})
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("tuned-on", tuned.config_id, version),
                severity="warning",
                title=f"{tuned.name} was tuned for {tuned_on}'s kernel; the engine runs {version}",
                text=(
                    f"This file was tuned for {tuned_on}'s kernel; the engine runs {version}, "
                    "whose launch differs: re-tune. Its best tiles were timed in the other "
                    f"kernel and may run slower than {serving}'s own default."
                ),
                evidence={
                    "kernel_config": tuned.config_id,
                    "tuned_on": {
                        "engine": engine,
                        "version": tuned.kernel_version,
                        "kernel_source_sha256": tuned.kernel_source_sha256 or None,
                    },
                    "serving": {
                        "engine": engine,
                        "version": version,
                        "kernel_source_sha256": data.serving_kernel_sha256 or None,
                    },
                    "chart": None,
                },
                plan=plan,
            )
        ]
    previous = data.previous
    moved = previous.engine_moved if previous is not None else None
    if (tuned is None or not tuned.kernel_engine) and moved:
        before = previous.label or f"run {previous.uuid[:8]}"
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("engine-moved", moved["from"], version),
                severity="warning",
                title=(
                    f"The engine moved from {moved['from']} to {version} under the "
                    "same tuned kernel file"
                ),
                text=(
                    f"{before} ran {engine_label(engine)} {moved['from']} with the same "
                    f"tuned kernel file; this run ran {version}. moeops does not know which "
                    "kernel the file was tuned in; it was not tuned in this one: re-tune."
                ),
                evidence={
                    "previous_run": {"id": previous.id, "uuid": previous.uuid},
                    "from_version": moved["from"],
                    "to_version": version,
                    "chart": None,
                },
                plan=plan,
            )
        ]
    return []


def retune_title(engine: str, version: str) -> str:
    """The plan item that re-tunes a file for the engine version that serves: "Tune for vLLM
    0.34.0 and re-sweep"."""
    return f"Tune for {engine_label({'engine': engine, 'version': version})} and re-sweep"


# -- topology --------------------------------------------------------------------------------


def topology(data: RunData) -> list[Proposal]:
    """The run's topology snapshot: P2P between the GPUs used, NUMA crossings, a VM.

    The GPUs used are the deployment's recorded ones; without a record, all the snapshot's GPUs
    when their number is the deployment's parallel size, else the pair checks are skipped.
    """
    snap = data.topology
    if snap is None:
        return []
    proposals = []
    virtualization = {
        "kind": snap.virtualization,
        "technology": snap.technology or None,
        "layers": snap.layers,
    }
    # a VM under a container still puts the GPUs behind the hypervisor's PCIe tree
    vm = vm_layer(virtualization)
    # a VM with no GPU passes none through
    if vm is not None and snap.knows_gpus():
        technology = f" ({vm['technology']})" if vm.get("technology") else ""
        proposals.append(
            Proposal(
                kind="topology",
                key="vm-passthrough",
                severity="info",
                title=f"GPUs passed through to a virtual machine{technology}",
                text=(
                    f"The GPUs ran in: {virtualization_words(virtualization)}. Inside a VM the "
                    "GPUs sit on the hypervisor's virtual PCIe tree: P2P and the "
                    "link types the guest sees depend on the pass-through setup, not only the "
                    "hardware. The write-up's move from a KVM VM to an LXC container changed the "
                    "GPU topology and P2P; compare runs by the topology they ran on."
                ),
                evidence={
                    "virtualization": snap.virtualization,
                    "technology": snap.technology or None,
                    "layers": snap.layers,
                    "chart": None,
                },
            )
        )
    labels = _used_labels(data)
    if labels is None or len(labels) < 2:
        return proposals
    proposals.extend(_p2p_failures(snap, labels))
    proposals.extend(_numa_crossings(snap, labels))
    return proposals


def _used_labels(data):
    snap = data.topology
    known = [
        label
        for label in ((snap.links or {}).get("labels") or _first_p2p_labels(snap))
        if label.startswith("GPU")
    ]
    if data.used_gpu_indexes:
        return [f"GPU{i}" for i in sorted(data.used_gpu_indexes)]
    if known and len(known) == max(data.tp, data.ep):
        return known
    return None


def _first_p2p_labels(snap):
    for matrix in (snap.p2p or {}).values():
        if matrix:
            return matrix.get("labels") or []
    return []


def _submatrix(matrix, labels):
    """{labels, matrix} restricted to `labels` (those it has), or None."""
    if not matrix or not matrix.get("labels"):
        return None
    index = {label: i for i, label in enumerate(matrix["labels"])}
    present = [label for label in labels if label in index]
    rows = [[matrix["matrix"][index[a]][index[b]] for b in present] for a in present]
    return {"labels": present, "matrix": rows}


def _pairs(sub):
    labels, rows = sub["labels"], sub["matrix"]
    for i, a in enumerate(labels):
        for j in range(i + 1, len(labels)):
            yield a, labels[j], rows[i][j], rows[j][i]


def _p2p_failures(snap, labels):
    failures, matrices = [], {}
    for kind in ("read", "write"):
        sub = _submatrix((snap.p2p or {}).get(kind), labels)
        if sub is None:
            continue
        matrices[kind] = sub
        for a, b, there, back in _pairs(sub):
            bad = [status for status in (there, back) if status not in P2P_NOT_FAILED]
            if bad:
                failures.append({"kind": kind, "pair": [a, b], "status": bad[0]})
    if not failures:
        return []
    first = matrices[failures[0]["kind"]]
    statuses = sorted({f["status"] for f in failures})
    pairs = {tuple(f["pair"]) for f in failures}
    return [
        Proposal(
            kind="topology",
            key="p2p",
            severity="warning",
            title=f"No P2P between {len(pairs)} pair(s) of the GPUs used together",
            text=(
                f"nvidia-smi reports P2P {', '.join(statuses)} (not OK) between GPUs the "
                "deployment uses together, so their all-reduce traffic bounces through host "
                "memory instead of going GPU to GPU."
            ),
            evidence={
                "failures": failures,
                "matrices": matrices,
                "chart": _heatmap(first, f"P2P {failures[0]['kind']}"),
            },
            plan=["Enable P2P between the deployment's GPUs (IOMMU/ACS, driver, VM pass-through)"],
        )
    ]


def _numa_crossings(snap, labels):
    sub = _submatrix(snap.links, labels)
    crossing = []
    if sub is not None:
        crossing = [[a, b] for a, b, link, _ in _pairs(sub) if link in CROSS_NUMA_LINKS]
    numa = {
        entry.get("gpu"): entry.get("numa")
        for entry in snap.affinity or []
        if entry.get("gpu") in labels and entry.get("numa") not in (None, "", "N/A")
    }
    nodes = sorted(set(numa.values()))
    if not crossing and len(nodes) < 2:
        return []
    evidence = {
        "cross_numa_pairs": crossing,
        "gpu_numa": numa,
        "chart": _heatmap(sub, "link type") if sub else None,
    }
    if crossing:
        return [
            Proposal(
                kind="topology",
                key="cross-numa",
                severity="warning",
                title=f"{len(crossing)} GPU pair(s) talk across NUMA nodes (SYS)",
                text=(
                    "Some GPUs used together reach each other only over PCIe plus the CPUs' "
                    "socket interconnect (SYS); tensor-parallel all-reduce between them is "
                    "limited by that link. Place the deployment on GPUs of one NUMA node, or "
                    "use NVLink."
                ),
                evidence=evidence,
                plan=["Place the deployment's GPUs within one NUMA node"],
            )
        ]
    return [
        Proposal(
            kind="topology",
            key="cross-numa",
            severity="info",
            title=f"The GPUs used span NUMA nodes {', '.join(nodes)}",
            text=(
                "The GPUs used together sit on different NUMA nodes, though no GPU pair links "
                "through SYS; pin the engine's CPU threads and memory near their GPUs."
            ),
            evidence=evidence,
        )
    ]


# -- known incompatibilities -----------------------------------------------------------------


def incompatibilities(data: RunData) -> list[Proposal]:
    """Enabled IncompatibilityRules whose every non-blank condition holds for the deployment.

    compute capability: any of its GPUs has it ("12" and "12.0" match); engine: equal, any case;
    launch argument: a deployment field or a launch_args flag (leading dashes and - vs _ ignored)
    whose value, as a string and in any case, equals launch_value, or, with launch_value blank,
    is truthy. A rule with no condition at all matches nothing.
    """
    capabilities = {_capability(gpu.compute_capability) for gpu in data.gpus}
    capabilities.discard("")
    launch = {_flag(k): v for k, v in data.launch.items()}
    proposals = []
    for rule in data.rules:
        if not (rule.compute_capability or rule.engine or rule.launch_argument):
            continue
        matched = {}
        if rule.compute_capability:
            if _capability(rule.compute_capability) not in capabilities:
                continue
            matched["compute_capability"] = rule.compute_capability
        if rule.engine:
            if rule.engine.lower() != (data.engine or "").lower():
                continue
            matched["engine"] = data.engine
        if rule.launch_argument:
            value = launch.get(_flag(rule.launch_argument))
            if value is None or value == "":
                continue
            if rule.launch_value:
                if str(value).lower() != rule.launch_value.strip().lower():
                    continue
            elif not value:
                continue
            matched[rule.launch_argument] = value
        proposals.append(
            Proposal(
                kind="incompatibility",
                key=f"rule-{rule.id}",
                severity=rule.severity,
                title=rule.name,
                text=rule.finding_text,
                evidence={"rule_id": rule.id, "matched": matched, "chart": None},
                scope="deployment",
                plan=[f"Resolve the known incompatibility: {rule.name}"],
                note_id=rule.note_id,
                recipe_bound=bool(rule.launch_argument),
            )
        )
    return proposals


def _capability(value):
    value = (value or "").strip()
    return value if not value or "." in value else f"{value}.0"


def _flag(name):
    return name.strip().lstrip("-").replace("-", "_").lower()


# -- regression ------------------------------------------------------------------------------


def _measured(levels):
    return [level for level in levels if not level.all_failed]


def comparable_key(parameters: dict) -> tuple | None:
    """What two runs must share to be compared: levels, input and output length, and the
    arrivals (request rates, burstiness, ramp-up; none for a closed loop) and the workload sent
    (domain.workloads.workload_identity); None if unset."""
    levels = parameters.get("levels")
    input_len, output_len = parameters.get("input_len"), parameters.get("output_len")
    if not levels or not isinstance(levels, list) or input_len is None or output_len is None:
        return None
    rates = parameters.get("request_rates") or [parameters.get("request_rate")]
    arrivals = (
        tuple(sorted(str(float(r)) for r in rates if r is not None)),
        str(float(parameters.get("burstiness") or 1.0)),
        str(float(parameters.get("ramp_up_s") or 0.0)),
    )
    workload = tuple(str(v) for v in workload_identity(parameters.get("workload")).values())
    return (tuple(sorted(map(str, levels))), str(input_len), str(output_len), *arrivals, workload)


def regression(data: RunData) -> list[Proposal]:
    """A level's output throughput more than 10% below the previous comparable run's and beyond
    the noise (REGRESSION_DROP says how); a level whose every request failed, in either run, is
    no throughput to compare. Drops of levels with one round are only a possible regression."""
    previous = data.previous
    if previous is None:
        return []
    now_levels = _curve_levels(_measured(data.levels))
    before_levels = _curve_levels(_measured(previous.levels))
    concurrency = sorted(set(now_levels) & set(before_levels))
    now = {c: now_levels[c].output_throughput for c in concurrency}
    before = {c: before_levels[c].output_throughput for c in concurrency}
    drops = {c: 1 - now[c] / before[c] for c in concurrency if before[c] > 0}
    verdicts = {c: _drop_verdict(now_levels[c], before_levels[c], d) for c, d in drops.items()}
    beyond = [c for c, verdict in verdicts.items() if verdict == "beyond noise"]
    possible = [c for c, verdict in verdicts.items() if verdict == "possible"]
    worst = beyond or possible
    if not worst:
        return []
    c = max(worst, key=lambda k: drops[k])
    before_label = previous.label or f"run {previous.uuid[:8]}"
    if previous.changes:
        shown = "; ".join(previous.changes[:REGRESSION_CHANGES_SHOWN])
        more = len(previous.changes) - REGRESSION_CHANGES_SHOWN
        changed = f" What changed since then: {shown}" + (
            f" (and {more} more)." if more > 0 else "."
        )
    else:
        changed = " Nothing on record changed between the two runs' snapshots."
    now_interval = now_levels[c].throughput_interval
    before_interval = before_levels[c].throughput_interval
    fell = (
        f"At concurrency {c} output tok/s fell from {with_interval(before[c], before_interval)} "
        f"in {before_label} to {with_interval(now[c], now_interval)} in this run (same levels "
        "and lengths)"
    )
    judged = _rounds_compared(now_levels[c], before_levels[c])
    if beyond:
        title = f"Throughput {drops[c]:.0%} below {before_label} at concurrency {c}"
        said = (
            f"{fell}: {judged.change()} beyond the noise (a permutation test of their rounds "
            f"at {FALSE_ALARM * 100:.0f} % false alarms, p = {judged.p_value:.3f}); "
            f"{len(beyond)} of {len(concurrency)} levels fell more than {REGRESSION_DROP:.0%} "
            "beyond the noise."
        )
    else:
        title = (
            f"Possible regression: throughput {drops[c]:.0%} below {before_label} at "
            f"concurrency {c}"
        )
        said = f"{fell}: {judged.why}: cannot tell from noise; re-run with rounds ≥ 4."
    return [
        Proposal(
            kind="regression",
            key=_key("vs", previous.uuid),
            severity="warning" if beyond else "info",
            title=title,
            text=said + changed,
            evidence={
                "previous_run": {"id": previous.id, "uuid": previous.uuid, "label": previous.label},
                "changes": list(previous.changes),
                "concurrency": concurrency,
                "output_throughput": [now[k] for k in concurrency],
                "previous_output_throughput": [before[k] for k in concurrency],
                "interval": [_interval_list(now_levels[k]) for k in concurrency],
                "previous_interval": [_interval_list(before_levels[k]) for k in concurrency],
                "drop": [_round(drops.get(k)) for k in concurrency],
                "verdict": [verdicts.get(k) for k in concurrency],
                "threshold": REGRESSION_DROP,
                "chart": _line(
                    concurrency,
                    "concurrency",
                    "output tok/s",
                    [
                        ("this run", [now[k] for k in concurrency]),
                        (before_label, [before[k] for k in concurrency]),
                    ],
                ),
            },
            plan=[f"Find what changed since {before_label} (engine, launch arguments, topology)"],
        )
    ]


def _drop_verdict(now, before, drop):
    """ "beyond noise" (the rounds fell: domain.intervals.compare_rounds), "possible" (a drop
    too few rounds cannot tell from noise) or None."""
    if drop <= REGRESSION_DROP:
        return None
    within = _within_noise(now, before)
    if within is None:
        return "possible"
    return None if within else "beyond noise"


def _interval_list(level):
    interval = level.throughput_interval
    return None if interval is None else [_round(v, 1) for v in interval]


# -- client-bound ----------------------------------------------------------------------------


def client_cpu_percent(raw: dict | None, started_at=None, finished_at=None) -> float | None:
    """The load generator's CPU use during a level, in % of one core per client process.

    raw["client_cpu_percent"] when given; else raw["client_cpu_s"] / (wall s × processes),
    the wall time from the level's window (or raw's own started_at/finished_at). Each client
    process is one asyncio loop on one core, so 100% means the client could go no faster.
    """
    raw = raw if isinstance(raw, dict) else {}
    given = raw.get(CLIENT_CPU_PERCENT_KEY)
    if _is_number(given):
        return float(given)
    cpu_s = raw.get(CLIENT_CPU_SECONDS_KEY)
    start = started_at if started_at is not None else raw.get("started_at")
    end = finished_at if finished_at is not None else raw.get("finished_at")
    processes = raw.get("processes") if _is_number(raw.get("processes")) else 1
    if not (_is_number(cpu_s) and _is_number(start) and _is_number(end)) or end <= start:
        return None
    return 100.0 * cpu_s / ((end - start) * max(processes, 1))


def _is_number(value):
    return is_number(value) and math.isfinite(value)


def client_bound(data: RunData) -> list[Proposal]:
    """The load generator, not the server, limited a level.

    Either its CPU reached CLIENT_CPU_SATURATED_PERCENT (see `client_cpu_percent`), or its
    achieved concurrency (max_concurrent_requests) stayed below 90% of the target, the target
    being the level's concurrency or the requests it sent, whichever is fewer.
    """
    levels = sorted((lv for lv in data.levels if lv.concurrency), key=lambda lv: lv.concurrency)
    saturated, short = [], []
    for lv in levels:
        if lv.client_cpu_percent is not None and lv.client_cpu_percent >= (
            CLIENT_CPU_SATURATED_PERCENT
        ):
            saturated.append(lv.concurrency)
        target = min(lv.concurrency, lv.requests) if lv.requests else lv.concurrency
        achieved = lv.max_concurrent_requests
        if achieved is not None and achieved < CLIENT_CONCURRENCY_FRACTION * target:
            short.append(lv.concurrency)
    if not saturated and not short:
        return []
    concurrency = [lv.concurrency for lv in levels]
    reasons = []
    if saturated:
        reasons.append(
            f"its CPU reached {CLIENT_CPU_SATURATED_PERCENT:.0f}% or more at concurrency "
            + ", ".join(map(str, saturated))
        )
    if short:
        reasons.append(
            "it kept fewer than "
            f"{CLIENT_CONCURRENCY_FRACTION:.0%} of the target requests in flight at concurrency "
            + ", ".join(map(str, short))
        )
    return [
        Proposal(
            kind="client_bound",
            key="load-generator",
            severity="warning",
            title="The load generator limited the sweep",
            text="The load generator, not the server, set the pace: " + "; ".join(reasons) + ".",
            evidence={
                "levels_cpu_saturated": saturated,
                "levels_below_target": short,
                "concurrency": concurrency,
                "max_concurrent_requests": [lv.max_concurrent_requests for lv in levels],
                "client_cpu_percent": [_round(lv.client_cpu_percent, 2) for lv in levels],
                "thresholds": {
                    "client_cpu_percent": CLIENT_CPU_SATURATED_PERCENT,
                    "concurrency_fraction": CLIENT_CONCURRENCY_FRACTION,
                },
                "chart": _line(
                    concurrency,
                    "target concurrency",
                    "requests in flight",
                    [
                        ("target", concurrency),
                        ("achieved", [lv.max_concurrent_requests for lv in levels]),
                    ],
                ),
            },
            plan=["Give the load generator more CPU (or a second client machine) and re-sweep"],
        )
    ]


# -- failed requests -------------------------------------------------------------------------


def failed_requests(data: RunData) -> list[Proposal]:
    """Levels where every request failed: the level measured the error, not the engine.

    The engine's own message comes first, verbatim (the load generator's all_failed_with), so
    that "Token id 25531 is out of vocabulary" is read before any chart.
    """
    dead = [lv for lv in data.levels if lv.all_failed]
    if not dead:
        return []
    first = min(dead, key=lambda lv: lv.concurrency or 0)
    cause = first.all_failed_with or "requests failed for several reasons"
    where = ", ".join(str(lv.concurrency) for lv in dead)
    return [
        Proposal(
            kind="failed_requests",
            key="all-failed",
            severity="critical",
            title=f"Every request failed at concurrency {where}: {cause}"[:200],
            text=(
                f"{cause}\n\nAll {first.failed} requests at concurrency {first.concurrency} "
                f"failed{' the same way' if first.all_failed_with else ''}; "
                f"{len(dead)} of {len(data.levels)} levels measured nothing but errors."
            ),
            evidence={
                "error": cause,
                "levels": [lv.concurrency for lv in dead],
                "failed": [lv.failed for lv in dead],
                "chart": None,
            },
            plan=["Fix what makes the engine refuse the requests, then sweep again"],
        )
    ]


# -- engine not as recorded ------------------------------------------------------------------


def engine_mismatch(data: RunData) -> list[Proposal]:
    """The engine (or its version) that answered is not the one the deployment records."""
    answered = data.observed.get("engine")
    recorded = data.recorded_engine
    out = []
    if answered and recorded in ("vllm", "sglang") and answered not in (recorded, "unknown"):
        label = engine_label(data.observed)
        out.append(
            Proposal(
                kind="engine_mismatch",
                key="engine",
                severity="warning",
                title=f"{label} answered, but the deployment records {engine_label(recorded)}",
                text=(
                    f"When the sweep started, the server at the endpoint said it is {label}; the "
                    f"deployment is recorded as {engine_label(recorded)}. The run measured "
                    f"{label}, and its snapshot says so; the deployment's record is wrong."
                ),
                evidence={"recorded": recorded, "answered": answered, "chart": None},
                plan=[f"Correct the deployment's engine to {engine_label(answered)}"],
            )
        )
    version = data.observed.get("version")
    recorded_version = data.launch.get("engine_version") or ""
    if answered == recorded and version and recorded_version and version != recorded_version:
        out.append(
            Proposal(
                kind="engine_mismatch",
                key="version",
                severity="info",
                title=f"{engine_label(data.observed)} answered; the deployment records "
                f"version {recorded_version}",
                text=(
                    f"The engine reported version {version} when the sweep started; the "
                    f"deployment records {recorded_version}. The run's snapshot keeps {version}."
                ),
                evidence={"recorded": recorded_version, "answered": version, "chart": None},
                plan=[f"Update the deployment's engine version to {version}"],
            )
        )
    return out


# -- a capacity that stops at the running-request cap -----------------------------------------


def capacity_at_cap(data: RunData) -> list[Proposal]:
    """A capacity search whose bracket straddles the engine's running-request cap: the largest
    load within the SLO runs at most `cap` requests at once, the first load beyond it more,
    which the engine only queues. The cap, not the GPUs, sets the capacity: the plan item is
    the queue-cap finding's, word for word, so that its restart action serves it too."""
    cap, cap_source = running_cap(data)
    answer = data.capacity
    if not limited_by_cap(answer, cap):
        return []
    flag = _cap_flag(data)
    low, high = answer["bracket"]
    tested = max(p["load"] for p in answer.get("probes") or [{"load": high}])
    binding = (answer.get("binding") or {}).get("sentence")
    profile = answer.get("profile") or "the SLO profile"
    text = (
        f"The capacity search against {profile} ends at {low} concurrent requests, and the "
        f"first load beyond it ({high}) asks for more requests at once than the engine's "
        f"running-request cap ({flag} {cap}, {cap_source}) runs: the engine only queues the "
        "rest, so their latency grows while the GPUs may have room. "
    )
    if binding:
        text += f"{binding[0].upper()}{binding[1:]}. "
    text += "Raise the cap and search again to see what the GPUs themselves sustain."
    return [
        Proposal(
            kind="capacity",
            key="running-cap",
            severity="warning",
            title=f"Capacity stops at the engine's cap: {low} concurrent ({flag} {cap})",
            text=text,
            evidence={
                "capacity": low,
                "bracket": [low, high],
                "binding": binding,
                "cap": cap,
                "cap_source": cap_source,
                "flag": flag,
                "tested_concurrency": tested,
            },
            plan=[_raise_cap_plan(flag, cap)],
        )
    ]


# -- engine counters -------------------------------------------------------------------------

# A prefix-cache hit rate at or below 5 % on a shared-prefix workload is "near zero": with G
# groups each sharing a P-token system prompt and a Q-token question, every request after a
# group's first should hit P / (P + Q) of its prompt (P 1024, Q 128: 89 %); 5 % is what a
# cache that keeps nothing between requests shows from the odd coincidental block.
COLD_PREFIX_CACHE = 0.05
# The workload kind whose requests share long prefixes (domain.workloads.KINDS).
SHARED_PREFIX = "shared_prefix"


def _level_name(level):
    if level.request_rate is not None:
        return f"{level.request_rate:g} req/s (concurrency {level.concurrency})"
    return f"concurrency {level.concurrency}"


def engine_token_counts(data: RunData) -> list[Proposal]:
    """Levels where the engine's own prompt or generation token counters disagree with the
    client's counts (from the server's usage, warm-up included) by more than TOKEN_GAP."""
    out = []
    for which, key in (("prompt", "prompt_tokens_gap"), ("generation", "generation_tokens_gap")):
        off = [lv for lv in data.levels if abs(lv.engine.get(key) or 0) > TOKEN_GAP]
        if not off:
            continue
        worst = max(off, key=lambda lv: abs(lv.engine[key]))
        gap = worst.engine[key]
        engine = engine_label(worst.engine.get("engine") or data.engine)
        more = "more" if gap > 0 else "fewer"
        out.append(
            Proposal(
                kind="engine_tokens",
                key=which,
                severity="warning",
                title=f"{engine} counted {abs(gap):.1%} {more} {which} tokens than the client "
                f"at {_level_name(worst)}",
                text=(
                    f"During {len(off)} of {len(data.levels)} levels the engine's own {which} "
                    f"token counter (/metrics) moved by more than {TOKEN_GAP:.0%} off what the "
                    "client counted from the server's usage, warm-up included. Another client "
                    "sending to the engine during the sweep, requests the client gave up on "
                    "(timeouts) that the engine still ran, or a server whose usage miscounts "
                    "would each do this; the run's throughput figures count the client's tokens."
                ),
                evidence={
                    "levels": [_level_name(lv) for lv in off],
                    "gaps": [_round(lv.engine[key]) for lv in off],
                    "threshold": TOKEN_GAP,
                    "chart": None,
                },
                plan=["Sweep again with no other client on the engine"],
            )
        )
    return out


# Where each engine reports how many tokens a KV-cache block holds: its prefix cache reuses whole
# blocks only (vLLM's cache_config.block_size; SGLang's page_size).
KV_BLOCK_ARGS = ("cache_config.block_size", "page_size")


def _kv_block(observed) -> int | None:
    """The tokens of one KV-cache block the engine reported of itself, None where unknown."""
    args = (observed or {}).get("args") or {}
    found = next((args[key] for key in KV_BLOCK_ARGS if key in args), None)
    return found if is_integer(found) and found > 0 else None


def cold_prefix_cache(data: RunData) -> list[Proposal]:
    """A shared-prefix workload (the kind of the run's `workload` parameter,
    Workload.run_parameter) whose levels show a prefix-cache hit rate near zero: prefix caching
    is off, or the cache evicts the prefixes before they are used again; or, where the shared
    prefix is shorter than one of the engine's KV-cache blocks, the cache cannot hit at all."""
    if workload_identity(data.parameters.get("workload"))["kind"] != SHARED_PREFIX:
        return []
    read = [lv for lv in data.levels if lv.engine.get("prefix_cache_hit_rate") is not None]
    cold = [lv for lv in read if lv.engine["prefix_cache_hit_rate"] <= COLD_PREFIX_CACHE]
    if not cold:
        return []
    name = cold[0].engine.get("engine") or data.engine
    engine = engine_label(name)
    prefix = ((data.parameters.get("workload") or {}).get("spec") or {}).get("prefix_len")
    block = _kv_block(data.observed)
    if is_integer(prefix) and block is not None and prefix < block:
        return [_prefix_under_a_block(cold, read, engine, prefix, block)]
    flag = (
        "--enable-prefix-caching"
        if name == "vllm"
        else "the radix cache (no --disable-radix-cache)"
    )
    return [
        Proposal(
            kind="prefix_cache",
            key="cold",
            severity="warning",
            title=f"{engine}'s prefix cache hit {cold[0].engine['prefix_cache_hit_rate']:.1%} "
            f"of a shared-prefix workload at {_level_name(cold[0])}",
            text=(
                f"The workload shares long prefixes between requests, yet at {len(cold)} of "
                f"{len(read)} levels the engine's own counters show a prefix-cache hit rate at "
                f"or below {COLD_PREFIX_CACHE:.0%}: prefix caching is off, or the cache "
                "evicts the shared prefixes before the next request of their group comes "
                "(too little KV cache for the groups in flight). Every request then prefills "
                "its whole prompt, and TTFT and throughput are those of a cache that does "
                "nothing."
            ),
            evidence={
                "levels": [_level_name(lv) for lv in cold],
                "hit_rates": [_round(lv.engine["prefix_cache_hit_rate"]) for lv in cold],
                "threshold": COLD_PREFIX_CACHE,
                "chart": None,
            },
            plan=[f"Turn on {flag}, or give the KV cache room for the shared prefixes"],
        )
    ]


def _prefix_under_a_block(cold, read, engine, prefix, block) -> Proposal:
    return Proposal(
        kind="prefix_cache",
        key="cold",
        severity="info",
        title=f"{engine}'s prefix cache cannot reuse this workload's {prefix}-token prefixes: "
        f"it reuses whole blocks of {block} tokens",
        text=(
            f"The workload's shared prefixes are {prefix} tokens, shorter than one block of "
            f"{engine}'s KV cache ({block} tokens, as the engine reports it). A prefix cache "
            "reuses whole blocks only, so no request can reuse its group's prefix: the hit "
            f"rate at or below {COLD_PREFIX_CACHE:.0%} at {len(cold)} of {len(read)} levels is "
            "what this workload can get, not prefix caching off or evicting."
        ),
        evidence={
            "levels": [_level_name(lv) for lv in cold],
            "hit_rates": [_round(lv.engine["prefix_cache_hit_rate"]) for lv in cold],
            "prefix_len": prefix,
            "kv_block_tokens": block,
            "chart": None,
        },
        plan=[f"Measure prefix reuse with shared prefixes of at least {block} tokens"],
    )


RULES = (
    failed_requests,
    engine_mismatch,
    plateau,
    idle_gpus,
    queueing,
    no_tuned_kernel,
    kernel_provenance,
    topology,
    incompatibilities,
    regression,
    client_bound,
    capacity_at_cap,
    engine_token_counts,
    cold_prefix_cache,
)


# -- evidence helpers ------------------------------------------------------------------------


def _line(x, x_label, y_label, series):
    return _figure("line", x, x_label, y_label, series)


def _bar(x, x_label, y_label, series):
    return _figure("bar", x, x_label, y_label, series)


def _figure(kind, x, x_label, y_label, series):
    return {
        "type": kind,
        "x": list(x),
        "x_label": x_label,
        "y_label": y_label,
        "series": [{"name": name, "y": list(y)} for name, y in series],
    }


def _heatmap(sub, title):
    return {
        "type": "heatmap",
        "title": title,
        "x": sub["labels"],
        "y": sub["labels"],
        "z": sub["matrix"],
        "x_label": "GPU",
        "y_label": "GPU",
    }


def _round(value, digits=4):
    return None if value is None else round(value, digits)


def _pct(fraction):
    return f"{fraction:+.1%}"


def _change_per_doubling(fraction):
    """ "grows +4.0%", "falls 1.8%", "stays flat": a fall is not said to grow."""
    if round(fraction, 3) == 0:
        return "stays flat"
    return f"grows {_pct(fraction)}" if fraction > 0 else f"falls {-fraction:.1%}"


def _key(*parts):
    """A finding key from its parts; hashed when too long for the column."""
    key = ":".join("x".join(map(str, p)) if isinstance(p, tuple) else str(p) for p in parts)
    if len(key) <= FINDING_KEY_MAX:
        return key
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return f"{key[: FINDING_KEY_MAX - 17]}~{digest}"
