"""Incremental reading of one JSON object that arrives a few characters at a time.

`JsonObjectReader` reads strict JSON, except that strings may hold raw control
characters (as `json.loads(strict=False)` allows), and reports events about the
outer object:

- `("key", k)`: a key of the outer object, decoded, once complete;
- `("frag", text)`: the next piece of the canonical text of the current key's
  value, canonical meaning `json.dumps(value, ensure_ascii=False)`;
- `("end",)`: the current key's value is complete.

Invariant: the fragments of one value, joined, are always a prefix of its
canonical text (a number a float cannot hold, `1e400`, has none: it goes out as
written). Numbers and literals go out when their token ends (`1` may become
`12`); strings go out as they arrive, holding back only an unfinished escape,
or a high surrogate whose low half may follow.
"""

from __future__ import annotations

import json
import re

from sglang.srt.parser.function_call.text_utils import (
    JSON_WHITESPACE,
    dump_arguments,
    json_text,
)

ReaderEvent = tuple

_STRING_RUN = re.compile(r'[^"\\]+')
_HIGH_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\Z")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_NUMBER_CHARS = frozenset("+-0123456789.eE")
_NUMBER_START = frozenset("-0123456789")
_LITERAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz")
_LITERALS = frozenset(("true", "false", "null"))
_CLOSER = {"{": "}", "[": "]"}


class JsonSyntaxError(ValueError):
    """The text read so far cannot be the start of a JSON object."""


