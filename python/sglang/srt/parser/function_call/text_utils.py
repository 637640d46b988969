"""Small text helpers shared by the tool-call scanners."""

from __future__ import annotations

import json
import re
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


# A surrogate code point in a Python str is a lone half (a pair decodes to one char):
# JSON may escape one (`"\\ud83d"`), but UTF-8 cannot encode it raw.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    return _LONE_SURROGATE.search(text) is not None


def json_text(value: Any) -> str:
    """json.dumps(value, ensure_ascii=False), with lone surrogates left escaped (as
    `\\udXXX`), so the text encodes to UTF-8 for the response; ValueError/TypeError when
    not JSON-representable."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def dump_arguments(args: Any) -> str:
    """The canonical arguments text; ValueError/TypeError when not JSON-representable."""
    return json_text(args)


def tool_names(tools: list[dict] | None) -> frozenset[str]:
    """Function names of OpenAI tool dicts (`{"type": "function", "function": {...}}`)."""
    names = set()
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)
