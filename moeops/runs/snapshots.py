"""A run's snapshot: what it measured, recorded once and never rewritten.

When a run is created the web tier records the deployment as it stands (engine, version and
launch arguments as recorded by people), the host's topology, the load, the kernel shape and the
moeops version. When the sweep starts, the worker adds what the engine itself answers (engine,
version, reported arguments, running-request cap: workers.engine_info), the kernel config the
engine would load for that shape, and the client host. Imported runs record what their files
say. Editing a deployment afterwards changes no snapshot.

    {"recorded_at", "moeops_version", "source": "worker" | "import" | "manual" | "write-up",
     "deployment": {...}, "topology": {...} | None, "load": {...}, "kernel_shape": {...} | None,
     "engine": identify_engine's dict, "kernel_config": kernel_config_in_effect's dict,
     "client": {"host", "pid"}, "file": {...} (imports),
     "workload": {"name", "version", "kind", "sha256"}}

`snapshot_diff(a, b)` lists what differs between two snapshots, for the compare page, the API
and the regression finding.
"""

import functools
import math
import subprocess
from pathlib import Path

from django.utils import timezone

from domain import launch
from domain.engine_paths import EnginePaths, path_differences
from domain.snapshot import RunSnapshot
from domain.workloads import WORKLOAD_KEYS, workload_identity
from moeops import __version__

# The parts of a snapshot the worker adds once the engine has answered.
OBSERVED_KEYS = ("engine", "kernel_config", "client", "engine_paths")
# Load parameters that make two sweeps different loads.
LOAD_KEYS = (
    "levels",
    "input_len",
    "output_len",
    "prompts_per_level",
    "warmup",
    "endpoint",
    "request_rate",
    "request_rates",
    "burstiness",
    "ramp_up_s",
    "processes",
    "vocab_size",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_e2el_ms",
)
# The deployment's fields that say how it serves its model: an imported file of another model
# takes them from what the file states (None where it does not say), never the deployment's.
SERVING_KEYS = (
    "model",
    "engine",
    "engine_version",
    "tp",
    "ep",
    "max_running_requests",
    "quantization",
    "attention_backend",
    "allreduce_fusion",
    "launch_args",
)
DEPLOYMENT_KEYS = ("name", *SERVING_KEYS, "endpoint_url", "served_model_name", "host", "gpus")
ENGINE_KEYS = ("engine", "version", "max_running_requests", "max_model_len", "allreduce_fusion")
KERNEL_KEYS = ("state", "file_name", "sha256", "folder")
TOPOLOGY_KEYS = ("fingerprint", "virtualization", "driver_version", "cuda_version", "gpus")
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def moeops_version() -> str:
    """moeops' version, with the git commit when the code runs from a checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return __version__
    commit = done.stdout.strip()
    return f"{__version__}+g{commit}" if done.returncode == 0 and commit else __version__


def deployment_record(deployment) -> dict:
    """The deployment's fields as people recorded them, in plain JSON values."""
    return {
        "name": deployment.name,
        "model": deployment.model.name,
        "engine": deployment.engine,
        "engine_version": deployment.engine_version,
        "tp": deployment.tp,
        "ep": deployment.ep,
        "max_running_requests": deployment.max_running_requests,
        "quantization": deployment.quantization,
        "attention_backend": deployment.attention_backend,
        "allreduce_fusion": deployment.allreduce_fusion,
        "launch_args": dict(deployment.launch_args or {}),
        "endpoint_url": deployment.endpoint_url,
        "served_model_name": deployment.served_model_name,
        # where the worker reads an external engine's start-up log (not a serving field)
        "engine_log": deployment.engine_log,
        "host": deployment.host.name,
        # sorted here, not order_by(): a page that prefetched the GPUs asks for them once
        "gpus": [
            {"index": g.index, "name": g.name}
            for g in sorted(deployment.gpus.all(), key=lambda gpu: gpu.index)
        ],
    }


