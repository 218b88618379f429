"""The engine's fast paths on this host's GPU, from the three sources (domain.engine_paths):
what the engine reports, what its start-up log says, and the decisions of its own source for the
GPU's compute capability (tuning.engine_paths). A sweep records them beside the snapshot; the
CLI answers the source part for any capability:

    python -m workers.cli engine-paths --engine vllm --capability 12.0 --tp 8 --json
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from domain import engine_paths as paths
from domain.engine_paths import EnginePaths, Evidence, PathRow
from tuning.engine_paths import source_paths
from tuning.engine_source import ENGINE_PYTHON_ENV
from workers.engine_supervisor import EngineSupervisor
from workers.topology import _load_nvml, _nvml_call

# Past this a start-up log is read from its start only: the lines that decide the paths come
# in the first seconds of a start, and a long-running engine's log grows with every request.
LOG_READ_BYTES = 8 * 2**20
EXTERNAL_LOG = (
    "moeops keeps no start-up log of an engine it did not start, and the deployment names none "
    "(its engine log field): the log rows are unknown"
)
_INSTALLED = """
import importlib.util as u, json
def found(name):
    try:
        return u.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
def torch_cuda():
    # torch/version.py says what CUDA torch is built for, read without importing torch
    try:
        spec = u.find_spec("torch")
        folder = spec.submodule_search_locations[0]
        for line in open(folder + "/version.py"):
            if line.startswith("cuda"):
                value = line.split("=", 1)[1].split("#")[0].strip().strip(chr(34) + chr(39))
                return None if value == "None" else value
    except (ImportError, ValueError, OSError, TypeError, IndexError):
        pass
    return None
print(json.dumps({"flashinfer": found("flashinfer"),
                  "deep_gemm": found("deep_gemm") or found("vllm.third_party.deep_gemm"),
                  "torch_cuda": torch_cuda()}))
