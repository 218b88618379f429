"""Is a deployment's engine up, serving the model it should, and is it the engine on record?
(`workers.check_deployment`)"""

import time

from domain import engine as engine_reports
from workers.engine_info import identify_engine


def check_engine(base_url, model="", *, recorded_engine="", timeout_s=10.0):
    """Ask the engine at base_url what it is and whether it serves `model`.

    Returns {"status": "healthy" | "degraded" | "failed", "up" (bool), "detail" (a sentence),
    "latency_ms" (the /v1/models answer, or None), "engine", "version", "models",
    "max_running_requests"}: failed when nothing answers; degraded when it answers but does
    not list `model`, or when another engine than the recorded one answers.
    """
    out = {
        "status": "failed",
        "up": False,
        "detail": "",
        "latency_ms": None,
        "engine": None,
        "version": None,
        "models": [],
        "max_running_requests": None,
    }
    base = (base_url or "").rstrip("/")
    if not base:
        out["detail"] = "the deployment has no endpoint URL"
        return out
    started = time.perf_counter()
    identity = identify_engine(base, timeout_s=timeout_s)
    if not identity["reachable"]:
        out["detail"] = f"the engine did not answer: {identity['error']}"
        return out
    out.update(
        up=True,
        latency_ms=(time.perf_counter() - started) * 1000,
        engine=identity["engine"],
        version=identity["version"],
        models=[m["id"] for m in identity["models"]],
        max_running_requests=identity["max_running_requests"],
    )
    answering = engine_reports.label(identity)
    if (
        recorded_engine in ("vllm", "sglang")
        and identity["engine"] in ("vllm", "sglang", "standin")
        and identity["engine"] != recorded_engine
    ):
        out["status"] = "degraded"
        out["detail"] = (
            f"recorded as {engine_reports.label(recorded_engine)}, but {answering} answers"
        )
        return out
    if model and model not in out["models"]:
        out["status"] = "degraded"
        out["detail"] = f"{answering} answers, but serves {out['models']}, not {model!r}"
        return out
    out["status"] = "healthy"
    out["detail"] = f"{answering} serves {', '.join(out['models']) or 'no model'}"
    return out