def topology_record(snapshot) -> dict | None:
    """The topology snapshot the run ran on, short: its id, fingerprint and what it says."""
    if snapshot is None:
        return None
    return {
        "id": snapshot.pk,
        "captured_at": snapshot.captured_at.timestamp(),
        "fingerprint": snapshot.fingerprint,
        "virtualization": snapshot.virtualization_label,
        "driver_version": snapshot.driver_version,
        "cuda_version": snapshot.cuda_version,
        "gpus": [g.get("name") for g in snapshot.gpus or [] if isinstance(g, dict)],
    }


def load_record(parameters: dict) -> dict:
    """The load of a sweep (LOAD_KEYS present in its parameters)."""
    return {k: parameters[k] for k in LOAD_KEYS if parameters.get(k) is not None}


def workload_record(parameters: dict) -> dict:
    """The workload a sweep sent (domain.workloads.WORKLOAD_KEYS of its parameters'
    `workload`); a sweep that names none sends random token ids of its input and output
    lengths."""
    return workload_identity(parameters.get("workload"))


def _workload_of(snapshot: dict) -> dict | None:
    """The snapshot's workload; a worker's sweep recorded before workloads were kept sent random
    ids; an imported file's workload is not known."""
    recorded = RunSnapshot.read(snapshot)
    if recorded.workload:
        return recorded.workload
    return workload_record({}) if recorded.source == "worker" else None


def recipe_record(recipe) -> dict | None:
    """The launch recipe a managed engine runs: its version, flags (domain.launch.flags),
    environment and the kernel configs its folder holds."""
    if recipe is None:
        return None
    return {
        "version": recipe.version,
        "flags": launch.flags(recipe.argv),
        "env": dict(recipe.env),
        "kernel_configs": sorted(str(config) for config in recipe.kernel_configs.all()),
    }


def recipe_content(record: dict) -> dict:
    """What a recipe record runs, its version aside: a revert, or a bisection's restore, runs
    what an older version ran."""
    return {key: value for key, value in record.items() if key != "version"}


def initial_snapshot(*, deployment, parameters, topology, source, recipe=None) -> dict:
    """What the web tier records when a run is created. recipe: the launch recipe the engine
    will run (default: the one in force for a managed deployment)."""
    if recipe is None and deployment.is_managed:
        recipe = deployment.recipe_in_force()
    snapshot = {
        "recorded_at": timezone.now().timestamp(),
        "moeops_version": moeops_version(),
        "source": source,
        "deployment": deployment_record(deployment),
        "topology": topology_record(topology),
        "load": load_record(parameters or {}),
        "kernel_shape": deployment.kernel_shape(),
    }
    if source == "worker":
        snapshot["workload"] = workload_record(parameters or {})
    if recipe is not None:
        snapshot["recipe"] = recipe_record(recipe)
    return snapshot


def deployment_edits(snapshot: dict, deployment) -> list[dict]:
    """The deployment's fields that changed since the run's snapshot was recorded."""
    then = snapshot.get("deployment")
    if not then:
        return []
    now = deployment_record(deployment)
    return [
        {"key": k, "a": then.get(k), "b": now.get(k)}
        for k in DEPLOYMENT_KEYS
        if then.get(k) != now.get(k)
    ]


# --------------------------------------------------------------------------- diff

SECTIONS = (
    ("engine", "Engine (as it answered)"),
    ("args", "Launch arguments (as the engine reported them)"),
    ("env", "Engine environment"),
    ("deployment", "Deployment (as recorded)"),
    ("recipe", "Launch recipe (managed engine)"),
    ("kernel_config", "Kernel config in effect"),
    ("engine_paths", "Engine paths"),
    ("topology", "Topology"),
    ("load", "Load"),
    ("workload", "Workload"),
    ("moeops", "moeops"),
)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _changes(section, a: dict, b: dict, keys=None) -> list[dict]:
    keys = keys if keys is not None else sorted(set(a) | set(b))
    return [
        {"section": section, "key": k, "a": a.get(k), "b": b.get(k)}
        for k in keys
        if not _same(a.get(k), b.get(k))
    ]


