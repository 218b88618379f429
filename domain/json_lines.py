"""Where each element of a JSON array starts, so that a refusal can name its line."""

from __future__ import annotations

import json


def array_lines(text: str, count: int) -> list[int]:
    """The 1-based line on which each of the first `count` elements of the JSON array `text`
    starts (the text decodes; decoding one element at a time finds where the next begins)."""
    decoder = json.JSONDecoder()
    position = len(text) - len(text.lstrip()) + 1
    lines = []
    for _ in range(count):
        while text[position] in " \t\r\n,":
            position += 1
        lines.append(text.count("\n", 0, position) + 1)
        _, position = decoder.raw_decode(text, position)
    return lines