class JsonObjectReader:
    def __init__(self) -> None:
        self._stack: list[str] = []  # open containers, "{" or "["; [0] is the outer object
        # What the next token may be: value, value_or_close, key, key_or_close, colon, comma.
        self._expect = "value"
        self._token_kind: str | None = None  # "number" | "literal" while one is being read
        self._token = ""
        self._in_string = False
        self._string_is_outer_key = False
        self._string_is_key = False
        self._pending = ""  # raw string content not yet decoded
        self._escape_left = 0  # -1: after a backslash; n > 0: hex digits still due
        self._escape_start = 0  # index in _pending of the unfinished escape
        self._key_parts: list[str] = []
        self.done = False
        self.error: str | None = None

    def feed(self, text: str) -> tuple[list[ReaderEvent], int]:
        """Events for `text`, and how many of its characters belong to the object.

        Reading stops at the outer object's closing brace (`done`) or at the
        first character that cannot continue it (`error`; that character is
        not counted as used).
        """
        events: list[ReaderEvent] = []
        if self.done or self.error is not None:
            return events, 0
        i = 0
        try:
            while i < len(text) and not self.done:
                i = self._step(text, i, events)
            if self._in_string:
                self._flush_string(events, final=False)
        except JsonSyntaxError as exc:
            self.error = str(exc)
        return events, i

    def _step(self, text: str, i: int, events: list[ReaderEvent]) -> int:
        if self._in_string:
            return self._string_step(text, i, events)
        ch = text[i]
        if self._token_kind is not None:
            allowed = _NUMBER_CHARS if self._token_kind == "number" else _LITERAL_CHARS
            if ch in allowed:
                self._token += ch
                return i + 1
            self._finish_token(events)
        if ch not in JSON_WHITESPACE:
            self._structural(ch, events)
        return i + 1

    def _structural(self, ch: str, events: list[ReaderEvent]) -> None:
        expect = self._expect
        if expect == "value_or_close" and ch == "]":
            self._close(ch, events)
        elif expect in ("value", "value_or_close"):
            self._start_value(ch, events)
        elif expect == "key_or_close" and ch == "}":
            self._close(ch, events)
        elif expect in ("key", "key_or_close") and ch == '"':
            self._start_string(is_key=True, events=events)
        elif expect == "colon" and ch == ":":
            self._separator(": ", "value", events)
        elif expect == "comma" and ch == ",":
            next_expect = "key" if self._stack[-1] == "{" else "value"
            self._separator(", ", next_expect, events)
        elif expect == "comma" and ch in "]}":
            self._close(ch, events)
        else:
            raise JsonSyntaxError(f"unexpected {ch!r} where a {expect} belongs")

    def _start_value(self, ch: str, events: list[ReaderEvent]) -> None:
        if not self._stack and ch != "{":
            raise JsonSyntaxError("a tool call must be a JSON object")
        if ch in "{[":
            if self._stack:
                self._frag(ch, events)
            self._stack.append(ch)
            self._expect = "key_or_close" if ch == "{" else "value_or_close"
        elif ch == '"':
            self._start_string(is_key=False, events=events)
        elif ch in _NUMBER_START:
            self._token_kind, self._token = "number", ch
        elif ch in _LITERAL_CHARS:
            self._token_kind, self._token = "literal", ch
        else:
            raise JsonSyntaxError(f"unexpected {ch!r} where a value belongs")

    def _close(self, ch: str, events: list[ReaderEvent]) -> None:
        if ch != _CLOSER[self._stack[-1]]:
            raise JsonSyntaxError(f"{ch!r} does not close {self._stack[-1]!r}")
        self._stack.pop()
        if not self._stack:
            self.done = True
            return
        self._frag(ch, events)
        self._value_done(events)

    def _separator(self, canonical: str, next_expect: str, events: list[ReaderEvent]) -> None:
        if len(self._stack) > 1:  # the outer object's own syntax is not part of any value
            self._frag(canonical, events)
        self._expect = next_expect

    def _value_done(self, events: list[ReaderEvent]) -> None:
        self._expect = "comma"
        if len(self._stack) == 1:
            events.append(("end",))

    def _finish_token(self, events: list[ReaderEvent]) -> None:
        token, kind = self._token, self._token_kind
        self._token_kind, self._token = None, ""
        if kind == "literal" and token not in _LITERALS:
            raise JsonSyntaxError(f"bad literal {token!r}")
        self._frag(_canonical_token(token), events)
        self._value_done(events)

    def _start_string(self, is_key: bool, events: list[ReaderEvent]) -> None:
        self._in_string = True
        self._string_is_key = is_key
        self._string_is_outer_key = is_key and len(self._stack) == 1
        if self._string_is_outer_key:
            self._key_parts = []
        else:
            self._frag('"', events)

    def _string_step(self, text: str, i: int, events: list[ReaderEvent]) -> int:
        ch = text[i]
        if self._escape_left:
            self._escape_char(ch)
            return i + 1
        if ch == '"':
            self._end_string(events)
            return i + 1
        if ch == "\\":
            self._escape_start = len(self._pending)
            self._escape_left = -1
            self._pending += ch
            return i + 1
        run = _STRING_RUN.match(text, i)
        self._pending += run.group()
        return run.end()

    def _escape_char(self, ch: str) -> None:
        if self._escape_left == -1:
            if ch == "u":
                self._escape_left = 4
            elif ch in _SIMPLE_ESCAPES:
                self._escape_left = 0
            else:
                raise JsonSyntaxError(f"bad escape \\{ch}")
        elif ch in _HEX_DIGITS:
            self._escape_left -= 1
        else:
            raise JsonSyntaxError(f"bad hex digit {ch!r} in a \\u escape")
        self._pending += ch

    def _end_string(self, events: list[ReaderEvent]) -> None:
        self._flush_string(events, final=True)
        self._in_string = False
        if self._string_is_outer_key:
            events.append(("key", "".join(self._key_parts)))
        else:
            self._frag('"', events)
        if self._string_is_key:
            self._expect = "colon"
        else:
            self._value_done(events)

    def _flush_string(self, events: list[ReaderEvent], final: bool) -> None:
        pending = self._pending
        cut = len(pending)
        if self._escape_left:
            cut = self._escape_start
        if not final and _ends_with_high_surrogate(pending[:cut]):
            cut -= 6  # its low half may be the next escape; decode the pair together
        if cut <= 0:
            return
        self._pending = pending[cut:]
        self._escape_start -= cut
        try:
            decoded = json.loads('"' + pending[:cut] + '"', strict=False)
        except ValueError as exc:
            raise JsonSyntaxError(str(exc)) from exc
        if self._string_is_outer_key:
            self._key_parts.append(decoded)
        else:
            self._frag(json_text(decoded)[1:-1], events)

    @staticmethod
    def _frag(text: str, events: list[ReaderEvent]) -> None:
        if events and events[-1][0] == "frag":
            events[-1] = ("frag", events[-1][1] + text)
        else:
            events.append(("frag", text))


def _canonical_token(token: str) -> str:
    """A literal's or number's canonical text; a JSON number that Python cannot hold
    as a float (`1e400`) or int (past 4300 digits) goes out as written."""
    if token in _LITERALS:
        return token
    if _JSON_NUMBER.fullmatch(token) is None:
        raise JsonSyntaxError(f"bad number {token!r}")
    try:
        return dump_arguments(json.loads(token))
    except ValueError:  # inf (allow_nan=False), or an int too long to convert
        return token


def _ends_with_high_surrogate(raw: str) -> bool:
    match = _HIGH_SURROGATE_ESCAPE.search(raw)
    if match is None:
        return False
    before = raw[: match.start()]
    preceding_backslashes = len(before) - len(before.rstrip("\\"))
    return preceding_backslashes % 2 == 0  # else the backslash is itself escaped
