"""What answers at an engine's URL, asked of the engine itself: which engine, which version, and
the arguments it runs with.

`identify_engine(base_url)` reads what each engine serves:
- vLLM: GET /version; GET /server_info?config_format=json, its whole configuration and VLLM_*
  environment (served only with VLLM_SERVER_DEV_MODE=1); the names under /metrics and the labels
  of vllm:cache_config_info;
- SGLang: GET /get_server_info, its version and every server argument;
- both: GET /v1/models (served model ids, max_model_len, owned_by).
The stand-in engine says so in owned_by ("moeops-standin").

`kernel_config_in_effect(...)` finds the fused-MoE config file the engine would load for a MoE
shape, looking where that engine looks (docs/engines.md).
"""

import hashlib
import os
import socket

from prometheus_client.parser import text_string_to_metric_families

from domain import engine as reports
from tuning.config_files import CONFIG_ENV, ConfigFileError, config_file_name, search_path
from tuning.engine_source import EngineSourceError, locate_package
from workers import engine_paths
from workers.engine_defaults import defaults_differing
from workers.engine_http import EngineHTTP

METRIC_PREFIXES = ("vllm:", "sglang:")
DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 for moeops to read its /server_info"
# s vLLM's /server_info may take: its first answer after a start runs collect_env (pip, lscpu,
# nvidia-smi … as subprocesses, cached afterwards), 10.4 s on 2 busy cores, past a check's 10 s
SERVER_INFO_TIMEOUT_S = 60.0


def _models(body) -> list[dict]:
    data = (body or {}).get("data")
    if not isinstance(data, list):
        return []
    keep = ("id", "max_model_len", "owned_by", "root")
    return [{k: m.get(k) for k in keep} for m in data if isinstance(m, dict) and m.get("id")]


def _metric_names(text: str) -> tuple[list[str], dict]:
    """(engine metric family names, labels of vllm:cache_config_info) from a /metrics body."""
    names, cache_info = set(), {}
    try:
        for family in text_string_to_metric_families(text):
            ours = family.name.startswith(METRIC_PREFIXES)
            if ours and not family.name.endswith("_created"):
                names.add(family.name)
            if family.name == "vllm:cache_config_info" and family.samples:
                cache_info = dict(family.samples[0].labels)
    except ValueError:
        return [], {}
    return sorted(names), cache_info


def identify_engine(base_url: str, *, timeout_s: float = 10.0) -> dict:
    """What the engine at base_url says of itself.

    Returns domain.engine.identity's dict plus {"url", "reachable" (bool), "error" (why
    not, else "")}; "engine" is "vllm", "sglang", "standin" or "unknown", and "notes" says in
    sentences what could not be read and why.
    """
    base = base_url.rstrip("/")
    with EngineHTTP(base, timeout_s=timeout_s) as http:
        listed = http.get("/v1/models")
        if listed.status is None:
            out = reports.identity("unknown")
            return {**out, "url": base, "reachable": False, "error": f"{base}: {listed.error}"}
        models = _models(listed.json_object()) if listed.ok else []
        owners = {m.get("owned_by") for m in models}
        metrics = http.get("/metrics")
        names, cache_info = _metric_names(metrics.text) if metrics.ok else ([], {})
        sglang = http.get("/get_server_info")
        sglang_info = sglang.json_object() if sglang.ok else None

        if reports.STANDIN_OWNER in owners:
            engine = "standin"
        elif sglang_info is not None and "vllm_config" not in sglang_info:
            engine = "sglang"
        elif "vllm" in owners or any(n.startswith("vllm:") for n in names):
            engine = "vllm"
        elif "sglang" in owners or any(n.startswith("sglang:") for n in names):
            engine = "sglang"
        else:
            engine = "unknown"

        found = {"models": models, "metric_names": names}
        if engine in ("sglang", "standin") and sglang_info is not None:
            version = sglang_info.get("version")
            found.update(
                version=version if isinstance(version, str) else None,
                args=reports.sglang_args(sglang_info),
                args_source="/get_server_info",
                server_info=sglang_info,
            )
        elif engine == "vllm":
            version = http.get("/version")
            reported = (version.json_object() or {}).get("version") if version.ok else None
            found["version"] = reported if isinstance(reported, str) else None
            found.update(_vllm_config(http, cache_info))
    out = reports.identity(engine, **found)
    return {**out, "url": base, "reachable": True, "error": ""}


def _vllm_config(http: EngineHTTP, cache_info) -> dict:
    timeout = max(http.timeout_s, SERVER_INFO_TIMEOUT_S)
    info = http.get("/server_info?config_format=json", timeout_s=timeout)
    body = info.json_object() if info.ok else None
    config = body.get("vllm_config") if body else None
    if isinstance(config, dict):
        env = body.get("vllm_env")
        return {
            "args": reports.vllm_args(config),
            "args_source": "/server_info",
            "env": reports.vllm_env(env) if isinstance(env, dict) else {},
        }
    if info.status == 404:
        note = (
            "vLLM serves no /server_info, so its running-request cap and most of its "
            f"arguments are unknown: {DEV_MODE_HINT}"
        )
    elif info.status is None:
        note = f"vLLM's /server_info did not answer: {info.error}"
    else:
        note = f"vLLM's /server_info answered {info.status}: {info.reason()}"
    found = {"notes": [note]}
    if cache_info:
        labels = {f"cache_config.{k}": v for k, v in cache_info.items() if k != "engine"}
        found.update(args=labels, args_source="/metrics vllm:cache_config_info")
    return found


