"""A run's levels as the result files other tools read: `vllm bench serve --save-result`'s JSON
object per level, under vLLM's key names (the names moeops' vLLM import reads first), in the
JSON array `vllm bench sweep serve` writes as summary.json and `vllm bench sweep plot` reads."""

import json

from django.db.models import F

from moeops.runs.importers import ALIASES

# vLLM's client backends for an OpenAI-compatible server (vllm.benchmarks.lib.
# endpoint_request_func): not "vllm", which a vLLM import reads as the engine, and a run of
# SGLang is not one.
VLLM_BACKENDS = {"completions": "openai", "chat": "openai-chat"}


def levels_in_order(run):
    """The run's levels as vLLM's sweep lists them: by concurrency, the unlimited rate first
    (NULL, which PostgreSQL sorts last and SQLite first unless told)."""
    return list(run.levels.order_by("concurrency", F("request_rate").asc(nulls_first=True), "id"))


def vllm_results(run, levels) -> list[dict]:
    """One `vllm bench serve --save-result` object per level (a level of several rounds: its
    median figures), in the levels' order: the run's setup keys (date, backend, label, model_id,
    num_prompts, request_rate "inf" when unlimited, burstiness, max_concurrency), the level's
    metrics under vLLM's names (ms, tok/s, req/s; a metric the level lacks is left out, as vLLM
    leaves out a percentile not asked for), random_input_len/random_output_len for a run of
    random ids of fixed lengths, and moeops_run (the run's UUID, as vLLM's --metadata adds
    keys)."""
    parameters = run.parameters or {}
    backend = VLLM_BACKENDS.get(parameters.get("endpoint") or "completions", "openai")
    started = run.started_at or run.created
    model_id = _model_id(run, levels)
    random_lengths = not isinstance(parameters.get("workload"), dict)
    out = []
    for level in levels:
        result = {
            "date": started.strftime("%Y%m%d-%H%M%S"),
            "endpoint_type": backend,
            "backend": backend,
            "label": run.label or None,
            "model_id": model_id,
            "tokenizer_id": model_id,
            "num_prompts": (level.completed or 0) + (level.failed or 0),
            "request_rate": "inf" if level.request_rate is None else level.request_rate,
            "burstiness": parameters.get("burstiness") or 1.0,
            "max_concurrency": level.concurrency,
        }
        if random_lengths and level.input_len and level.output_len:
            result.update(
                dataset_name="random",
                random_input_len=level.input_len,
                random_output_len=level.output_len,
            )
        for field, keys in ALIASES.items():
            value = getattr(level, field)
            if value is not None:
                result[keys[0]] = value
        result["moeops_run"] = str(run.uuid)
        out.append(result)
    return out


def vllm_results_json(run, levels) -> str:
    """vllm_results as a JSON array, one level's object a line (a refusal on import names it)."""
    objects = [json.dumps(obj, allow_nan=False) for obj in vllm_results(run, levels)]
    return "[\n" + ",\n".join(objects) + "\n]\n"


def _model_id(run, levels):
    """The model the requests named: the sweep's, else the model an imported file names."""
    model = (run.parameters or {}).get("model")
    if not model:
        raw = levels[0].raw if levels and isinstance(levels[0].raw, dict) else {}
        model = raw.get("model_id") if isinstance(raw.get("model_id"), str) else None
    return model or run.recorded().other_model or run.deployment.request_model_name
