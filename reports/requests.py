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
import zlib

from reports.numbers import is_integer, is_number

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
