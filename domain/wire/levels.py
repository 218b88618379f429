"""One round of a concurrency level as the worker pushes it and the API stores it, under the key
names of `vllm bench serve`'s result JSON. Units: counts, tokens, s (duration), req/s and tok/s
(rates), ms (latencies); docs/metrics.md defines each.

The level's metrics are the fields of LevelMetrics and nothing else: LEVEL_KEYS, the API's body,
the worker's push and LevelResult's columns (moeops.runs.models) all read them from there, so
that a new metric is one field here and a migration.
"""

import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, create_model

from domain.levels import LATENCY_KEYS, MAX_ROUNDS
from domain.numbers import is_number
from domain.wire.fields import (
    Attempt,
    BigInt,
    Body,
    Concurrency,
    EpochSeconds,
    JsonObject,
    PosInt,
    text,
)

# A packed request log within the API's body limit (MOEOPS_MAX_BODY_BYTES, 16 MiB).
MAX_REQUEST_LOG_CHARS = 12 << 20


def _rate_given(value):
    # the one word a rate may be: "inf", as Python and vLLM's --request-rate spell unlimited
    if value == "inf":
        return math.inf
    if value is not None and not is_number(value):
        raise ValueError('must be a number of req/s, or "inf" for unlimited')
    return value


def _rate(value):
    # inf (JSON Infinity or "inf") means unlimited, stored as null
    if value is not None and math.isnan(value):
        raise ValueError("must be a number, not NaN")
    return None if value is None or math.isinf(value) else value


# a rate of 0 req/s would send nothing
RequestRate = Annotated[
    Annotated[float, Field(gt=0, allow_inf_nan=True)] | None,
    BeforeValidator(_rate_given),
    AfterValidator(_rate),
]


class _Throughput(Body):
    """A level's counts and rates."""

    model_config = ConfigDict(strict=True)

    completed: PosInt | None = None
    failed: PosInt = 0
    duration: float | None = Field(None, description="s")
    total_input_tokens: BigInt | None = None
    total_output_tokens: BigInt | None = None
    request_throughput: float | None = Field(None, description="req/s")
    output_throughput: float | None = Field(None, description="tok/s")
    total_token_throughput: float | None = Field(None, description="tok/s")
    max_output_tokens_per_s: float | None = None
    max_concurrent_requests: PosInt | None = None
    request_goodput: float | None = Field(None, description="req/s within SLOs")
    achieved_request_rate: float | None = Field(
        None, description="req/s the client sent, after the ramp-up"
    )
    p99_lateness_ms: float | None = Field(
        None, description="ms a trace's requests went after their scaled timestamps, p99"
    )
    max_lateness_ms: float | None = Field(
        None, description="ms the latest of a trace's requests went after its scaled timestamp"
    )


# Every metric of a level: its counts and rates, then each latency statistic (ms) of
# domain.levels' names.
LevelMetrics = create_model(
    "LevelMetrics",
    __base__=_Throughput,
    __module__=__name__,
    **{key: (float | None, None) for key in LATENCY_KEYS},
)
LEVEL_KEYS = tuple(LevelMetrics.model_fields)


@dataclass(frozen=True)
class MetricType:
    """What one level metric holds, read from its field's JSON schema: an integer up to
    `maximum` (a count) or a number (a figure in its unit); whether it may be null; its default
    and its unit or meaning (`description`)."""

    integer: bool
    maximum: int | None
    nullable: bool
    default: int | float | None
    description: str


def _metric_type(schema: dict) -> MetricType:
    kinds = schema.get("anyOf", [schema])
    (value,) = [kind for kind in kinds if kind.get("type") != "null"]
    return MetricType(
        integer=value["type"] == "integer",
        maximum=value.get("maximum"),
        nullable=len(kinds) > 1,
        default=schema.get("default"),
        description=schema.get("description", ""),
    )


METRIC_TYPES = {
    key: _metric_type(schema)
    for key, schema in LevelMetrics.model_json_schema()["properties"].items()
}
# The metrics that are counts (integer columns); the others are figures in their unit.
COUNT_KEYS = tuple(key for key in LEVEL_KEYS if METRIC_TYPES[key].integer)


class _Shape(Body):
    """What a level is: the load it sent."""

    model_config = ConfigDict(strict=True)

    concurrency: Concurrency | None = None
    request_rate: RequestRate = Field(None, description="req/s; null or inf = unlimited")
    input_len: PosInt | None = None
    output_len: PosInt | None = None


class LevelFigures(LevelMetrics, _Shape):
    """One round of a level as a load generator's result holds it: what the level is, its
    metrics, and how its requests went."""

    errors: dict[text(300), PosInt] = Field({}, description="failure reason → count")
    usage_reported: bool | None = Field(
        None, description="token counts came from the server's usage"
    )
    started_at: EpochSeconds | None = None
    finished_at: EpochSeconds | None = None


class Level(LevelFigures):
    """One round of one level as the worker pushes it (POST /runs/{ref}/levels).

    Strict: a count must be a JSON integer and a figure a JSON number, so that true or "5" is
    refused rather than stored as 1 or 5.
    """

    attempt: Attempt = 1
    round: Annotated[int, Field(ge=1, le=MAX_ROUNDS)] = Field(
        1, description="1, 2, … of a level that runs several times in a row (parameters.rounds)"
    )
    raw: JsonObject | None = Field(None, description="the original result object, if any")
    request_log: Annotated[str, Field(max_length=MAX_REQUEST_LOG_CHARS)] | None = Field(
        None,
        description="every request of the round (domain.request_log): JSON columns, zlib, base64",
    )
