"""A level's requests, one entry each, as the worker sends them with the level, the web tier
stores them and the export writes them (JSONL, CSV). The keys are those of `vllm bench serve
--save-detailed` (its per-request lists, named for one request) where vLLM has one: start_time,
ttft, itl, latency, input_len, output_len, error; moeops adds status and error_reason. Times in
s (as vLLM's): start_time from the level's first send, ttft and latency from the request's
own send, itl the gaps between content chunks. docs/metrics.md defines each; docs/decisions.md
says why the log is packed and where it is capped."""

import base64
import json
import math
import re
import zlib
from collections import Counter

import numpy as np

from domain import latency_stats
from domain.numbers import is_integer, is_number

# Per request, in export order.
REQUEST_KEYS = (
    "start_time",
    "ttft",
    "latency",
    "input_len",
    "output_len",
    "status",
    "error_reason",
    "error",
    "itl",
)
STATUSES = ("ok", "failed")
# A level keeps the inter-token gaps of its requests up to this many values in all (3.7 MB
# packed): requests past it keep every other figure, and itl null.
MAX_ITL_VALUES = 1_000_000
# A level holds at most this many requests (parameters.MAX_REQUESTS is the same bound).
MAX_LOGGED_REQUESTS = 1 << 24
# Rounded to the µs: the clock's own resolution is finer, no figure here needs more, and the
# packed log is half the size.
DIGITS = 6


def rounded(seconds):
    """A time in s rounded to the µs, None kept."""
    return None if seconds is None else round(seconds, DIGITS)


def capped(columns, max_itl_values=MAX_ITL_VALUES):
    """(columns, how many requests lost their itl): the requests past the first max_itl_values
    gaps in all keep their other figures and itl None."""
    itls, total, dropped = [], 0, 0
    for gaps in columns["itl"]:
        if gaps is not None and total + len(gaps) > max_itl_values:
            gaps, dropped = None, dropped + 1
        total += len(gaps or ())
        itls.append(gaps)
    return {**columns, "itl": itls}, dropped


def pack(columns):
    """The columns ({key: [one value per request]}) as the text the API carries: JSON,
    zlib-compressed, base64."""
    data = json.dumps(columns, separators=(",", ":"), allow_nan=False).encode()
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def unpack(text, max_bytes=256 << 20):
    """The columns of pack's text; raises ValueError saying what is wrong with it (not base64,
    not zlib, larger than max_bytes unpacked, not the columns of check_columns)."""
    try:
        packed = base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError("is not base64") from None
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, max_bytes)
    except zlib.error:
        raise ValueError("is not zlib-compressed") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"unpacks to more than {max_bytes:,} bytes")
    try:
        columns = json.loads(data)
    except ValueError:
        raise ValueError("does not unpack to JSON") from None
    check_columns(columns)
    return columns


def _time(value):
    return value is None or (is_number(value) and math.isfinite(value) and value >= 0)


def _count(value):
    return value is None or (is_integer(value) and 0 <= value < 1 << 62)


def _text(value):
    return value is None or (isinstance(value, str) and len(value) <= 2000)


def _gaps(value):
    return value is None or (
        isinstance(value, list) and all(_time(v) and v is not None for v in value)
    )


# What each key's values may be.
CHECKS = {
    "start_time": _time,
    "ttft": _time,
    "latency": _time,
    "input_len": _count,
    "output_len": _count,
    "status": lambda value: value in STATUSES,
    "error_reason": _text,
    "error": _text,
    "itl": _gaps,
}


def check_columns(columns):
    """Raise ValueError naming the first key whose column is missing, of another length, or
    holds a value it may not (a negative or non-finite time, a count that is not one)."""
    if not isinstance(columns, dict):
        raise ValueError("is not an object of columns")
    missing = [key for key in REQUEST_KEYS if not isinstance(columns.get(key), list)]
    if missing:
        raise ValueError(f"lacks the column {missing[0]}")
    count = len(columns["status"])
    if count > MAX_LOGGED_REQUESTS:
        raise ValueError(f"holds {count:,} requests, more than {MAX_LOGGED_REQUESTS:,}")
    for key in REQUEST_KEYS:
        values = columns[key]
        if len(values) != count:
            raise ValueError(f"{key}: {len(values)} values for {count} requests")
        bad = next((i for i, v in enumerate(values) if not CHECKS[key](v)), None)
        if bad is not None:
            raise ValueError(f"{key}: request {bad} has {str(values[bad])[:40]!r}")


def checked_columns(columns, source):
    """The columns once check_columns finds them whole; its ValueError names `source` first
    (where they were read: a file's path, "the per-request lists")."""
    try:
        check_columns(columns)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return columns


def rows(columns):
    """One dict per request, REQUEST_KEYS in order."""
    return [
        dict(zip(REQUEST_KEYS, values, strict=True))
        for values in zip(*(columns[k] for k in REQUEST_KEYS), strict=True)
    ]


# What says which level a request belongs to, in front of its own keys in an export.
LEVEL_KEYS = ("concurrency", "request_rate", "round")


