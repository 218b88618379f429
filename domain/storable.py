"""What PostgreSQL and SQLite both store without an error: the checks every write path shares
(API payloads, run parameters, imported files)."""

import math
from typing import Any

# Largest value of the integer columns (PositiveIntegerField is a 32-bit column on PostgreSQL).
MAX_INT = 2_147_483_647
MAX_SMALL_INT = 32_767
MAX_BIG_INT = 9_223_372_036_854_775_807
MAX_JSON_DEPTH = 64


def storable_text(value: str) -> str:
    """The string, or ValueError when PostgreSQL's text and jsonb refuse it (U+0000 or a lone
    surrogate, which is not UTF-8)."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (it holds a lone surrogate)") from None
    return value


def storable_json(value: Any, path: str = "") -> Any:
    """The value, or ValueError naming the first path (`gpus.0.pcie.x`) that jsonb refuses: NUL
    or a lone surrogate in a string or key, NaN or Infinity, nesting deeper than MAX_JSON_DEPTH.
    """
    stack = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        try:
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, str):
                storable_text(item)
            elif isinstance(item, float) and not math.isfinite(item):
                raise ValueError("must not be NaN or Infinity")
            elif isinstance(item, dict):
                for key, child in item.items():
                    storable_text(key)
                    stack.append((child, _join(where, key), depth + 1))
            elif isinstance(item, list | tuple):
                stack.extend((child, _join(where, i), depth + 1) for i, child in enumerate(item))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}" if where else str(exc)) from None
    return value


def _join(path, key):
    return f"{path}.{key}" if path else str(key)
