"""Constrained payload types: what PostgreSQL and SQLite both store without an error. The wire's
(domain.wire.fields), which the worker's pushes share, and those of the API alone: names found
by id or name, query filters."""

import datetime as dt
from typing import Annotated, Literal

from django.core.exceptions import ValidationError
from ninja import Schema
from pydantic import AfterValidator, Field, StringConstraints

from domain.wire.fields import (
    BigInt,
    EpochSeconds,
    JsonList,
    JsonObject,
    LongText,
    Patch,
    PosInt,
    SmallInt,
    text,
)
from domain.wire.fields import Body as In
from moeops.fleet.models import not_an_id, one_line

# the wire's types, which every API module takes from here
__all__ = [
    "BigInt",
    "EpochSeconds",
    "In",
    "JsonList",
    "JsonObject",
    "LongText",
    "Patch",
    "PosInt",
    "SmallInt",
    "text",
]


def _a_name(value: str) -> str:
    try:
        not_an_id(value)
        one_line(value)
    except ValidationError as exc:
        raise ValueError(exc.messages[0]) from None
    return value


# the name of a row the API finds by id or name (models, deployments, SLO profiles)
Name = Annotated[text(200, min_length=1), AfterValidator(_a_name)]


def slug(max_length: int):
    """A string that fits a SlugField(max_length)."""
    return Annotated[
        str, StringConstraints(min_length=1, max_length=max_length, pattern=r"^[-a-zA-Z0-9_]+$")
    ]


HostName = Annotated[slug(100), AfterValidator(_a_name)]
# a cap on running requests of 0 would let the engine run nothing
RequestCap = Annotated[PosInt, Field(ge=1)]


def _utc(value: dt.datetime) -> dt.datetime:
    # naive datetimes are UTC, like every timestamp of the API
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError("is out of range") from None


Moment = Annotated[dt.datetime, AfterValidator(_utc)]


class CreatedRange(Schema):
    """?created_after=&created_before= (ISO 8601; naive means UTC)."""

    created_after: Moment | None = None
    created_before: Moment | None = None


def in_range(queryset, filters, field="created"):
    """The queryset limited to the filters' date range on `field`."""
    if filters.created_after is not None:
        queryset = queryset.filter(**{f"{field}__gte": filters.created_after})
    if filters.created_before is not None:
        queryset = queryset.filter(**{f"{field}__lt": filters.created_before})
    return queryset


def one_of(choices, *, but=()):
    """The Literal type of a model field's choices (its (key, label) pairs): their keys, less
    those in `but`."""
    return Literal[tuple(key for key, _ in choices if key not in but)]


def matching(queryset, filters, *fields, **lookups):
    """The queryset limited to the filters that are set; fields: filters named as the column
    they match; lookups: filter name → ORM lookup."""
    for name, lookup in ({field: field for field in fields} | lookups).items():
        value = getattr(filters, name)
        if value is not None:
            queryset = queryset.filter(**{lookup: value})
    return queryset
