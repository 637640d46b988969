"""What a tool-call detector returns, and the events its scanners produce.

A detector turns model output into normal text plus tool calls. Its scanner
(one per format) reads the text left to right and emits events; the same
events serve the whole-text parse and the streaming parse, so the two agree
on every chunking of well-formed output.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCallItem:
    """One call, or in streaming one piece of one call.

    `parameters` is the arguments JSON text (`json.dumps(args,
    ensure_ascii=False)`); in streaming it is the next fragment of that text,
    and the first item of a call carries `name` with `parameters == ""`.
    """

    tool_index: int
    name: str | None = None
    parameters: str = ""


@dataclass
class StreamingParseResult:
    normal_text: str = ""
    calls: list[ToolCallItem] = field(default_factory=list)


@dataclass(frozen=True)
class TextEvent:
    text: str


@dataclass(frozen=True)
class NameEvent:
    """A call to a known function has begun; its arguments follow."""

    tool_index: int
    name: str


@dataclass(frozen=True)
class ArgsEvent:
    tool_index: int
    fragment: str


@dataclass(frozen=True)
class FailedEvent:
    """A call that is not one: malformed, truncated, or an unknown function.

    `tool_index` is None when nothing of it was emitted (its `raw_text` is then
    plain normal text); otherwise a `NameEvent` already went out for it.
    """

    tool_index: int | None
    raw_text: str


@dataclass(frozen=True)
class FailedTailEvent:
    """The rest of the region of a call that failed after its `NameEvent` went out (its
    close, and for a format whose close cannot be part of a call, the broken call's
    text up to it): normal text in the whole-text parse, which shows the region as
    written; dropped in a stream, where the call already went out."""

    tool_index: int
    text: str


ScanEvent = TextEvent | NameEvent | ArgsEvent | FailedEvent | FailedTailEvent
