"""Benchmark result files written by others → level dicts with LevelResult's field names.

Formats:
- "sglang": `python -m sglang.bench_serving --output-file F.jsonl`, one JSON object per line.
  Its request rate is written as a bare `Infinity` (Python's json reads it). Older SGLang
  (2024) wrote `output_token_throughput`, `median_ttft`, `benchmark_duration`, …
- "vllm": `vllm bench serve --save-result` (and benchmarks/benchmark_serving.py before it),
  one JSON object per file, or one per line with `--append-result`; `request_rate` is the
  string "inf" when unlimited. v0.4.0 misspelled `request_inthroughput`.
- "moeops": a run's own per-request export (`/runs/<uuid>/requests.jsonl`, domain.request_log),
  one request per line, or its CSV twin (`requests.csv`, known by its header row); its levels
  and rounds are the lines' (concurrency, request_rate, round), their figures computed from the
  requests (domain.request_log.level_figures).
- "aiperf", "guidellm", "inference-perf": other load tools' result files, read by
  moeops.runs.load_tools (pure: no Django) as vLLM result objects; its docstring says which
  file of each tool.

Keys come and go between versions, so every metric is read from the first key present in a
list of aliases; absent keys stay None. Each object is kept whole in `raw`.
"""

import csv
import io
import json
import math
from collections import Counter

from domain import engine as engine_reports
from domain import request_log
from domain.intervals import level_of_rounds
from domain.json_lines import array_lines
from domain.levels import LATENCY_KEYS, MAX_ROUNDS
from domain.numbers import is_integer, is_number
from domain.storable import MAX_INT, MAX_JSON_DEPTH, storable_json
from moeops.runs.keys import level_key
from moeops.runs.levels import level_problems
from moeops.runs.load_tools import (
    TOOL_FORMATS,
    aiperf_requests,
    inference_perf_config,
    tool_levels,
)

FORMATS = ("sglang", "vllm", "moeops", *TOOL_FORMATS)


def _aliases():
    """LevelResult field → keys that hold it, newest layout first."""
    aliases = {
        "duration": ("duration", "benchmark_duration"),
        "completed": ("completed",),
        "failed": ("failed",),
        "total_input_tokens": ("total_input_tokens", "total_input"),
        "total_output_tokens": ("total_output_tokens", "total_output"),
        "request_throughput": ("request_throughput", "request_inthroughput"),
        "output_throughput": ("output_throughput", "output_token_throughput"),
        "total_token_throughput": ("total_token_throughput", "total_throughput"),
        "max_output_tokens_per_s": ("max_output_tokens_per_s",),
        "max_concurrent_requests": ("max_concurrent_requests",),
        "request_goodput": ("request_goodput",),
    }
    for key in LATENCY_KEYS:
        stat, metric, _ = key.split("_")
        if metric == "e2el":
            # SGLang: mean_e2e_latency_ms; SGLang 2024: mean_e2e_latency
            aliases[key] = (key, f"{stat}_e2e_latency_ms", f"{stat}_e2e_latency")
        else:
            aliases[key] = (key, f"{stat}_{metric}")
    return aliases


ALIASES = _aliases()
# The keys without which a line is not a throughput result.
REQUIRED = ("output_throughput",)
INT_FIELDS = (
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "max_concurrent_requests",
)
# What a result file says of how it was made, kept in the imported run's snapshot.
FILE_FACT_KEYS = (
    "backend",
    "tag",
    "label",
    "date",
    "model_id",
    "tokenizer_id",
    "endpoint_type",
    "dataset_name",
    "num_prompts",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "burstiness",
    "tool",
    "tool_version",
)


# `vllm bench serve --save-detailed`'s per-request lists (one value per request, in the order
# sent): read into the run's request log and left out of the level's raw.
DETAILED_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "generated_texts",
    "errors",
)


