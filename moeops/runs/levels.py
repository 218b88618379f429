"""What a level's numbers may be, for every path that stores one (the API, the worker through it,
imported result files): rates, durations and latencies finite, not negative and below
MAX_METRIC in their unit, and a level that does not finish before it starts; and its request
log, which holds one request for each the level counts."""

import json
import math
import zlib

from django.core.exceptions import ValidationError

from domain import request_log
from domain.numbers import is_number
from domain.wire.levels import COUNT_KEYS, LEVEL_KEYS
from moeops.runs.models import RequestLog

# No level of any deployment reaches 10^9 tok/s, req/s, s or ms; a larger number is a broken
# client, and would print as a 300-digit figure in a finding's title.
MAX_METRIC = 1e9
# The figures in their unit; the counts (completed, tokens, …) are integer columns, checked as such.
METRIC_FIELDS = ("request_rate", *(key for key in LEVEL_KEYS if key not in COUNT_KEYS))


def level_problems(fields: dict) -> dict[str, str]:
    """{field: what is wrong} of a level's LevelResult fields (empty when it may be stored);
    request_rate None is unlimited, started_at and finished_at are epoch s."""
    problems = {}
    for name in METRIC_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        if not is_number(value):
            problems[name] = f"must be a number, got {value!r}"
        elif not math.isfinite(value):
            problems[name] = f"must be finite, got {value!r}"
        elif value < 0:
            problems[name] = f"must be at least 0, got {float(value)!r}"
        elif value > MAX_METRIC:
            problems[name] = f"must be at most {MAX_METRIC:.0e}, got {float(value)!r}"
    started, finished = fields.get("started_at"), fields.get("finished_at")
    if started is not None and finished is not None and finished < started:
        problems["finished_at"] = f"must not be before started_at ({finished} < {started})"
    return problems


def level_request_log(packed, fields):
    """An unsaved RequestLog of a level's packed requests (domain.request_log.pack), or None for
    none; raises ValidationError on "request_log" for a log that does not unpack or holds
    another number of requests than the level counts."""
    if packed is None:
        return None
    try:
        columns = request_log.unpack(packed)
    except ValueError as exc:
        raise ValidationError({"request_log": f"request_log {exc}"}) from None
    count = len(columns["status"])
    counted = (fields.get("completed") or 0) + (fields.get("failed") or 0)
    if count != counted:
        raise ValidationError(
            {
                "request_log": f"request_log holds {count} requests, the level counts {counted} "
                "(completed + failed)"
            }
        )
    dropped = sum(
        status == "ok" and gaps is None
        for status, gaps in zip(columns["status"], columns["itl"], strict=True)
    )
    data = zlib.compress(json.dumps(columns, separators=(",", ":")).encode(), 6)
    return RequestLog(count=count, itl_dropped=dropped, data=data)
