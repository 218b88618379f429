"""Result files of three other load tools, read as `vllm bench serve --save-result` objects.

- "aiperf": NVIDIA AIPerf's `profile_export_aiperf.json` (`aiperf profile`), one level: a sweep
  (`--concurrency 2,4`) writes one in each `concurrency_N/` folder.
- "guidellm": guidellm's `benchmarks.json` (`guidellm run --output kind=json`), one level per
  benchmark (a concurrency or a rate), each holding its requests.
- "inference-perf": kubernetes-sigs inference-perf's `stage_N_lifecycle_metrics.json`, one
  level (one load stage); the model and engine come from its run configuration, a YAML file of
  its own (inference_perf_config).

Each level comes out as an object with vLLM's result keys (`max_concurrency`, `request_rate`,
`completed`, `output_throughput`, `mean_ttft_ms`, …, latencies in ms) that
moeops.runs.importers reads as it reads vLLM's, `model_id` where the file names its model,
`backend` "vllm" only where the file says that vLLM served it, and `requests`
(domain.request_log columns) where the file holds its requests. docs/formats.md lists every key
read. A file that is not JSON, or a key read that holds what it may not, raises ValueError
naming the line or the key by its path from the file's root. Pure: no Django.
"""

import json
import math

import yaml

from domain import request_log
from domain.numbers import is_number

TOOL_FORMATS = ("aiperf", "guidellm", "inference-perf")

# vLLM's latency statistic → each tool's name for it
AIPERF_STATS = {
    "mean": "avg",
    "median": "p50",
    "std": "std",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
}
GUIDELLM_STATS = {"mean": "mean", "median": "median", "std": "std_dev"}
INFERENCE_PERF_STATS = {
    "mean": "mean",
    "median": "median",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
}

# vLLM's latency metric → AIPerf's. AIPerf's inter_token_latency is per request, (latency −
# TTFT) / (output tokens − 1): vLLM's TPOT; its inter_chunk_latency is each gap: vLLM's ITL.
AIPERF_LATENCY = {
    "ttft": "time_to_first_token",
    "tpot": "inter_token_latency",
    "itl": "inter_chunk_latency",
    "e2el": "request_latency",
}
# guidellm's inter_token_latency_ms is (latency − TTFT) / (output tokens − 1), vLLM's TPOT; it
# keeps no gap between chunks, so no ITL. Its request_latency is in s.
GUIDELLM_LATENCY = {
    "ttft": ("time_to_first_token_ms", 1.0),
    "tpot": ("inter_token_latency_ms", 1.0),
    "e2el": ("request_latency", 1000.0),
}
# inference-perf's latencies are in s; its time_per_output_token excludes the first token
# (vLLM's TPOT), its inter_token_latency is each gap (vLLM's ITL).
INFERENCE_PERF_LATENCY = {
    "ttft": "time_to_first_token",
    "tpot": "time_per_output_token",
    "itl": "inter_token_latency",
    "e2el": "request_latency",
}


class _Reader:
    """One JSON value of a file, read by key path; a problem names the path from the root."""

    def __init__(self, value, path=""):
        self.value, self.path = value, path

    def name(self, key):
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def at(self, *keys) -> "_Reader":
        """The value under keys (None where a key is absent); raises ValueError where a value on
        the way is not an object (an array for an int key)."""
        reader = self
        for key in keys:
            value = reader.value
            if value is None:
                return _Reader(None, reader.name(key))
            if isinstance(key, int):
                if not isinstance(value, list):
                    raise ValueError(f"{reader.path} is not a list: {_shown(value)}")
                item = value[key] if -len(value) <= key < len(value) else None
            else:
                if not isinstance(value, dict):
                    raise ValueError(
                        f"{reader.path or 'the file'} is not an object: {_shown(value)}"
                    )
                item = value.get(key)
            reader = _Reader(item, reader.name(key))
        return reader

    def number(self, *keys, scale=1.0):
        """A finite number times scale, or None where absent."""
        reader = self.at(*keys)
        value = reader.value
        if value is None:
            return None
        if not is_number(value):
            raise ValueError(f"{reader.path} is not a number: {_shown(value)}")
        try:
            number = float(value) * scale
        except OverflowError:
            # an integer of hundreds of digits, beyond any float
            raise ValueError(f"{reader.path} is too large a number: {_shown(value)}") from None
        if not math.isfinite(number):
            raise ValueError(f"{reader.path} is not a number: {_shown(value)}")
        return number

    def count(self, *keys):
        """A whole number ≥ 0 (8.0 reads as 8), or None where absent."""
        reader = self.at(*keys)
        value = reader.number()
        if value is None:
            return None
        if value < 0 or value != int(value):
            raise ValueError(f"{reader.path} is not a count: {_shown(reader.value)}")
        return int(value)

    def text(self, *keys):
        reader = self.at(*keys)
        if reader.value is None:
            return None
        if not isinstance(reader.value, str):
            raise ValueError(f"{reader.path} is not text: {_shown(reader.value)}")
        return reader.value.strip() or None

    def items(self, *keys) -> list["_Reader"]:
        """Each element of a list (none where absent)."""
        reader = self.at(*keys)
        if reader.value is None:
            return []
        if not isinstance(reader.value, list):
            raise ValueError(f"{reader.path} is not a list: {_shown(reader.value)}")
        return [reader.at(i) for i in range(len(reader.value))]