def snapshot_diff(a: dict, b: dict) -> dict:
    """What differs from snapshot a to snapshot b.

    Returns {"changes": [{"section", "key", "a", "b"}], "unknown": [sentences on what one of
    them did not record]}; sections as in SECTIONS. Launch arguments are compared as the engines
    reported them when both did (same source), else as the deployments recorded them.
    """
    changes, unknown = [], []
    if not a or not b:
        unknown.append("a run has no snapshot (it was recorded before moeops kept them)")
        return {"changes": [], "unknown": unknown}
    ea, eb = a.get("engine") or {}, b.get("engine") or {}
    if ea and eb:
        changes += _changes("engine", ea, eb, ENGINE_KEYS)
        if ea.get("args_source") and ea.get("args_source") == eb.get("args_source"):
            changes += _changes("args", ea.get("args") or {}, eb.get("args") or {})
            changes += _changes("env", ea.get("env") or {}, eb.get("env") or {})
        elif ea.get("args") or eb.get("args"):
            unknown.append("the engines reported their arguments differently (or one did not)")
    else:
        unknown.append("a run did not record what its engine answered")
    changes += _changes(
        "deployment", a.get("deployment") or {}, b.get("deployment") or {}, DEPLOYMENT_KEYS
    )
    ra, rb = a.get("recipe"), b.get("recipe")
    if ra and rb:
        changes += _changes("recipe", _recipe_keys(ra), _recipe_keys(rb))
    ka, kb = a.get("kernel_config"), b.get("kernel_config")
    if ka and kb:
        changes += _changes("kernel_config", ka, kb, KERNEL_KEYS)
    elif ka or kb:
        unknown.append("a run did not record the kernel config in effect")
    pa, pb = EnginePaths.read(a.get("engine_paths")), EnginePaths.read(b.get("engine_paths"))
    if pa and pb:
        changes += [
            {"section": "engine_paths", "key": title, "a": was, "b": now}
            for title, was, now in path_differences(pa, pb)
        ]
    elif pa or pb:
        unknown.append("a run did not record its engine paths")
    ta, tb = a.get("topology"), b.get("topology")
    if ta and tb:
        changes += _changes("topology", ta, tb, TOPOLOGY_KEYS)
    elif ta or tb:
        unknown.append("a run has no topology snapshot")
    changes += _changes("load", a.get("load") or {}, b.get("load") or {})
    wa, wb = _workload_of(a), _workload_of(b)
    if wa and wb:
        changes += _changes("workload", wa, wb, WORKLOAD_KEYS)
    elif wa or wb:
        unknown.append("a run did not record its workload")
    changes += _changes(
        "moeops",
        {"version": a.get("moeops_version"), "client host": (a.get("client") or {}).get("host")},
        {"version": b.get("moeops_version"), "client host": (b.get("client") or {}).get("host")},
    )
    return {"changes": changes, "unknown": unknown}


def tuned_file_in_effect(snapshot: dict) -> dict | None:
    """The snapshot's kernel config when the engine loaded a file that did not ship with it
    (a tuned one), with its file name and SHA-256; else None."""
    in_effect = RunSnapshot.read(snapshot).kernel_config or {}
    loaded = in_effect.get("state") == "file" and in_effect.get("shipped") is False
    return in_effect if loaded and in_effect.get("sha256") and in_effect.get("file_name") else None


