"""Rules of the GPUs: idle GPUs under load (from the GPU telemetry) and the topology between the
GPUs a deployment uses (P2P that failed, links that cross NUMA nodes)."""

from statistics import fmean

from domain.topology import virtualization_words, vm_layer
from moeops.insights.rules.evidence import _bar, _heatmap, _line, _round
from moeops.insights.rules.run_data import Proposal, RunData, _level_of
from moeops.runs.telemetry import no_gpu_samples_text

# Idle GPUs: mean utilization below this (%) while requests are outstanding; a busy decode loop
# keeps a kernel running nearly all the time, so even an inefficient engine reads far above it.
IDLE_UTIL_PERCENT = 30.0
# Idle GPUs when no utilization is recorded: mean power below this fraction of the power limit
# (the write-up's 85 W of 600 W is 0.14).
IDLE_POWER_FRACTION = 0.25

# P2P statuses of `nvidia-smi topo -p2p` that say nothing against P2P: self, OK, unknown.
P2P_NOT_FAILED = ("X", "OK", "unknown", "U", None)
# Link types of `nvidia-smi topo -m` that cross the SMP interconnect between NUMA nodes
# (SOC is the pre-2017 name of SYS).
CROSS_NUMA_LINKS = ("SYS", "SOC")


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