# ---------------------------------------------------------------------------------------------
# The kernel config the engine would load
# ---------------------------------------------------------------------------------------------


def locate_engine_package(engine: str, python: str | None = None) -> dict:
    """Where the engine's package is installed on this host (tuning.engine_source), as
    {"package_dir" (or None), "version", "triton", "error"}."""
    try:
        package = locate_package(engine, python=python)
    except EngineSourceError as exc:
        return {"package_dir": None, "version": None, "triton": None, "error": str(exc)}
    return {
        "package_dir": str(package.package_dir),
        "version": package.version,
        "triton": package.triton,
        "error": "",
    }


def kernel_config_in_effect(
    *,
    engine: str,
    shape: dict | None,
    reported_env: dict | None = None,
    package: dict | None = None,
) -> dict:
    """The fused-MoE config file the engine would load for shape, found where it looks.

    shape: {"E", "N", "device_name", "dtype", "block_shape"} of the deployment, or None. vLLM
    reads VLLM_TUNED_CONFIG_FOLDER first (as the engine reports it in reported_env, else this
    worker's environment), then the configs folder of its package; SGLang reads
    SGLANG_MOE_CONFIG_DIR (reported_env's, else this worker's; else its package
    folder)/configs/triton_<its Triton>/, then the other Triton folders newest first.
    package: locate_engine_package's answer (located when None).

    Returns {"state": "file" | "engine_default" | "not_applicable" | "unknown",
    "file_name", "path", "sha256", "folder" (which of the engine's folders), "shipped" (the
    file came with the engine, not from a tune), "searched", "reason"}.
    """
    out = {
        "state": "unknown",
        "file_name": None,
        "path": None,
        "sha256": None,
        "folder": None,
        "shipped": None,
        "searched": [],
        "reason": "",
    }
    if engine not in CONFIG_ENV:
        out["reason"] = f"moeops does not know where {engine} keeps kernel configs"
        return out
    if not shape or not shape.get("device_name"):
        out["state"] = "not_applicable"
        out["reason"] = (
            "no GPU is recorded for the deployment, so no fused-MoE Triton config applies"
        )
        return out
    if shape.get("dtype") is None:
        out["state"] = "not_applicable"
        out["reason"] = shape.get("reason") or "the MoE weights run on kernels that read no config"
        return out
    try:
        name = config_file_name(
            shape["E"],
            shape["N"],
            shape["device_name"],
            shape.get("dtype"),
            shape.get("block_shape"),
            style=engine,
        )
    except ConfigFileError as exc:
        out["reason"] = f"no file name for this shape: {exc}"
        return out
    out["file_name"] = name
    package = package or locate_engine_package(engine)
    variable = CONFIG_ENV[engine]
    candidates = search_path(
        engine,
        name,
        env_folder=(reported_env or {}).get(variable) or os.getenv(variable),
        package_dir=package.get("package_dir"),
        triton_version=package.get("triton"),
    )
    if not candidates:
        out["reason"] = package.get("error") or f"{engine}'s config folders are unknown here"
        return out
    out["searched"] = [str(path) for _, path, _ in candidates]
    for folder, path, shipped in candidates:
        if path.is_file():
            data = path.read_bytes()
            out.update(
                state="file",
                path=str(path),
                sha256=hashlib.sha256(data).hexdigest(),
                folder=folder,
                shipped=shipped,
            )
            return out
    out["state"] = "engine_default"
    out["reason"] = f"no {name} where {engine} looks: it runs its default kernel config"
    return out


def observe(
    base_url: str,
    *,
    kernel_shape: dict | None,
    recorded_engine: str = "",
    engine_log=None,
    gpu_indices=None,
    tp: int | None = None,
    nvml=None,
) -> dict:
    """What a sweep records of the engine when it starts: {"engine": identify_engine's dict,
    with a vLLM's "defaults" (workers.engine_defaults.defaults_differing), "kernel_config":
    kernel_config_in_effect's dict, "engine_paths": workers.engine_paths.observe_paths' dict
    (its start-up log: engine_log, a managed engine's; the source's decisions for the compute
    capability of the first of gpu_indices), "client": {"host", "pid"}}; "engine" and
    "engine_paths" are left out when nothing answered (a later attempt records them)."""
    identity = identify_engine(base_url)
    if identity["engine"] == "vllm" and identity.get("args_source") == "/server_info":
        identity["defaults"] = defaults_differing(identity)
    engine = identity["engine"] if identity["engine"] != "unknown" else recorded_engine
    if engine == "standin":
        kernel = {
            "state": "not_applicable",
            "reason": "the stand-in engine runs no kernels",
        }
    else:
        kernel = kernel_config_in_effect(
            engine=engine, shape=kernel_shape, reported_env=identity.get("env")
        )
    out = {"kernel_config": kernel, "client": {"host": socket.gethostname(), "pid": os.getpid()}}
    if identity["reachable"]:
        out["engine"] = identity
        capability, why_not = engine_paths.gpu_capability(gpu_indices, nvml)
        out["engine_paths"] = engine_paths.observe_paths(
            identity,
            log_path=engine_log,
            capability=capability,
            capability_note=why_not,
            tp=tp,
            kernel=kernel,
        )
    return out
