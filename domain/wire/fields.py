"""The field types of the wire's bodies: what PostgreSQL and SQLite both store without an error
(domain.storable), and integers that are JSON integers (pydantic would take true and "12")."""

from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    model_validator,
)

from domain.storable import MAX_BIG_INT, MAX_INT, MAX_SMALL_INT, storable_json, storable_text


def text(max_length: int, min_length: int = 0):
    """A string that fits a CharField(max_length)."""
    return Annotated[
        str,
        StringConstraints(min_length=min_length, max_length=max_length),
        AfterValidator(storable_text),
    ]


def each_once(listed, field):
    """A model validator: no two entries of the body's list `listed` share the value of `field`,
    the key they are stored under (a GPU's index, a timing's batch size)."""

    def check(body):
        values = [getattr(item, field) for item in getattr(body, listed)]
        if len(values) != len(set(values)):
            raise ValueError(f"{listed}: each {field} may appear once")
        return body

    return model_validator(mode="after")(check)


LongText = Annotated[str, StringConstraints(max_length=1_000_000), AfterValidator(storable_text)]
# Strict: true and "12" are no integers (pydantic would store them as 1 and 12)
PosInt = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
SmallInt = Annotated[int, Strict(), Field(ge=0, le=MAX_SMALL_INT)]
BigInt = Annotated[int, Strict(), Field(ge=0, le=MAX_BIG_INT)]
# a size of a kernel's shape or a batch: at least 1, in a 32-bit column
Size = Annotated[int, Strict(), Field(ge=1, le=MAX_INT)]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]
JsonList = Annotated[list[Any], AfterValidator(storable_json)]
EpochSeconds = Annotated[float, Field(ge=0, le=1e11)]

# Each request in flight holds one TCP connection, and so one port of the client's address.
MAX_CONCURRENCY = 1 << 16
Concurrency = Annotated[int, Field(strict=True, ge=1, le=MAX_CONCURRENCY)]
# The sweep's delivery that took a level or a sample: 1, then 2, … after each resume.
Attempt = Annotated[
    int,
    Field(ge=1, le=MAX_SMALL_INT, description="the sweep's delivery: 2, … after a resume"),
]
# A sample's reading: % utilization, and gauges (W, MiB, MHz, °C, requests, KV-cache share)
Percent = Annotated[float, Field(ge=0, le=1e4)]
Gauge = Annotated[float, Field(ge=-1e12, le=1e12)]


class Body(BaseModel):
    """Base of the wire's bodies: finite numbers only (SQLite stores NaN as NULL).

    Plain pydantic, not ninja's Schema: its per-object root validator (for reading Django
    rows) costs ~30 µs per object, i.e. 150 ms for a telemetry batch of 5,000 samples.
    """

    model_config = ConfigDict(allow_inf_nan=False)


class Patch(Body):
    """A PATCH body: fields left out stay as they are; null only where the column allows it."""

    NULLABLE: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _no_null_for_required(self):
        for name in sorted(self.model_fields_set):
            if getattr(self, name) is None and name not in self.NULLABLE:
                raise ValueError(f"{name} may not be null")
        return self
