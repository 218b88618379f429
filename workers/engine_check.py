"""Is a deployment's engine up and serving the model it should? (`workers.check_deployment`)"""

import httpx

from workers.engine_metrics import read_server_info


def check_engine(base_url, model="", *, timeout_s=5.0):
    """Probe /health and /v1/models of an OpenAI-compatible engine.

    Returns {"status": "healthy" | "degraded" | "failed", "detail": str, "models": [ids],
    "max_running_requests": int | None}: failed when the engine does not answer or /health is
    not 200, degraded when it answers but does not list `model`.
    """
    base = base_url.rstrip("/")
    out = {"status": "failed", "detail": "", "models": [], "max_running_requests": None}
    if not base:
        out["detail"] = "the deployment has no endpoint URL"
        return out
    with httpx.Client(timeout=timeout_s) as client:
        try:
            health = client.get(base + "/health")
            listed = client.get(base + "/v1/models")
        except httpx.HTTPError as exc:
            out["detail"] = f"{base} did not answer: {type(exc).__name__}: {exc}"
            return out
    if health.status_code != 200:
        out["detail"] = f"/health answered HTTP {health.status_code}"
        return out
    try:
        out["models"] = [m["id"] for m in listed.json()["data"]]
    except (ValueError, KeyError, TypeError):
        out["status"] = "degraded"
        out["detail"] = f"/v1/models answered HTTP {listed.status_code} without a model list"
        return out
    out["max_running_requests"] = read_server_info(base, timeout_s=timeout_s)[
        "max_running_requests"
    ]
    if model and model not in out["models"]:
        out["status"] = "degraded"
        out["detail"] = f"healthy, but serves {out['models']}, not {model!r}"
        return out
    out["status"] = "healthy"
    out["detail"] = f"healthy; serves {', '.join(out['models']) or 'no model'}"
    return out
