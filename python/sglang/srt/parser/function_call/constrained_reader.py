"""Read the calls of a grammar-shaped output, `[{"name": ..., "parameters": {...}}, ...]`.

Under `tool_choice` "required" or a named function the model writes that array (the
grammar of `constrained.tool_call_schema` allows nothing else). Each element is read
by the tool-call parsers' own `JsonCallReader`, and the whole text is read by
streaming it in one piece, so a stream and the final answer give the same calls: per
call, an item with the name (parameters ""), then fragments of its arguments text.
Between elements only `[`, `,`, `]` and whitespace can occur; they are skipped.

A call's arguments are its text as read, whatever the whole-text rule of "auto" would
say of it: the grammar already held them to the schema, and a stream has sent them
by the time the call closes. So `{"a": 1, "a": 2}` stays as written (json.loads would
keep only the last value), as does a number a float cannot hold (`1e400`).
"""

from __future__ import annotations

import itertools
from typing import Any

from sglang.srt.parser.function_call.core_types import ArgsEvent, NameEvent, ToolCallItem
from sglang.srt.parser.function_call.json_call import JsonCallReader
from sglang.srt.parser.function_call.text_utils import tool_names


class ConstrainedCallStream:
    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._names = tool_names(tools)
        self._indices = itertools.count()
        self._call: JsonCallReader | None = None  # the element being read
        self._broken = False  # not the grammar's shape (no grammar backend?): stop reading

    def feed(self, delta: str) -> list[ToolCallItem]:
        """The items `delta` completes (names, argument fragments)."""
        items: list[ToolCallItem] = []
        pos = 0
        while pos < len(delta) and not self._broken:
            if self._call is None:
                if delta[pos] == "{":
                    self._call = JsonCallReader(self._names, self._indices)
                else:
                    pos += 1
                continue
            events, used = self._call.feed(delta[pos:])
            pos += used
            items += _items(events)
            if not self._settle(items) and used == 0:
                break  # cannot happen: the reader takes all it is given until done
        return items

    def _settle(self, items: list[ToolCallItem]) -> bool:
        """Close the element if it ended; whether it did."""
        call = self._call
        if call.failed:
            self._broken, self._call = True, None
        elif call.done:
            # a call the whole-text rule refuses (a repeated key, 1e400) keeps the name
            # and arguments already read: its FailedEvent is dropped by _items
            events, _ = call.finalize(True, call.raw)
            items += _items(events)
            self._call = None
        return self._call is None


def parse_constrained_calls(text: str, tools: list[dict[str, Any]] | None) -> list[ToolCallItem]:
    """The calls a stream of `text` sends, each with its whole arguments text; the last
    may be cut (max_tokens), as OpenAI's are. [] when no call began: the text stays
    content."""
    calls: dict[int, ToolCallItem] = {}
    for piece in ConstrainedCallStream(tools).feed(text):
        if piece.name is not None:
            calls[piece.tool_index] = ToolCallItem(piece.tool_index, piece.name, "")
        elif piece.tool_index in calls:
            calls[piece.tool_index].parameters += piece.parameters
    return [calls[i] for i in sorted(calls)]


def _items(events: list[Any]) -> list[ToolCallItem]:
    items = []
    for event in events:
        if isinstance(event, NameEvent):
            items.append(ToolCallItem(event.tool_index, event.name, ""))
        elif isinstance(event, ArgsEvent):
            items.append(ToolCallItem(event.tool_index, None, event.fragment))
    return items