def _shown(value):
    # YAML's values may be dates, which JSON has no word for
    text = json.dumps(value, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}… ({len(text)} characters)"


def _document(text):
    """The file's JSON; ValueError naming the line where it stops being JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {exc.lineno}: not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("line 1: not JSON (nested too deep to read)") from None
    except ValueError:
        raise ValueError("line 1: a number has more than 4,300 digits") from None


def _latencies(result, metric, stats, read):
    """Put `{stat}_{metric}_ms` into result for each vLLM stat → the tool's key read gives."""
    for stat, key in stats.items():
        value = read(key)
        if value is not None:
            result[f"{stat}_{metric}_ms"] = value


def _unit(reader, expected):
    unit = reader.text("unit")
    if unit is not None and unit != expected:
        raise ValueError(f"{reader.name('unit')} is {unit!r}, not {expected}")


def aiperf_levels(text):
    """[(where, result)]: the one level ("line 1") of an AIPerf profile_export_aiperf.json."""
    root = _Reader(_document(text))
    if not isinstance(root.value, dict) or "aiperf_version" not in root.value:
        raise ValueError("line 1: not AIPerf's profile_export_aiperf.json (no aiperf_version)")
    config = root.at("input_config")
    phases = [p for p in config.items("phases") if p.text("kind") == "profiling"]
    phase = phases[0] if phases else _Reader(None, "input_config.phases")
    models = [m.text("name") for m in config.items("models", "items")]
    result = {
        "tool": "aiperf",
        "tool_version": root.text("aiperf_version"),
        "model_id": next((m for m in models if m), None),
        "model_names": [m for m in models if m],
        "tokenizer_id": config.text("tokenizer", "name"),
        "endpoint_type": config.text("endpoint", "type"),
        "date": root.text("start_time"),
        "num_prompts": phase.count("requests"),
        "max_concurrency": phase.count("concurrency"),
        "request_rate": phase.number("rate"),
    }
    _unit(root.at("benchmark_duration"), "sec")
    result.update(
        {
            "duration": root.number("benchmark_duration", "avg"),
            "completed": root.count("request_count", "avg"),
            "failed": root.count("error_request_count", "avg") or 0,
            "total_input_tokens": root.count("total_isl", "avg"),
            "total_output_tokens": root.count("total_osl", "avg"),
            "request_throughput": root.number("request_throughput", "avg"),
            "output_throughput": root.number("output_token_throughput", "avg"),
            "total_token_throughput": root.number("total_token_throughput", "avg"),
        }
    )
    for metric, key in AIPERF_LATENCY.items():
        _unit(root.at(key), "ms")
        _latencies(result, metric, AIPERF_STATS, lambda stat, key=key: root.number(key, stat))
    return [("line 1", result)]