class ResultFileError(ValueError):
    """A file that cannot be imported; `problems` names each bad line."""

    def __init__(self, problems):
        super().__init__("; ".join(problems))
        self.problems = problems


class ResultFileMismatch(ValueError):
    """A file that measured another model, parallelism, GPU count or engine than the deployment
    it is imported for; `differences` names each ("model", "TP", …)."""

    def __init__(self, sentence, differences):
        super().__init__(sentence)
        self.differences = differences


def _objects(text, fmt):
    """[(line number, object or None, error)] of the file's JSON objects (of a per-request
    export's CSV rows, for one written as CSV); a vLLM file may be one object, one a line
    (--append-result) or an array of them (a sweep's summary.json)."""
    if fmt == "moeops" and _is_export_csv(text):
        return _csv_objects(text)
    if fmt == "vllm":
        try:
            whole = json.loads(text)
        except (ValueError, RecursionError):
            whole = None
        if isinstance(whole, dict):
            return [(1, whole, None)]
        if isinstance(whole, list):
            # `vllm bench sweep serve`'s summary.json (and moeops' export): an array of results
            lines = array_lines(text, len(whole))
            return [(n, obj, None) for n, obj in zip(lines, whole, strict=True)]
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found.append((number, json.loads(line), None))
        except RecursionError:
            found.append((number, None, "not JSON (nested too deep to read)"))
        except json.JSONDecodeError as exc:
            found.append((number, None, f"not JSON ({exc})"))
        except ValueError:
            # Python's own words here point at sys.set_int_max_str_digits, which no user can set
            found.append((number, None, "a number has more than 4,300 digits"))
    return found


def _is_export_csv(text):
    """Whether text opens with the per-request CSV export's header row."""
    first = text.lstrip("\ufeff \t\r\n").partition("\n")[0]
    return first.strip() == ",".join(request_log.CSV_HEADER)


def _csv_objects(text):
    """[(line number, object or None, error)] of a per-request CSV export's rows."""
    found = []
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff"), newline=""))
    try:
        for cells in reader:
            if not any(cells.values()):
                continue
            if None in cells:
                found.append((reader.line_num, None, "has more cells than the header"))
                continue
            try:
                found.append((reader.line_num, request_log.from_csv_cells(cells), None))
            except ValueError as exc:
                found.append((reader.line_num, None, str(exc)))
    except csv.Error as exc:
        found.append((reader.line_num, None, f"not CSV ({exc})"))
    return found


def _number(value):
    """A finite float from a number or a numeric string, else None."""
    if isinstance(value, bool):
        return None
    try:
        value = float(value) if isinstance(value, int | float | str) else None
    except (ValueError, OverflowError):
        # OverflowError: an integer of hundreds of digits, beyond any float
        return None
    return value if value is not None and math.isfinite(value) else None


