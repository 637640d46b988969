"""One JSON tool call, `{"name": ..., "arguments": {...}}`, read as it arrives.

The name goes out once it is complete, names a known function and the
arguments object has opened; the arguments then go out piece by piece in
canonical form (`json.dumps(args, ensure_ascii=False)`). When the object
closes, `parse_call_object` (the whole-text rule) decides whether it was a
call; what it says wins, and only the part of its arguments text not yet sent
goes out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from sglang.srt.parser.function_call.core_types import (
    ArgsEvent,
    FailedEvent,
    NameEvent,
    ScanEvent,
)
from sglang.srt.parser.function_call.json_reader import JsonObjectReader
from sglang.srt.parser.function_call.text_utils import dump_arguments

logger = logging.getLogger(__name__)

# Hermes and Mistral write "arguments", Llama 3 writes "parameters".
ARGUMENT_KEYS = ("arguments", "parameters")


def parse_call_object(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON text) of one call object's text; None if it is not a call."""
    try:
        obj = json.loads(text, strict=False, parse_constant=_reject_constant,
                         object_pairs_hook=_reject_duplicate_keys)  # fmt: skip
    except (ValueError, RecursionError):
        return None
    return call_from_object(obj, names)


def call_from_object(obj: Any, names: frozenset[str]) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    name = obj["name"]
    if name not in names:
        logger.debug("dropping a call to %r, which is not among the request's tools", name)
        return None
    args = _arguments(obj)
    if not isinstance(args, dict):
        return None
    try:
        return name, dump_arguments(args)
    except (TypeError, ValueError, RecursionError):
        return None


def _arguments(obj: dict) -> Any:
    for key in ARGUMENT_KEYS:
        if key not in obj:
            continue
        value = obj[key]
        if isinstance(value, str):  # some models write the arguments as a JSON string
            try:
                return json.loads(value, strict=False, parse_constant=_reject_constant)
            except (ValueError, RecursionError):  # too deep for json: not arguments
                return None
        return value
    return {}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A call whose object repeats a key is malformed: which value would the model have
    meant (json.loads keeps the last), and the streamed text already showed the first."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a key is repeated")
    return obj


class JsonCallReader:
    """Reads one call object; `raw` is the text it has used, starting at `{`."""

    def __init__(self, names: frozenset[str], indices: Iterator[int]) -> None:
        self._reader = JsonObjectReader()
        self._names = names
        self._indices = indices
        self.raw = ""
        self.tool_index: int | None = None  # set once the name went out
        self._key: str | None = None
        self._name_text = ""  # canonical JSON text of the "name" value
        self._name: str | None = None
        self._args_key: str | None = None
        self._args_text = ""  # canonical arguments text read so far
        self._sent = 0  # characters of _args_text already emitted
        self._keys_seen: set[str] = set()
        self._repeated_key = False  # the object repeats a key: not a call
    @property
    def done(self) -> bool:
        return self._reader.done

    @property
    def failed(self) -> bool:
        return self._reader.error is not None or self._repeated_key

    def feed(self, text: str) -> tuple[list[ScanEvent], int]:
        reader_events, used = self._reader.feed(text)
        self.raw += text[:used]
        for event in reader_events:
            self._on_reader_event(event)
        events: list[ScanEvent] = []
        # a call whose name went out sends its arguments up to where they broke, in
        # whatever chunks they came (the piece read in the breaking chunk was lost)
        if not self.failed or self.tool_index is not None:
            self._emit_progress(events)
        return events, used

    def finalize(self, complete: bool, raw_text: str) -> tuple[list[ScanEvent], bool]:
        """Events that settle the call, and whether it was one.

        `raw_text` is what the output shows for it if it was not a call.
        """
        call = parse_call_object(self.raw, self._names) if complete and self.done else None
        if call is None:
            return [FailedEvent(self.tool_index, raw_text)], False
        name, args_text = call
        events: list[ScanEvent] = []
        if self.tool_index is None:
            self.tool_index = next(self._indices)
            events.append(NameEvent(self.tool_index, name))
        sent = self._args_text[: self._sent]
        if args_text.startswith(sent):
            if len(args_text) > len(sent):
                events.append(ArgsEvent(self.tool_index, args_text[len(sent) :]))
        else:  # e.g. a duplicate key: json.loads keeps the last value
            logger.warning(
                "streamed arguments of call %d differ from its final text", self.tool_index
            )
        return events, True

    def _on_reader_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == "key":
            self._key = event[1]
            self._repeated_key |= self._key in self._keys_seen
            self._keys_seen.add(self._key)
            if self._key in ARGUMENT_KEYS and self._args_key is None:
                self._args_key = self._key
        elif kind == "frag" and self._key == "name":
            self._name_text += event[1]
        elif kind == "frag" and self._key == self._args_key:
            self._args_text += event[1]
        elif kind == "end" and self._key == "name":
            self._name = _decoded_name(self._name_text)

    def _emit_progress(self, events: list[ScanEvent]) -> None:
        if self.tool_index is None:
            ready = self._name in self._names and self._args_text.startswith("{")
            if not ready:
                return
            self.tool_index = next(self._indices)
            events.append(NameEvent(self.tool_index, self._name))
        if len(self._args_text) > self._sent:
            events.append(ArgsEvent(self.tool_index, self._args_text[self._sent :]))
            self._sent = len(self._args_text)


def _decoded_name(canonical: str) -> str | None:
    try:
        value = json.loads(canonical)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
