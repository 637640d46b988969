"""One pythonic tool call, `name(key=literal, ...)`, read as it arrives.

The reader only finds where the call ends (brackets and string quotes
tracked); `parse_pythonic_call` then parses it with `ast`, taking keyword
values with `ast.literal_eval`: nothing is ever evaluated. Name and arguments
go out together once the call is complete, since Python literals are not JSON
until they are parsed.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterator

from sglang.srt.parser.function_call.core_types import (
    ArgsEvent,
    FailedEvent,
    NameEvent,
    ScanEvent,
)
from sglang.srt.parser.function_call.text_utils import dump_arguments

logger = logging.getLogger(__name__)

_NAME_START = re.compile(r"[A-Za-z_]")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_]")
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


def parse_pythonic_call(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON text) of `name(k=v, ...)`; None if it is not such a call."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if node.func.id not in names:
        logger.debug("dropping a call to %r, which is not among the request's tools", node.func.id)
        return None
    args = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return None
        try:
            args[keyword.arg] = ast.literal_eval(keyword.value)
        except _LITERAL_ERRORS:
            return None
    try:
        return node.func.id, dump_arguments(args)
    except (TypeError, ValueError):  # a set, bytes, complex or infinite value
        return None


def is_call_start(ch: str) -> bool:
    return _NAME_START.match(ch) is not None


class PythonCallReader:
    """Reads one call from its name to its closing parenthesis; `raw` is the text used."""

    def __init__(self, names: frozenset[str], indices: Iterator[int]) -> None:
        self._names = names
        self._indices = indices
        self.raw = ""
        self.done = False
        self.failed = False
        self._in_name = True
        self._name_len = 0
        self._depth = 0  # open brackets, the call's own parenthesis included
        self._quote: str | None = None  # the open string's quote: ', ", ''' or """

    def feed(self, text: str) -> tuple[list[ScanEvent], int]:
        """Uses `text` up to the call's end; stops early only to see past a quote or backslash."""
        pos = 0
        while pos < len(text) and not (self.done or self.failed):
            step = self._step(text, pos)
            if step is None:  # the next characters decide; wait for them
                break
            pos = step
        self.raw += text[:pos]
        return [], pos

    def finalize(self, complete: bool, raw_text: str) -> tuple[list[ScanEvent], bool]:
        call = parse_pythonic_call(self.raw, self._names) if complete and self.done else None
        if call is None:
            return [FailedEvent(None, raw_text)], False
        tool_index = next(self._indices)
        return [NameEvent(tool_index, call[0]), ArgsEvent(tool_index, call[1])], True

    def _step(self, text: str, pos: int) -> int | None:
        if self._in_name:
            return self._name_step(text[pos], pos)
        if self._quote is not None:
            return self._string_step(text, pos)
        ch = text[pos]
        if ch in "'\"":
            return self._open_string(text, pos)
        if ch in "([{":
            self._depth += 1
        elif ch in ")]}":
            self._depth -= 1
            self.done = self._depth == 0
        return pos + 1

    def _name_step(self, ch: str, pos: int) -> int:
        if ch == "(" and self._name_len > 0:
            self._in_name = False
            self._depth = 1
            return pos + 1
        pattern = _NAME_CHAR if self._name_len else _NAME_START
        if pattern.match(ch) is None:
            self.failed = True  # not a call; this character is not used
            return pos
        self._name_len += 1
        return pos + 1

    def _open_string(self, text: str, pos: int) -> int | None:
        triple = text[pos] * 3
        if text.startswith(triple, pos):
            self._quote = triple
            return pos + 3
        if triple.startswith(text[pos:]):  # two quotes at the end: empty string or '''
            return None
        self._quote = text[pos]
        return pos + 1

    def _string_step(self, text: str, pos: int) -> int | None:
        quote = self._quote
        if text[pos] == "\\":
            return pos + 2 if pos + 1 < len(text) else None
        if text.startswith(quote, pos):
            self._quote = None
            return pos + len(quote)
        if len(quote) == 3 and quote.startswith(text[pos:]):
            return None  # may be the closing triple quote
        return pos + 1