def export_line(level, request):
    """One request as a JSONL line: the level's LEVEL_KEYS ({key: value}), then its own."""
    return json.dumps({**level, **request}, separators=(",", ":"), allow_nan=False)


def csv_cells(level, request):
    """One request as CSV cells in LEVEL_KEYS + REQUEST_KEYS order: itl as a JSON list,
    absent values empty."""
    cells = [level.get(key) for key in LEVEL_KEYS]
    for key in REQUEST_KEYS:
        value = request[key]
        cells.append(json.dumps(value) if key == "itl" and value is not None else value)
    return ["" if value is None else value for value in cells]


# The CSV export's cells by what they hold (LEVEL_KEYS + REQUEST_KEYS): the rest are text.
_CSV_INTEGERS = ("concurrency", "round", "input_len", "output_len")
_CSV_NUMBERS = ("request_rate", "start_time", "ttft", "latency")
CSV_HEADER = (*LEVEL_KEYS, *REQUEST_KEYS)


def from_csv_cells(cells):
    """The export line's object of one CSV row ({column: text}, as csv_cells wrote it): numbers
    read back, empty cells None, itl from its JSON list. Raises ValueError naming the cell."""
    found = {}
    for key in CSV_HEADER:
        text = cells.get(key)
        if text is None:
            raise ValueError(f"lacks the cell {key}")
        if text == "":
            found[key] = None
        elif key in _CSV_INTEGERS:
            # at most 30 digits: enough for any count, and no 4,300-digit int to parse
            if not re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", text):
                raise ValueError(f"{key} is not a whole number: {text[:40]!r}")
            found[key] = int(text)
        elif key in _CSV_NUMBERS:
            try:
                found[key] = float(text)
            except ValueError:
                raise ValueError(f"{key} is not a number: {text[:40]!r}") from None
        elif key == "itl":
            try:
                found[key] = json.loads(text)
            except (ValueError, RecursionError):
                raise ValueError(f"itl is not a JSON list of gaps: {text[:40]!r}") from None
        else:
            found[key] = text
    return found


def level_figures(columns):
    """A round's LevelResult figures from its logged requests (an imported export): counts,
    duration (s), token totals, throughputs (req/s, tok/s), peaks and latency statistics (ms),
    defined as the load generator defines them from its own records (docs/metrics.md).

    The log keeps no stream's end after its last content chunk: a request ends at its send +
    latency, so the duration can be a hair shorter than the one the worker measured. Token
    figures are None unless every completed request has its usage; the peak output tok/s is
    None where a completed request lost its ITLs (past MAX_ITL_VALUES)."""
    requests = rows(columns)
    sent = [r for r in requests if r["start_time"] is not None]
    ok = [r for r in requests if r["status"] == "ok"]
    failed = [r for r in requests if r["status"] == "failed"]
    starts = np.array([r["start_time"] for r in sent], dtype=np.float64)
    ends = np.array([r["start_time"] + (r["latency"] or 0.0) for r in sent], dtype=np.float64)
    start = float(starts.min()) if sent else 0.0
    duration = float(ends.max()) - start if sent else 0.0
    usage = bool(ok) and all(r["input_len"] is not None and r["output_len"] is not None for r in ok)
    total_input = sum(r["input_len"] for r in ok) if usage else None
    total_output = sum(r["output_len"] for r in ok) if usage else None

    def per_s(x):
        return x / duration if x is not None and duration > 0 else None

    tpots = [
        (r["latency"] - r["ttft"]) / (r["output_len"] - 1)
        for r in ok
        if usage and r["output_len"] > 1 and None not in (r["latency"], r["ttft"])
    ]
    figures = {
        "completed": len(ok),
        "failed": len(failed),
        "errors": dict(Counter(r["error_reason"] or "error" for r in failed)),
        "duration": duration,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(
            None if total_input is None else total_input + total_output
        ),
        "max_output_tokens_per_s": _peak_tokens_per_s(ok, start) if usage else None,
        "max_concurrent_requests": latency_stats.interval_overlap_max(starts, ends, start),
        "usage_reported": usage,
    }
    figures.update(
        latency_stats.describe_ms("ttft", [r["ttft"] for r in ok if r["ttft"] is not None])
    )
    figures.update(latency_stats.describe_ms("tpot", tpots))
    figures.update(latency_stats.describe_ms("itl", [g for r in ok for g in r["itl"] or ()]))
    figures.update(
        latency_stats.describe_ms("e2el", [r["latency"] for r in ok if r["latency"] is not None])
    )
    return figures


def _peak_tokens_per_s(ok, start):
    """Most output tokens in one 1 s bucket, each content chunk (at send + ttft + its gaps so
    far) counting its request's tokens / chunks, as the load generator counts them."""
    if any(r["itl"] is None or r["ttft"] is None for r in ok):
        return None
    times = [np.cumsum([r["start_time"] + r["ttft"], *r["itl"]]) for r in ok]
    weights = [np.full(len(t), r["output_len"] / len(t)) for r, t in zip(ok, times, strict=True)]
    if not times:
        return 0.0
    return latency_stats.bucket_max(np.concatenate(times), np.concatenate(weights), start)
