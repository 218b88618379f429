"""Timestamped request traces in the Mooncake format, as AIPerf, vLLM, SGLang and guidellm
replay them: one request a line, sent `timestamp` ms after the trace's first one, with
`input_length` prompt tokens and `output_length` output tokens; the prompt is made of blocks,
one per id of `hash_ids`, and two requests naming the same id share that block's tokens (the
reuse a prefix cache sees). Every block but the last is `block_size` tokens; the last holds the
rest of input_length (docs/formats.md, "Request traces").

A JSONL file holds one object a line; a CSV file the same columns under a header line, its
hash_ids cell a JSON list ("[1, 2]") or ids separated by spaces or semicolons.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re

from domain.numbers import is_integer, is_number
from domain.workloads import (
    MAX_DATASET_ITEMS,
    MAX_LENGTH,
    DatasetFileError,
    _text_of,
    json_lines,
)

KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
# A year of traffic, in ms: a timestamp past it is a unit mistake (µs, epoch ms), not a trace.
MAX_TIMESTAMP_MS = 366 * 24 * 3600 * 1000
# Hash ids are the trace's names for blocks: any id a signed 64-bit integer holds.
MAX_HASH_ID = (1 << 63) - 1
# A request sent more than this after its scaled timestamp: the client did not keep the trace's
# time (the replay's bar: vLLM's and AIPerf's schedulers keep to a few ms on an idle client).
KEEP_UP_MS = 50.0
_ID_SEPARATORS = re.compile(r"[\s;,]+")


def _shown(value) -> str:
    """A value as a refusal names it: a long integer by its digits, not printed whole."""
    if is_integer(value) and len(str(abs(value))) > 20:
        return f"a {len(str(abs(value)))}-digit integer"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _request(obj, file_name: str, line: int, block_size: int, previous: float | None) -> dict:
    """One request of the trace, checked: {"timestamp" (ms), "input_length", "output_length",
    "hash_ids"}."""
    if not isinstance(obj, dict):
        raise DatasetFileError(
            file_name, line, f"not a request: an object with {', '.join(KEYS)}, got {_shown(obj)}"
        )
    for key in ("timestamp", "input_length", "output_length"):
        if key not in obj:
            raise DatasetFileError(file_name, line, f"{key}: missing")
    timestamp = obj["timestamp"]
    if (
        not is_number(timestamp)
        # the range first: math.isfinite of a 400-digit integer overflows a float
        or not 0 <= timestamp <= MAX_TIMESTAMP_MS
        or not math.isfinite(timestamp)
    ):
        raise DatasetFileError(
            file_name,
            line,
            f"timestamp: ms since the first request, from 0 to {MAX_TIMESTAMP_MS:,}, got "
            f"{_shown(timestamp)}",
        )
    if previous is not None and timestamp < previous:
        raise DatasetFileError(
            file_name,
            line,
            f"timestamp: {timestamp:g} ms is before the line above's {previous:g} ms (a trace's "
            "requests are in the order they were sent)",
        )
    lengths = {}
    for key in ("input_length", "output_length"):
        value = obj[key]
        if not is_integer(value) or not 1 <= value <= MAX_LENGTH:
            raise DatasetFileError(
                file_name,
                line,
                f"{key}: a whole number of tokens from 1 to {MAX_LENGTH:,}, got {_shown(value)}",
            )
        lengths[key] = value
    hash_ids = obj.get("hash_ids", [])
    if hash_ids is None:
        hash_ids = []
    if not isinstance(hash_ids, list) or not all(
        is_integer(h) and 0 <= h <= MAX_HASH_ID for h in hash_ids
    ):
        bad = (
            next(h for h in hash_ids if not (is_integer(h) and 0 <= h <= MAX_HASH_ID))
            if isinstance(hash_ids, list)
            else hash_ids
        )
        raise DatasetFileError(
            file_name,
            line,
            f"hash_ids: a list of whole numbers from 0 to 2^63 − 1, got {_shown(bad)}",
        )
    covered = (len(hash_ids) - 1) * block_size
    if hash_ids and lengths["input_length"] <= covered:
        raise DatasetFileError(
            file_name,
            line,
            f"input_length: {lengths['input_length']:,} tokens do not reach the last of its "
            f"{len(hash_ids)} hash_ids: the blocks before it hold {covered:,} ({block_size} "
            "tokens each); is the block size the trace's?",
        )
    return {"timestamp": timestamp, **lengths, "hash_ids": hash_ids}


def _csv_cell(key: str, text: str, file_name: str, line: int):
    text = text.strip()
    if key == "hash_ids":
        if not text:
            return []
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise DatasetFileError(
                    file_name, line, f"hash_ids: a list of whole numbers, got {_shown(text)}"
                ) from None
        parts = [p for p in _ID_SEPARATORS.split(text) if p]
        if not all(re.fullmatch(r"\d+", p) for p in parts):
            raise DatasetFileError(
                file_name, line, f"hash_ids: a list of whole numbers, got {_shown(text)}"
            )
        if any(len(p) > 19 for p in parts):
            long = next(p for p in parts if len(p) > 19)
            raise DatasetFileError(
                file_name,
                line,
                f"hash_ids: a list of whole numbers from 0 to 2^63 − 1, got a "
                f"{len(long)}-digit integer",
            )
        return [int(p) for p in parts]
    if re.fullmatch(r"-?\d+", text):
        digits = len(text.lstrip("-"))
        if digits > 20:
            # past any range a trace's number has (and int() stops at 4,300 digits)
            raise DatasetFileError(
                file_name, line, f"{key}: out of range, got a {digits}-digit integer"
            )
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _csv_rows(text: str, file_name: str):
    reader = csv.reader(io.StringIO(text))
    header = None
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            missing = [key for key in KEYS[:3] if key not in header]
            if missing:
                raise DatasetFileError(
                    file_name,
                    line,
                    f"the header names no {', '.join(missing)} column (a trace's CSV has "
                    f"{', '.join(KEYS)})",
                )
            continue
        if len(row) != len(header):
            raise DatasetFileError(
                file_name,
                line,
                f"{len(row)} cells, the header has {len(header)} (a truncated line?)",
            )
        obj = {
            key: _csv_cell(key, cell, file_name, line)
            for key, cell in zip(header, row, strict=True)
            if key in KEYS
        }
        yield line, obj


def parse_trace(file_name: str, data: bytes, *, block_size: int) -> dict:
    """The requests of a trace file: {"layout": "mooncake" (JSONL) | "mooncake_csv", "items":
    [{"timestamp", "input_length", "output_length", "hash_ids"}, …]} in the file's order.

    Refused, naming the file, the line and the key (DatasetFileError; nothing is kept): a line
    that is not JSON (a truncated one), a key missing, a timestamp negative, past a year or
    before the line above's, a length not a positive whole number, hash_ids not a list of
    whole numbers, an input_length the blocks before the last one already fill, integers past
    their range (a 400-digit one is named by its digits).
    """
    text = _text_of(data, file_name, "a trace")
    if text.lstrip().startswith("{"):
        layout, rows = "mooncake", json_lines(text, file_name)
    else:
        layout, rows = "mooncake_csv", _csv_rows(text, file_name)
    items: list[dict] = []
    previous = None
    for line, obj in rows:
        if len(items) == MAX_DATASET_ITEMS:
            raise DatasetFileError(file_name, line, f"more than {MAX_DATASET_ITEMS:,} requests")
        request = _request(obj, file_name, line, block_size, previous)
        previous = request["timestamp"]
        items.append(request)
    if not items:
        raise DatasetFileError(file_name, None, "the file holds no request")
    return {"layout": layout, "items": items}


def trace_offsets_s(items: list[dict], speed: float) -> list[float]:
    """Each request's send time, s after the trace's first request, at `speed` (2: twice as
    fast)."""
    first = items[0]["timestamp"] if items else 0
    return [(item["timestamp"] - first) / 1000 / speed for item in items]


def keep_up_note(p99_ms: float | None, max_ms: float | None, late: int | None) -> str | None:
    """A sentence where a trace's replay fell behind (its p99 lateness past KEEP_UP_MS), None
    where it kept the trace's time or was no trace's."""
    if p99_ms is None or p99_ms <= KEEP_UP_MS:
        return None
    many = f"{late:,} requests" if late is not None else "requests"
    return (
        f"The client could not keep up with the trace: {many} went more than {KEEP_UP_MS:g} ms "
        f"after their time (p99 {p99_ms:,.0f} ms late, the latest {max_ms or p99_ms:,.0f} ms); "
        "the engine saw a slower, smoother load than the trace's."
    )


def trace_facts(items: list[dict], block_size: int) -> dict:
    """What a trace sends, for its page: "requests", "duration_s" (its last timestamp, at speed
    1), "blocks" (hash ids named, counting repeats), "distinct_blocks", "reused_tokens" (the
    block tokens a request sends that an earlier request already sent: what a prefix cache
    can serve, where it still holds them) and "input_tokens"."""
    seen: set[int] = set()
    reused = blocks = 0
    for item in items:
        hash_ids = item["hash_ids"]
        for position, hash_id in enumerate(hash_ids):
            blocks += 1
            if hash_id in seen:
                last = position == len(hash_ids) - 1
                reused += (
                    min(block_size, item["input_length"] - position * block_size)
                    if last
                    else block_size
                )
            seen.add(hash_id)
    return {
        "requests": len(items),
        "duration_s": (items[-1]["timestamp"] - items[0]["timestamp"]) / 1000 if items else 0.0,
        "blocks": blocks,
        "distinct_blocks": len(seen),
        "reused_tokens": reused,
        "input_tokens": sum(item["input_length"] for item in items),
    }