"""


def gpu_capability(indices=None, nvml=None) -> tuple[str | None, str]:
    """(the compute capability of the first of indices (or of GPU 0), "12.0", or None; why
    not, else ""), from NVML."""
    nvml, reason = _load_nvml(nvml)
    if nvml is None:
        return None, f"no CUDA GPU on this host (NVML: {reason})"
    index = (indices or [0])[0]
    try:
        handle = _nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
        found = _nvml_call(nvml, "nvmlDeviceGetCudaComputeCapability", handle) if handle else None
    finally:
        # NVML counts its inits: each one this takes, it gives back
        _nvml_call(nvml, "nvmlShutdown")
    capability = found
    if not capability:
        return None, f"NVML gives no compute capability for GPU {index}"
    return f"{capability[0]}.{capability[1]}", ""


def managed_log(deployment, *, managed: bool, external="", supervisor=None) -> Path | None:
    """The engine's start-up log: a managed deployment's is the one this host's supervisor
    keeps (engine.log, its latest start); an external one's is the path its deployment records
    (engine_log), else None: moeops does not see it."""
    if managed and deployment is not None:
        return (supervisor or EngineSupervisor()).log_path(deployment)
    return Path(external) if external else None


def installed_beside(python: str | None) -> dict:
    """{"flashinfer", "deep_gemm": bool, "torch_cuda": "12.9" or None} for the engine's Python,
    found without importing them; {} when that Python cannot be asked (the decisions then say
    what they depend on)."""
    if not python:
        return {}
    try:
        done = subprocess.run(
            [python, "-c", _INSTALLED], capture_output=True, text=True, timeout=60, check=False
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def model_config_at(model_path) -> tuple[dict | None, str]:
    """(the config.json of the model an engine serves from model_path, a local folder as the
    engine reports it (SGLang's model_path), or None; why not, else "")."""
    if not model_path:
        return None, "the engine reports no model_path"
    path = Path(str(model_path)) / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError:
        return None, f"no config.json at the engine's model_path {model_path} on this host"
    except ValueError as exc:
        return None, f"{path} is not JSON ({exc})"
    return (config, "") if isinstance(config, dict) else (None, f"{path} holds no object")


def read_log(path) -> tuple[str | None, str]:
    """(the log's text with its lines as the file has them, or None; why not)."""
    if path is None:
        return None, EXTERNAL_LOG
    path = Path(path)
    try:
        with path.open("rb") as log:
            data = log.read(LOG_READ_BYTES)
    except FileNotFoundError:
        return None, f"the engine's start-up log {path} is gone (never written, or removed)"
    except OSError as exc:
        return None, f"the engine's start-up log {path} cannot be read: {exc.strerror}"
    return data.decode("utf-8", errors="replace"), ""


def _report(identity: dict) -> list[PathRow]:
    engine, version = identity.get("engine"), identity.get("version")
    if engine == "vllm":
        if identity.get("args_source") != "/server_info":
            notes = identity.get("notes") or []
            missing = notes[0] if notes else "vLLM served no /server_info"
            return paths.report_rows(None, version=version, missing=missing)
        return paths.report_rows(identity.get("args"), version=version)
    if engine == "sglang":
        return paths.sglang_report_rows(identity.get("args"), version=version)
    # the stand-in reports no paths: its rows come from the lines it is told to log
    return []


def _tp(identity: dict, fallback: int | None) -> int:
    args = identity.get("args") or {}
    for key in ("parallel_config.tensor_parallel_size", "tp_size"):
        if isinstance(args.get(key), int):
            return args[key]
    return fallback or 1


def _kernel_row(kernel: dict | None) -> list[PathRow]:
    """The MoE kernel config row of what kernel_config_in_effect found where the engine looks."""
    if not kernel or kernel.get("state") not in ("file", "engine_default"):
        return []
    if kernel["state"] == "file":
        where = "the engine's config folders"
        text = f"{kernel.get('file_name')} in {kernel.get('folder')} ({kernel.get('path')})"
        shipped = "shipped with the engine" if kernel.get("shipped") else "tuned"
        return [
            PathRow(
                key="moe_config",
                state="on",
                value=kernel.get("file_name"),
                reason=f"the engine loads {kernel.get('file_name')} ({shipped})",
                evidence=[Evidence(source="source", text=text, where=where)],
            )
        ]
    searched = ", ".join(kernel.get("searched") or []) or "its config folders"
    return [
        PathRow(
            key="moe_config",
            state="fell_back",
            value="default config",
            reason=kernel.get("reason") or "no tuned config where the engine looks",
            evidence=[Evidence(source="source", text=f"searched {searched}", where=searched)],
            link="tune",
        )
    ]


def observe_paths(
    identity: dict,
    *,
    log_path=None,
    capability: str | None = None,
    capability_note: str = "",
    tp: int | None = None,
    kernel: dict | None = None,
    model_config: dict | None = None,
    python: str | None = None,
) -> dict:
    """The engine paths of the engine that answered (identity: workers.engine_info's
    identify_engine), as EnginePaths' JSON: the report's rows, the log's at log_path (a managed
    engine's engine.log; None for an external one), the source's for capability (None: no CUDA
    GPU, the CPU build's paths) and the kernel config the engine would load (kernel). Never
    raises: what cannot be read is an "unknown" row or a note saying why."""
    engine = identity.get("engine") or "unknown"
    tp = _tp(identity, tp)
    out = EnginePaths(engine=engine, version=identity.get("version"), capability=capability, tp=tp)
    if capability_note:
        out.notes.append(capability_note)
    report = _report(identity)
    text, missing = read_log(log_path)
    log = paths.log_rows(text, missing=missing)
    if engine == "standin":
        # a stand-in writes no engine's start-up lines but those it is told to
        log = [row for row in log if row.state != "unknown"]
    source: list[PathRow] = []
    if engine == "sglang" and model_config is None:
        # SGLang's fusion asks the model's architecture: the config.json it serves from
        model_config, why_not = model_config_at((identity.get("args") or {}).get("model_path"))
        if why_not:
            out.notes.append(why_not)
    if engine in ("vllm", "sglang"):
        python = python or _engine_python(engine)
        try:
            found = source_paths(
                engine,
                capability=capability,
                tp=tp,
                python=python,
                model_config=model_config,
                env=identity.get("env"),
                installed=installed_beside(python),
            )
        except Exception as exc:  # the engine's code is not ours: a row says why, never a crash
            found = EnginePaths(notes=[f"the engine's source could not be evaluated: {exc}"])
        source = found.rows
        out.notes.extend(n for n in found.notes if n not in out.notes)
    elif engine == "standin":
        out.notes.append("the stand-in engine has no source to evaluate")
    for row in (*log, *report):
        for evidence in row.evidence:
            if evidence.source == "log" and evidence.where.startswith("engine.log"):
                evidence.where = evidence.where.replace("engine.log", str(log_path), 1)
    out.rows = paths.merge_paths(report, log, source, _kernel_row(kernel))
    return out.model_dump(mode="json")


def _engine_python(engine: str) -> str:
    """The engine's Python as tuning.engine_source finds the engine: its variable, else ours."""
    return os.getenv(ENGINE_PYTHON_ENV[engine]) or sys.executable