def aiperf_requests(text):
    """domain.request_log columns of AIPerf's per-request records (`profile_export.jsonl`, one
    record a line; those of its profiling phase, not its warmup): send time from the first
    request_start_ns, TTFT, latency, input and output tokens (AIPerf's counts, as its summary's),
    the error's message, the gaps between chunks (inter_chunk_latency). Raises ValueError naming
    the line, or the line and key."""
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = _document(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {str(exc).partition(': ')[2]}") from None
        reader = _Reader(record)
        try:
            if not isinstance(record, dict) or "metrics" not in record:
                raise ValueError("not a record of AIPerf's profile_export.jsonl (no metrics)")
            if reader.text("metadata", "benchmark_phase") not in (None, "profiling"):
                continue
            records.append(_aiperf_request(reader))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    if not records:
        raise ValueError("line 1: no record of the profiling phase")
    first = min(start for start, _ in records)
    columns = {key: [] for key in request_log.REQUEST_KEYS}
    for start, request in records:
        request["start_time"] = request_log.rounded((start - first) / 1e9)
        for key in request_log.REQUEST_KEYS:
            columns[key].append(request[key])
    request_log.check_columns(columns)
    return columns


def _aiperf_request(record):
    """(request_start_ns, {request_log key: value}) of one AIPerf record."""
    metrics = record.at("metrics")
    for key in ("time_to_first_token", "request_latency", "inter_chunk_latency"):
        _unit(metrics.at(key), "ms")
    start = record.count("metadata", "request_start_ns")
    if start is None:
        raise ValueError("metadata.request_start_ns is missing")
    error = record.at("error")
    message = error.text("message") if error.value is not None else None
    failed = error.value is not None
    gaps = metrics.at("inter_chunk_latency", "value")
    if gaps.value is not None and not isinstance(gaps.value, list):
        raise ValueError(f"{gaps.path} is not a list: {_shown(gaps.value)}")
    itl = (
        None
        if failed or gaps.value is None
        else [gaps.number(i, scale=0.001) for i in range(len(gaps.value))]
    )
    return start, {
        "ttft": None if failed else metrics.number("time_to_first_token", "value", scale=0.001),
        "latency": metrics.number("request_latency", "value", scale=0.001),
        "input_len": metrics.count("input_sequence_length", "value"),
        "output_len": None if failed else metrics.count("output_sequence_length", "value"),
        "status": "failed" if failed else "ok",
        "error_reason": None,
        "error": (message or "error")[:2000] if failed else None,
        "itl": itl,
    }


def guidellm_levels(text):
    """[(where, result)]: a guidellm benchmarks.json's benchmarks ("benchmarks[0]", …), each
    one level with its
    requests (the successful and errored ones it kept; the incomplete ones, cut off at the
    benchmark's end, are left out as vLLM leaves them out)."""
    document = _document(text)
    root = _Reader(document)
    if not isinstance(document, dict) or "benchmarks" not in document:
        raise ValueError("line 1: not guidellm's benchmarks.json (no benchmarks)")
    version = root.text("metadata", "guidellm_version")
    benchmarks = root.items("benchmarks")
    if not benchmarks:
        raise ValueError("benchmarks: the file holds no benchmark")
    return [(b.path, _guidellm_level(b, version)) for b in benchmarks]


def _guidellm_level(benchmark, version):
    config, metrics = benchmark.at("config"), benchmark.at("metrics")
    strategy = config.at("strategy")
    kind = strategy.text("type_")
    concurrency = strategy.count("streams")
    if concurrency is None and kind == "synchronous":
        concurrency = 1
    backend = config.text("backend", "kind") or ""
    result = {
        "tool": "guidellm",
        "tool_version": version,
        "model_id": config.text("backend", "model"),
        # guidellm's vllm_python backends run vLLM in its own process: the file names the engine
        "backend": "vllm" if backend.startswith("vllm_python") else None,
        "endpoint_type": config.text("backend", "request_format"),
        "strategy": kind,
        "max_concurrency": concurrency,
        "request_rate": strategy.number("rate"),
        "duration": benchmark.number("duration"),
        "completed": metrics.count("request_totals", "successful"),
        "failed": metrics.count("request_totals", "errored") or 0,
        "total_input_tokens": metrics.count("prompt_token_count", "successful", "total_sum"),
        "total_output_tokens": metrics.count("output_token_count", "successful", "total_sum"),
        "request_throughput": metrics.number("requests_per_second", "successful", "mean"),
        "output_throughput": metrics.number("output_tokens_per_second", "successful", "mean"),
        "total_token_throughput": metrics.number("tokens_per_second", "successful", "mean"),
    }
    for metric, (key, scale) in GUIDELLM_LATENCY.items():
        stats = metrics.at(key, "successful")
        _latencies(
            result, metric, GUIDELLM_STATS, lambda s, st=stats, k=scale: st.number(s, scale=k)
        )
        for p in (90, 95, 99):
            value = stats.number("percentiles", f"p{p}", scale=scale)
            if value is not None:
                result[f"p{p}_{metric}_ms"] = value
    requests = _guidellm_requests(benchmark.at("requests"))
    # a benchmark run with a sample_size keeps only some of its requests: no log of them all
    if (
        requests is not None
        and len(requests["status"]) == (result["completed"] or 0) + result["failed"]
    ):
        result["requests"] = requests
    return result


def _guidellm_requests(requests):
    """domain.request_log columns of a benchmark's kept requests, or None where it kept none."""
    kept = [(r, "ok") for r in requests.items("successful")]
    kept += [(r, "failed") for r in requests.items("errored")]
    if not kept:
        return None
    starts = [r.number("info", "timings", "request_start") for r, _ in kept]
    first = min((s for s in starts if s is not None), default=None)
    columns = {key: [] for key in request_log.REQUEST_KEYS}
    for (r, status), start in zip(kept, starts, strict=True):
        error = r.text("info", "error")
        columns["start_time"].append(
            None if start is None or first is None else request_log.rounded(start - first)
        )
        columns["ttft"].append(r.number("time_to_first_token_ms", scale=0.001))
        columns["latency"].append(r.number("request_latency"))
        columns["input_len"].append(r.count("prompt_tokens"))
        columns["output_len"].append(r.count("output_tokens"))
        columns["status"].append(status)
        columns["error_reason"].append(None)
        columns["error"].append(
            error[:2000] if error else ("error" if status == "failed" else None)
        )
        columns["itl"].append(None)
    return request_log.checked_columns(columns, requests.path)


def inference_perf_levels(text):
    """[(where, result)]: the one level ("line 1") of an inference-perf
    stage_N_lifecycle_metrics.json (or its summary_lifecycle_metrics.json, which names no
    concurrency)."""
    root = _Reader(_document(text))
    if not isinstance(root.value, dict) or "load_summary" not in root.value:
        raise ValueError("line 1: not an inference-perf lifecycle metrics report (no load_summary)")
    load, ok = root.at("load_summary"), root.at("successes")
    concurrency = load.count("concurrency")
    result = {
        "tool": "inference-perf",
        "max_concurrency": concurrency,
        # a concurrent stage's requested_rate is its requests over its duration, set at run time
        "request_rate": None if concurrency else load.number("requested_rate"),
        "duration": root.number("benchmark_time_seconds"),
        "completed": ok.count("count"),
        "failed": root.count("failures", "count") or 0,
        "total_input_tokens": ok.count("prompt_tokens", "total"),
        "total_output_tokens": ok.count("output_tokens", "total"),
        "request_throughput": ok.number("throughput", "requests_per_sec"),
        "output_throughput": ok.number("throughput", "output_tokens_per_sec"),
        "total_token_throughput": ok.number("throughput", "total_tokens_per_sec"),
    }
    for metric, key in INFERENCE_PERF_LATENCY.items():
        stats = ok.at("latency", key)
        _latencies(
            result, metric, INFERENCE_PERF_STATS, lambda s, st=stats: st.number(s, scale=1000.0)
        )
    return [("line 1", result)]


# inference-perf's server.type that names an engine (its others: tgi, mock)
INFERENCE_PERF_ENGINES = ("vllm", "sglang")


def inference_perf_config(text):
    """What inference-perf's run configuration says it measured: the config.yml given to
    `--config_file`, or the config.yaml it writes into its report folder (the same keys with
    every default written out). {"model_id": server.model_name (the name each request sent),
    "model_names": it, else tokenizer.pretrained_model_name_or_path (the model it tokenized for
    where the name was left to the server), "tokenizer_id", "server_type": server.type, and
    "backend" where server.type names vLLM or SGLang}; None where the file leaves a key unsaid
    (inference-perf's default type, vllm, is its client's dialect, not a statement). Raises
    ValueError naming the line where it stops being YAML, or the key that holds another type;
    a configuration without `server` names nothing measured and is refused."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(_yaml_problem(exc, text)) from None
    except RecursionError:
        raise ValueError("line 1: not YAML (nested too deep to read)") from None
    root = _Reader(document)
    if not isinstance(document, dict):
        raise ValueError(f"line 1: not inference-perf's run configuration: {_shown(document)}")
    server = root.at("server")
    if server.value is None:
        raise ValueError("server is missing: the configuration names no server it measured")
    model = server.text("model_name")
    tokenizer = root.text("tokenizer", "pretrained_model_name_or_path")
    server_type = server.text("type")
    return {
        "model_id": model,
        "model_names": [name for name in (model or tokenizer,) if name],
        "tokenizer_id": tokenizer,
        "server_type": server_type,
        "backend": server_type if server_type in INFERENCE_PERF_ENGINES else None,
    }


def _yaml_problem(exc, text):
    """ "line N: not YAML (…)" of a YAMLError: its mark's line, or the line of the character
    it could not read."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line = mark.line + 1
    else:
        position = getattr(exc, "position", None) or 0
        line = text[:position].count("\n") + 1
    reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "unreadable"
    context = getattr(exc, "context", None)
    if reason.startswith("but ") and context:
        reason = f"{context}, {reason}"
    return f"line {line}: not YAML ({reason})"


READERS = {
    "aiperf": aiperf_levels,
    "guidellm": guidellm_levels,
    "inference-perf": inference_perf_levels,
}


def tool_levels(text, fmt):
    """[(where, result)] of a file of one of TOOL_FORMATS (module docstring)."""
    return READERS[fmt](text)
