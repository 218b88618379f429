"""JSON objects a worker wrote (a run's progress, its snapshot), read alike by both tiers through
pydantic models whose fields are typed: a value of another type (an old run's, a worker's of
another version) reads as absent rather than failing a page or a claim."""

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from domain.numbers import is_integer, is_number


def _kept_if(check, absent=None):
    return BeforeValidator(lambda value: value if check(value) else absent)


def is_object(value) -> bool:
    """A JSON object (a dict)."""
    return isinstance(value, dict)


# JSON's true is no count: a bool reads as absent, an int stays an int
Number = Annotated[int | float | None, _kept_if(is_number)]
Integer = Annotated[int | None, _kept_if(is_integer)]
Text = Annotated[str | None, _kept_if(lambda value: isinstance(value, str))]
Object = Annotated[dict | None, _kept_if(is_object)]
Flag = Annotated[bool, _kept_if(lambda value: isinstance(value, bool), absent=False)]
# an object that reads as {} when absent or of another type
Fields = Annotated[dict, _kept_if(is_object, absent={})]


class WorkerJSON(BaseModel):
    """A JSON object a worker wrote, read leniently: keys the model does not name are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @classmethod
    def read(cls, value):
        """The model of value (a dict; anything else reads as an empty object)."""
        return cls.model_validate(value if isinstance(value, dict) else {})
