"""Constrained payload types: what PostgreSQL and SQLite both store without an error."""

import datetime as dt
from typing import Annotated, Any, ClassVar

from django.core.exceptions import ValidationError
from ninja import Schema
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    model_validator,
)

from moeops.fleet.models import not_an_id, one_line
from moeops.storable import (
    MAX_BIG_INT,
    MAX_INT,
    MAX_SMALL_INT,
    storable_json,
    storable_text,
)


def text(max_length: int, min_length: int = 0):
    """A string that fits a CharField(max_length)."""
    return Annotated[
        str,
        StringConstraints(min_length=min_length, max_length=max_length),
        AfterValidator(storable_text),
    ]


LongText = Annotated[str, StringConstraints(max_length=1_000_000), AfterValidator(storable_text)]


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
# Strict: true and "12" are no integers (pydantic would store them as 1 and 12)
PosInt = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
SmallInt = Annotated[int, Strict(), Field(ge=0, le=MAX_SMALL_INT)]
BigInt = Annotated[int, Strict(), Field(ge=0, le=MAX_BIG_INT)]
# a cap on running requests of 0 would let the engine run nothing
RequestCap = Annotated[PosInt, Field(ge=1)]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]
JsonList = Annotated[list[Any], AfterValidator(storable_json)]


class In(BaseModel):
    """Base of request bodies: finite numbers only (SQLite stores NaN as NULL).

    Plain pydantic, not ninja's Schema: its per-object root validator (for reading Django
    rows) costs ~30 µs per object, i.e. 150 ms for a telemetry batch of 5,000 samples.
    """

    model_config = ConfigDict(allow_inf_nan=False)


class Patch(In):
    """A PATCH body: fields left out stay as they are; null only where the column allows it."""

    NULLABLE: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _no_null_for_required(self):
        for name in sorted(self.model_fields_set):
            if getattr(self, name) is None and name not in self.NULLABLE:
                raise ValueError(f"{name} may not be null")
        return self


def _utc(value: dt.datetime) -> dt.datetime:
    # naive datetimes are UTC, like every timestamp of the API
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError("is out of range") from None


Moment = Annotated[dt.datetime, AfterValidator(_utc)]
EpochSeconds = Annotated[float, Field(ge=0, le=1e11)]


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


def matching(queryset, filters, **lookups):
    """The queryset limited to the filters that are set; lookups: filter name → ORM lookup."""
    for name, lookup in lookups.items():
        value = getattr(filters, name)
        if value is not None:
            queryset = queryset.filter(**{lookup: value})
    return queryset
