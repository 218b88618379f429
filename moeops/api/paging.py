"""Pagination of list endpoints: ?limit=&offset=, answered as {"items": [...], "count": N}."""

from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination

MAX_LIMIT = 1000


class Page(LimitOffsetPagination):
    class Input(Schema):
        limit: int = Field(100, ge=1, le=MAX_LIMIT)
        # bounded so the OFFSET fits a 64-bit integer on SQLite and PostgreSQL
        offset: int = Field(0, ge=0, le=2**62)

    def __init__(self, **kwargs):
        super().__init__(max_limit=MAX_LIMIT, **kwargs)
