"""Small text helpers shared by the tool-call scanners."""

from __future__ import annotations

import json
from typing import Any

JSON_WHITESPACE = " \t\n\r"


def partial_suffix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`.

    Streaming holds back exactly this much: it may be the start of `marker`.
    """
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def dump_arguments(args: Any) -> str:
    """The canonical arguments text; ValueError/TypeError when not JSON-representable."""
    return json.dumps(args, ensure_ascii=False, allow_nan=False)


def tool_names(tools: list[dict] | None) -> frozenset[str]:
    """Function names of OpenAI tool dicts (`{"type": "function", "function": {...}}`)."""
    names = set()
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)