def _shown(value):
    """A file's value for a message, cut to 40 characters (a bad number may have hundreds)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}… ({len(text)} characters)"


def _not_a_number(value):
    """Why _number(value) is None, as the end of a sentence that starts with the key."""
    if is_integer(value):
        return f"is too large a number: {_shown(value)}"
    return f"is not a number: {_shown(value)}"


def _first(obj, keys):
    for key in keys:
        if key in obj and obj[key] is not None:
            return key, obj[key]
    return None, None


def _jsonable(value, depth=0):
    """The object as jsonb stores it: non-finite numbers become the words the file used.
    Raises ValueError for nesting deeper than MAX_JSON_DEPTH (before Python's recursion limit)."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"the object is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item, depth + 1) for item in value]
    return value


def _error_counts(errors):
    """vLLM saves one error string per request ("" for success); count them by text."""
    if isinstance(errors, dict):
        return {str(k): v for k, v in errors.items() if isinstance(v, int)}
    if isinstance(errors, list):
        return dict(Counter(str(e) for e in errors if e))
    return {}


def _level(obj, fmt):
    """LevelResult fields of one result object; raises ValueError naming what is wrong."""
    level = {}
    for field, keys in ALIASES.items():
        key, value = _first(obj, keys)
        if key is None:
            continue
        number = _number(value)
        if number is None:
            raise ValueError(f"{key} {_not_a_number(value)}")
        if field in INT_FIELDS:
            if number < 0 or number > MAX_INT or number != int(number):
                raise ValueError(f"{key} is not a count: {_shown(value)}")
            number = int(number)
        level[field] = number
    missing = [field for field in REQUIRED if field not in level]
    if missing:
        raise ValueError(f"lacks the throughput keys ({', '.join(ALIASES[missing[0]])})")
    concurrency = obj.get("max_concurrency")
    if concurrency is not None:
        if not is_integer(concurrency):
            raise ValueError(f"max_concurrency is not an integer: {_shown(concurrency)}")
        if not 0 < concurrency <= MAX_INT:
            raise ValueError(f"max_concurrency is out of range: {_shown(concurrency)}")
    level["concurrency"] = concurrency
    rate = obj.get("request_rate")
    if is_integer(rate) and _number(rate) is None:
        raise ValueError(f"request_rate {_not_a_number(rate)}")
    # None = unlimited: inf, "inf", Infinity; also SGLang's "trace" (timestamps replayed)
    level["request_rate"] = _number(rate)
    # SGLang's files, and vLLM's where a sweep's summary (or moeops' export) names the lengths
    if str(obj.get("dataset_name", "")).startswith("random"):
        for field, key in (("input_len", "random_input_len"), ("output_len", "random_output_len")):
            value = obj.get(key)
            if is_integer(value) and 0 <= value <= MAX_INT:
                level[field] = value
    level.setdefault("failed", 0)
    problems = level_problems(level)
    if problems:
        name, problem = next(iter(problems.items()))
        raise ValueError(f"{name} {problem}")
    level["errors"] = _error_counts(obj.get("errors"))
    _take_requests(level, obj, fmt)
    return level


def _take_requests(level, obj, fmt):
    """Move a vLLM result's per-request lists into level["requests"] (domain.request_log
    columns); level["raw"] is the object less them."""
    requests = _requests(obj) if fmt == "vllm" else None
    if requests is not None:
        if "failed" not in obj:
            # vLLM before 0.7 wrote no "failed": its errors list says which requests failed
            level["failed"] = requests["status"].count("failed")
        level["requests"] = requests
        obj = {key: value for key, value in obj.items() if key not in DETAILED_KEYS}
    level["raw"] = _jsonable(obj)


def _requests(obj):
    """domain.request_log columns of a vLLM result saved with --save-detailed (its ttfts and the
    other per-request lists), or None for a result without them; raises ValueError naming a
    list of another length or a value no request can have."""
    ttfts = obj.get("ttfts")
    if not isinstance(ttfts, list):
        return None
    lists = {}
    for key in ("input_lens", "output_lens", "itls", "latencies", "start_times", "errors"):
        values = obj.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(ttfts):
            length = len(values) if isinstance(values, list) else "no list"
            raise ValueError(f"{key} has {length} values for {len(ttfts)} ttfts")
        lists[key] = values
    errors = [str(e) if e else None for e in lists.get("errors", [None] * len(ttfts))]
    starts = lists.get("start_times")
    first = min(starts) if starts and all(_number(t) is not None for t in starts) else None
    columns = {
        "start_time": [None if first is None else t - first for t in starts or ttfts],
        # vLLM writes 0 as the TTFT of a failed request
        "ttft": [None if error else ttft for ttft, error in zip(ttfts, errors, strict=True)],
        "latency": lists.get("latencies") or [None] * len(ttfts),
        "input_len": lists.get("input_lens") or [None] * len(ttfts),
        "output_len": lists.get("output_lens") or [None] * len(ttfts),
        "status": ["failed" if error else "ok" for error in errors],
        "error_reason": [None] * len(ttfts),
        "error": errors,
        "itl": [
            None if error else gaps
            for gaps, error in zip(lists.get("itls") or [None] * len(ttfts), errors, strict=True)
        ],
    }
    return request_log.checked_columns(columns, "the per-request lists")


def _export_levels(objects):
    """The levels of a per-request export's lines ([(line number, object or None, error)]):
    (levels, problems). Each level's requests are grouped by round in the order of the lines;
    its "rounds" are [(round, figures, columns)], its fields the rounds' figures combined."""
    problems, grouped = [], {}
    for number, obj, error in objects:
        if error is None and not isinstance(obj, dict):
            error = "not a JSON object"
        if error is None:
            error = _export_line_problem(obj)
        if error is None:
            try:
                storable_json(obj)
            except ValueError as exc:
                error = str(exc)
        if error is not None:
            problems.append(f"line {number}: {error}")
            continue
        key = level_key(obj["concurrency"], obj["request_rate"])
        level = grouped.setdefault(
            key, {"line": number, "concurrency": obj["concurrency"], "rounds": {}}
        )
        level["request_rate"] = obj["request_rate"]
        columns = level["rounds"].setdefault(
            obj.get("round") or 1, {k: [] for k in request_log.REQUEST_KEYS}
        )
        for k in request_log.REQUEST_KEYS:
            columns[k].append(obj.get(k))
    levels = []
    for key, level in grouped.items():
        rounds = []
        for number, columns in sorted(level["rounds"].items()):
            try:
                request_log.check_columns(columns)
            except ValueError as exc:
                problems.append(f"level {key}, round {number}: {exc}")
                continue
            figures = {
                "concurrency": level["concurrency"],
                "request_rate": level["request_rate"],
                **request_log.level_figures(columns),
            }
            rounds.append((number, figures, columns))
        if len(rounds) != len(level["rounds"]):
            continue
        fields = level_of_rounds([figures for _, figures, _ in rounds])
        fields["round_count"] = len(rounds)
        levels.append({**fields, "line": level["line"], "raw": {}, "rounds": rounds})
    return levels, problems


def _export_line_problem(obj):
    """Why a line is not one request of the per-request export, or None."""
    concurrency, rate, number = obj.get("concurrency"), obj.get("request_rate"), obj.get("round")
    if not is_integer(concurrency) or not 0 < concurrency <= MAX_INT:
        return f"concurrency is not a count of concurrent requests: {_shown(concurrency)}"
    if rate is not None and not (is_number(rate) and math.isfinite(rate) and rate > 0):
        return f"request_rate is not a rate in req/s or null: {_shown(rate)}"
    if number is not None and not (is_integer(number) and 1 <= number <= MAX_ROUNDS):
        return f"round is not a round from 1 to {MAX_ROUNDS}: {_shown(number)}"
    missing = [key for key in request_log.REQUEST_KEYS if key not in obj]
    if missing:
        return f"lacks the request's {missing[0]} (not a line of a per-request export)"
    for key in request_log.REQUEST_KEYS:
        if not request_log.CHECKS[key](obj[key]):
            return f"{key} is no request's: {_shown(obj[key])}"
    return None


def parse_results(text, fmt, requests_text=""):
    """The levels of a result file: a list of LevelResult field dicts, one per object.

    Each dict carries `concurrency`, `request_rate` (None = unlimited), the metrics found,
    `raw` (the whole object, less vLLM's per-request lists), `line` (its line number) and, for
    a vLLM result saved with --save-detailed, `requests` (domain.request_log columns); a
    per-request export's levels carry `rounds` instead ([(round, figures, columns)]). Raises
    ResultFileError listing every line that is not JSON, not an object, lacks the throughput
    keys (an export's line: a request's keys), or repeats the (concurrency, request rate) of an
    earlier line. Another load tool's file (TOOL_FORMATS): its levels carry `requests` where it
    holds them, and a problem names its key. requests_text, the file beside it: AIPerf's
    per-request records of the one level of its summary (profile_export.jsonl), kept as the
    level's requests; inference-perf's run configuration (config.yml), which names the model
    and engine its stage reports leave unsaid.
    """
    if fmt not in FORMATS:
        raise ResultFileError([f"format must be one of {', '.join(FORMATS)}, got {fmt!r}"])
    if requests_text and fmt not in ("aiperf", "inference-perf"):
        raise ResultFileError(
            [
                "requests: only AIPerf's per-request records and inference-perf's run "
                "configuration come as a file of their own"
            ]
        )
    if fmt in TOOL_FORMATS:
        config = {}
        if fmt == "inference-perf" and requests_text:
            try:
                config = inference_perf_config(requests_text)
            except ValueError as exc:
                raise ResultFileError([f"config: {exc}"]) from None
        levels = _tool_levels(text, fmt, config)
        if fmt == "aiperf" and requests_text:
            _take_aiperf_requests(levels[0], requests_text)
        return levels
    return _object_levels(text, fmt)


def _object_levels(text, fmt):
    """parse_results of a SGLang, vLLM or moeops file."""
    problems, levels, seen = [], [], {}
    objects = _objects(text, fmt)
    if not objects:
        raise ResultFileError(["the file holds no results"])
    if fmt == "moeops":
        levels, problems = _export_levels(objects)
        if problems:
            raise ResultFileError(problems)
        return levels
    for number, obj, error in objects:
        if error is None and not isinstance(obj, dict):
            error = "not a JSON object"
        if error is None:
            try:
                # as jsonb keeps it: non-finite numbers as words, strings without NUL, …
                storable_json(_jsonable(obj))
            except ValueError as exc:
                error = str(exc)
        if error is None:
            try:
                level = _level(obj, fmt)
            except ValueError as exc:
                error = str(exc)
        if error is None:
            key = level_key(level["concurrency"], level["request_rate"])
            if key in seen:
                error = f"repeats the level of line {seen[key]} ({key})"
            seen.setdefault(key, number)
        if error is not None:
            problems.append(f"line {number}: {error}")
            continue
        level["line"] = number
        levels.append(level)
    if problems:
        raise ResultFileError(problems)
    return levels


def _tool_levels(text, fmt, config):
    """parse_results of another load tool's file: each level load_tools reads, with what
    its run configuration says (config), checked as a vLLM object is; a problem names the
    file's line or key ("benchmarks[1]: …")."""
    try:
        found = tool_levels(text, fmt)
    except ValueError as exc:
        raise ResultFileError([str(exc)]) from None
    problems, levels, seen = [], [], {}
    for number, (where, result) in enumerate(found, start=1):
        requests = result.pop("requests", None)
        result.update(config)
        try:
            storable_json(result)
            level = _level(result, fmt)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        key = level_key(level["concurrency"], level["request_rate"])
        if key in seen:
            problems.append(f"{where}: repeats the level of {seen[key]} ({key})")
            continue
        seen[key] = where
        if requests is not None:
            level["requests"] = requests
        level["line"] = number
        levels.append(level)
    if problems:
        raise ResultFileError(problems)
    return levels


def _take_aiperf_requests(level, text):
    """level["requests"] from AIPerf's per-request records of it; ResultFileError naming the
    records' line, or their count where it is not the summary's."""
    try:
        requests = aiperf_requests(text)
    except ValueError as exc:
        raise ResultFileError([f"requests: {exc}"]) from None
    count = len(requests["status"])
    counted = (level.get("completed") or 0) + (level.get("failed") or 0)
    if count != counted:
        raise ResultFileError(
            [f"requests: the records hold {count} requests, the summary counts {counted}"]
        )
    level["requests"] = requests


def snapshot_parts(levels, fmt, file_name="") -> tuple[dict, dict | None]:
    """(file facts, engine identity or None) of an imported file's levels, for its snapshot.

    The facts are FILE_FACT_KEYS as the first object gives them; SGLang's bench_serving embeds
    the server's /get_server_info, which gives the engine, its version and its arguments. vLLM's
    result files name no engine version.
    """
    first = levels[0]["raw"] if levels else {}
    facts = {"format": fmt, "file_name": file_name}
    facts.update({k: first[k] for k in FILE_FACT_KEYS if first.get(k) is not None})
    info = first.get("server_info")
    if fmt == "sglang" and isinstance(info, dict):
        return facts, engine_reports.from_sglang_server_info(info, source="result file")
    return facts, None


def _size(value):
    return value if is_integer(value) and value > 0 else None


def _name(value):
    return value.strip() if isinstance(value, str) and value.strip() else None


def _servers(info) -> list[dict]:
    """The servers a server_info describes: itself, or, for a prefill/decode-disaggregated
    run, each server of its "prefill" and "decode" lists (the top level then names none)."""
    split = [
        s for part in ("prefill", "decode") for s in info.get(part) or () if isinstance(s, dict)
    ]
    return split or ([info] if info else [])


def _server_gpus(info):
    tp, pp, dp = _size(info.get("tp_size")), _size(info.get("pp_size")), _size(info.get("dp_size"))
    if not tp:
        return None
    return tp * (pp or 1) * (1 if info.get("enable_dp_attention") else (dp or 1))


def _one(values):
    """The value all servers agree on, else None."""
    values = set(values)
    return values.pop() if len(values) == 1 else None


def stated_facts(levels, fmt) -> dict:
    """What the file says it measured: {"model", "model_names", "engine", "engine_version",
    "tp", "ep", "gpu_count"}, None (model_names: []) where it does not say.

    SGLang's server_info gives the model path, served name, parallel sizes and version; the
    GPUs are tp × pp, times dp unless DP attention runs inside the TP group. A
    prefill/decode-disaggregated run's server_info holds them per server in "prefill" and
    "decode" lists: the GPUs are the servers' sum, TP and version what they all agree on
    (versions that differ are listed). vLLM's files name the model the client asked for
    (model_id) and, in 0.4.0, the version passed to it; never their GPUs.
    """
    first = levels[0]["raw"] if levels else {}
    info = first.get("server_info") if fmt == "sglang" else None
    info = info if isinstance(info, dict) else {}
    servers = _servers(info)
    names = [_name(first.get("model_id"))]
    if fmt in TOOL_FORMATS:
        # AIPerf may be given several models: each is one the file names
        names += [_name(n) for n in first.get("model_names") or ()]
    for server in servers:
        names += [_name(server.get("model_path")), _name(server.get("served_model_name"))]
    names = list(dict.fromkeys(n for n in names if n))
    backend = first.get("backend")
    engine = "sglang" if info else (backend if backend in ("sglang", "vllm") else None)
    versions = list(dict.fromkeys(_name(s.get("version")) for s in servers))
    version = " / ".join(v for v in versions if v) or None
    if fmt == "vllm" and backend == "vllm" and _name(first.get("version")) not in (None, "N/A"):
        version = _name(first.get("version"))
    gpus = [_server_gpus(s) for s in servers]
    return {
        "model": names[0] if names else None,
        "model_names": names,
        "engine": engine,
        "engine_version": version,
        "tp": _one(_size(s.get("tp_size")) for s in servers),
        "ep": _one(_size(s.get("ep_size")) for s in servers),
        "gpu_count": sum(gpus) if gpus and None not in gpus else None,
    }


def same_model(names, others) -> bool:
    """Whether two lists of model names (ids, paths, served names) name one model: a pair
    equal but for case and any organisation or folder before the last "/"."""

    def short(name):
        return name.rstrip("/").rsplit("/", 1)[-1].lower()

    return bool({short(n) for n in names if n} & {short(n) for n in others if n})
