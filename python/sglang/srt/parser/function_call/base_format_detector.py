"""The detector seam: one tool-call format, parsed whole or streamed.

A detector owns the streaming state of one response: use a fresh instance per
response. `detect_and_parse` uses its own scanner and leaves that state alone.
"""

from __future__ import annotations

import logging

from sglang.srt.parser.function_call.core_types import (
    ArgsEvent,
    FailedEvent,
    FailedTailEvent,
    NameEvent,
    ScanEvent,
    StreamingParseResult,
    TextEvent,
    ToolCallItem,
)
from sglang.srt.parser.function_call.region_scanner import RegionFormat, RegionScanner
from sglang.srt.parser.function_call.text_utils import tool_names

logger = logging.getLogger(__name__)


class SpacingAfterCalls:
    """Once a call was made, holds the whitespace that ends the text so far: the newline
    a model writes between or after its calls (Qwen's `</tool_call>\n<tool_call>`) is not
    content, as in vLLM's and SGLang's parsers, where content is the text before the
    first call. Spacing that more text follows goes out with that text; the same
    whatever the chunking, a whole-text parse included."""

    def __init__(self) -> None:
        self._made_call = False
        self._held = ""

    def filter(self, events: list[ScanEvent]) -> list[ScanEvent]:
        out: list[ScanEvent] = []
        for event in events:
            if isinstance(event, NameEvent):
                self._made_call, self._held = True, ""
            elif isinstance(event, TextEvent) and self._made_call:
                text = self._held + event.text
                said = text.rstrip()
                self._held = text[len(said) :]
                if not said:
                    continue
                event = TextEvent(said)
            elif self._held:  # a failed call's text: the spacing before it is its own
                out.append(TextEvent(self._held))
                self._held = ""
            out.append(event)
        return out


class BaseFormatDetector:
    format: RegionFormat  # set by each subclass

    def __init__(self) -> None:
        self._scanner: RegionScanner | None = None
        self._spacing = SpacingAfterCalls()

    def has_tool_call(self, text: str) -> bool:
        return self.format.bot_token in text

    def detect_and_parse(self, text: str, tools: list[dict] | None) -> StreamingParseResult:
        """Whole output: normal text and complete calls (indices 0..n-1)."""
        scanner = RegionScanner(self.format, tool_names(tools))
        return collect_whole(SpacingAfterCalls().filter(scanner.feed(text) + scanner.finish()))

    def parse_streaming_increment(
        self, new_text: str, tools: list[dict] | None
    ) -> StreamingParseResult:
        """The next piece of output; `tools` is read on the first call only."""
        if self._scanner is None:
            self._scanner = RegionScanner(self.format, tool_names(tools))
        return collect_stream(self._spacing.filter(self._scanner.feed(new_text)))

    def finish_streaming(self) -> StreamingParseResult:
        """What was held back at the end of the output (a partial marker, a truncated call)."""
        if self._scanner is None:
            return StreamingParseResult()
        events = self._spacing.filter(self._scanner.finish())
        self._scanner = None
        return collect_stream(events)


def collect_whole(events: list[ScanEvent]) -> StreamingParseResult:
    """A failed call, even one whose name was emitted, becomes text again."""
    texts: list[str] = []
    calls: dict[int, ToolCallItem] = {}
    for event in events:
        if isinstance(event, TextEvent):
            texts.append(event.text)
        elif isinstance(event, NameEvent):
            calls[event.tool_index] = ToolCallItem(event.tool_index, event.name, "")
        elif isinstance(event, ArgsEvent):
            calls[event.tool_index].parameters += event.fragment
        elif isinstance(event, FailedEvent):
            texts.append(event.raw_text)
            calls.pop(event.tool_index, None)
        elif isinstance(event, FailedTailEvent):
            texts.append(event.text)
    items = [ToolCallItem(i, c.name, c.parameters) for i, c in enumerate(calls.values())]
    return StreamingParseResult("".join(texts), items)


def collect_stream(events: list[ScanEvent]) -> StreamingParseResult:
    """A call's first item carries its name; argument pieces follow with name None.
    A call that fails after its name went out is not taken back, and the rest of its
    region (FailedTailEvent) is not sent as content either."""
    texts: list[str] = []
    items: list[ToolCallItem] = []
    for event in events:
        if isinstance(event, TextEvent):
            texts.append(event.text)
        elif isinstance(event, NameEvent):
            items.append(ToolCallItem(event.tool_index, event.name, ""))
        elif isinstance(event, ArgsEvent):
            _append_fragment(items, event)
        elif isinstance(event, FailedTailEvent):
            continue
        elif event.tool_index is None:
            texts.append(event.raw_text)
        else:  # its name already went out; a client cannot take it back
            logger.warning("tool call %d turned out malformed while streaming", event.tool_index)
    return StreamingParseResult("".join(texts), items)


def _append_fragment(items: list[ToolCallItem], event: ArgsEvent) -> None:
    last = items[-1] if items else None
    if last is not None and last.tool_index == event.tool_index and last.name is None:
        last.parameters += event.fragment
    else:
        items.append(ToolCallItem(event.tool_index, None, event.fragment))