def engine_moved(a: dict, b: dict) -> dict | None:
    """{"engine", "from", "to"} when the same engine answered both snapshots at two versions
    while the same tuned kernel file (same SHA-256) was in effect: the file was not tuned in
    b's kernel, whatever it was tuned in. None otherwise."""
    ea, eb = RunSnapshot.read(a).engine, RunSnapshot.read(b).engine
    fa, fb = tuned_file_in_effect(a), tuned_file_in_effect(b)
    moved = ea.get("engine") == eb.get("engine") and ea.get("version") != eb.get("version")
    if not (moved and ea.get("version") and eb.get("version") and fa and fb):
        return None
    if fa["sha256"] != fb["sha256"]:
        return None
    return {"engine": eb["engine"], "from": ea["version"], "to": eb["version"]}


# The factor a difference between two snapshots varies, as people name it; sections not listed
# here are one factor each (SECTION_FACTORS), keys in NOT_FACTORS vary none.
KEY_FACTORS = {
    ("deployment", "model"): "model",
    ("deployment", "engine"): "engine",
    ("engine", "engine"): "engine",
    ("deployment", "engine_version"): "engine version",
    ("engine", "version"): "engine version",
    ("deployment", "tp"): "parallelism",
    ("deployment", "ep"): "parallelism",
    ("deployment", "max_running_requests"): "running-request cap",
    ("engine", "max_running_requests"): "running-request cap",
    ("engine", "max_model_len"): "max model length",
    ("deployment", "quantization"): "quantization",
    ("deployment", "attention_backend"): "attention backend",
    ("deployment", "allreduce_fusion"): "allreduce fusion",
    ("engine", "allreduce_fusion"): "allreduce fusion",
    ("deployment", "launch_args"): "launch arguments",
    ("deployment", "host"): "host",
    ("deployment", "gpus"): "GPUs",
    ("moeops", "version"): "moeops version",
    ("moeops", "client host"): "client host",
}
SECTION_FACTORS = {
    "args": "launch arguments",
    "env": "engine environment",
    "kernel_config": "kernel config",
    "engine_paths": "engine paths",
    "recipe": "launch recipe",
    "topology": "topology",
    "load": "load",
    "workload": "workload",
}
# Keys that name a thing rather than configure it, or follow from another factor: a kernel
# file's name follows from the model's shape and the GPU.
NOT_FACTORS = {
    ("deployment", "name"),
    ("deployment", "endpoint_url"),
    ("deployment", "served_model_name"),
    ("kernel_config", "file_name"),
}
# Factors that change how a run was taken, not what the engine did.
INCIDENTAL_FACTORS = ("moeops version", "client host")


def differing_factors(diff: dict) -> list[str]:
    """The factors a snapshot_diff varies ("model", "kernel config", …), each once, in the
    order of SECTIONS; names and what follows from another factor left out."""
    factors = []
    for change in diff["changes"]:
        where = (change["section"], change["key"])
        if where in NOT_FACTORS:
            continue
        factor = KEY_FACTORS.get(where) or SECTION_FACTORS.get(change["section"])
        if factor and factor not in factors:
            factors.append(factor)
    return factors


def _recipe_keys(recipe: dict) -> dict:
    """A recipe record as comparable keys: each flag, each variable (env NAME), the kernel
    configs; its version number is left out (it says that something changed, not what)."""
    keys = dict(recipe.get("flags") or {})
    keys.update({f"env {k}": v for k, v in (recipe.get("env") or {}).items()})
    keys["kernel configs"] = ", ".join(recipe.get("kernel_configs") or []) or "none"
    return keys


def describe_change(change: dict) -> str:
    """One change as a short phrase: "engine version 0.31.0 → 0.32.0"."""
    section = {
        "args": "",
        "env": "",
        "engine": "engine ",
        "deployment": "recorded ",
        "engine_paths": "",
    }.get(change["section"], change["section"].replace("_", " ") + " ")
    return f"{section}{change['key']} {show_value(change['a'])} → {show_value(change['b'])}"


def show_value(value) -> str:
    """A snapshot value as a change shows it: "unset" for None, long values cut at 60 characters."""
    if value is None:
        return "unset"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "…"
