"""The shared scanner of the tool-call formats: normal text around call regions.

A format frames its calls as

    <bot_token> [open_token] call (separator call)* [close_token]

(Hermes: `<tool_call>` call `</tool_call>`; Mistral: `[TOOL_CALLS] [` calls
`]`; Llama 3: `<|python_tag|>` calls split by `;`; pythonic: `[` calls `]`).
Everything outside regions is normal text. Text goes out as soon as it cannot
be the start of `bot_token`; a region's syntax (tokens, brackets, separators,
spaces) is dropped once one of its calls is good. A call that is not one
(malformed, truncated, unknown function) is text: its own text, preceded by
the region's syntax so far while no call of the region was good. So a region
without a good call comes out verbatim, and so does a region whose opening
is not followed by a call.

A call that fails after its name went out (a stream has sent it) leaves the
rest of its region as `FailedTailEvent`s, which a stream drops: the region's
close, and, where the call broke off mid-text and the format's close cannot
be part of a call (`tail_to_close`: Hermes' `</tool_call>`), the broken call's
text up to that close (or the next `bot_token`, or the end of the output).

Scanner states:
    start  only for `bare_start` formats: the output may open with a call
    text   normal text, looking for bot_token
    open   after bot_token, expecting open_token
    first  expecting the first call (or an empty region's close_token)
    call   a call reader is reading
    sep    after a call: separator, close_token, or the region ends
    tail   the rest of a call that broke off after its name went out, up to close_token
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from sglang.srt.parser.function_call.core_types import (
    FailedEvent,
    FailedTailEvent,
    ScanEvent,
    TextEvent,
)
from sglang.srt.parser.function_call.text_utils import JSON_WHITESPACE, partial_suffix_len


class CallReader(Protocol):
    raw: str  # the text the reader has used
    done: bool  # the call's text is complete
    failed: bool  # the text cannot be a call; the character that showed it is not used

    def feed(self, text: str) -> tuple[list[ScanEvent], int]: ...

    def finalize(self, complete: bool, raw_text: str) -> tuple[list[ScanEvent], bool]: ...


@dataclass(frozen=True)
class RegionFormat:
    bot_token: str
    open_token: str | None
    separator: str | None
    close_token: str | None
    bare_start: bool  # the output may begin with a call and no bot_token (Llama 3)
    starts_call: Callable[[str], bool]  # whether a character opens a call
    new_reader: Callable[[frozenset[str], Iterator[int]], CallReader]
    # close_token cannot occur in a call's text outside a string: a call that broke off
    # mid-text ends at it
    tail_to_close: bool = False


class RegionScanner:
    """Turns output text, fed in pieces, into scan events (see core_types)."""

    def __init__(self, fmt: RegionFormat, names: frozenset[str]) -> None:
        self._fmt = fmt
        self._names = names
        self._indices = itertools.count()
        self._state = "start" if fmt.bare_start else "text"
        self._buf = ""  # text not yet consumed
        self._syntax = ""  # region syntax consumed and not yet settled
        self._region_ok = False  # a call of the current region was good
        self._seen_separator = False
        self._reader: CallReader | None = None
        self._failed_index: int | None = None  # a call of the region failed after its name

    def feed(self, text: str) -> list[ScanEvent]:
        self._buf += text
        events: list[ScanEvent] = []
        while self._buf and getattr(self, "_" + self._state)(events):
            pass
        return events

    def finish(self) -> list[ScanEvent]:
        """Settles what is held at the end of the output; the scanner is spent."""
        events: list[ScanEvent] = []
        if self._state == "call":
            shown = "" if self._region_ok else self._syntax
            events += self._reader.finalize(False, shown + self._reader.raw + self._buf)[0]
        elif self._state == "sep":
            self._end_region(events)
            if not self._cut_close(self._buf):
                _emit(events, self._buf)
        elif self._state == "tail":
            self._failed_tail(events, self._buf)
        else:
            _emit(events, self._syntax + self._buf)
        self._buf, self._syntax = "", ""
        return events

    def _cut_close(self, text: str) -> bool:
        """Whether `text`, left after a good call when the output ended, is the start of
        the region's close that max_tokens cut ("</tool_c"): the region's, not content."""
        stripped = text.strip(JSON_WHITESPACE)
        close = self._fmt.close_token
        return self._region_ok and bool(stripped) and close.startswith(stripped)

    def _start(self, events: list[ScanEvent]) -> bool:
        stripped = self._buf.lstrip(JSON_WHITESPACE)
        if not stripped:
            return False
        if self._fmt.starts_call(stripped[0]):
            self._syntax = self._buf[: len(self._buf) - len(stripped)]
            self._buf = stripped
            self._begin_call()
        else:
            self._state = "text"
        return True

    def _text(self, events: list[ScanEvent]) -> bool:
        bot = self._fmt.bot_token
        start = self._buf.find(bot)
        if start < 0:
            keep = partial_suffix_len(self._buf, bot)
            _emit(events, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        _emit(events, self._buf[:start])
        self._buf = self._buf[start + len(bot) :]
        self._syntax, self._region_ok = bot, False
        self._state = "open" if self._fmt.open_token else "first"
        return True

    def _open(self, events: list[ScanEvent]) -> bool:
        matched = self._take_token(self._fmt.open_token)
        if matched is None:
            return False
        if matched:
            self._state = "first"
        else:
            self._abandon_region(events)
        return True

    def _first(self, events: list[ScanEvent]) -> bool:
        self._take_whitespace()
        if not self._buf:
            return False
        if self._fmt.starts_call(self._buf[0]):
            self._begin_call()
            return True
        closed = self._take_token(self._fmt.close_token) if self._fmt.close_token else False
        if closed is None:
            return False
        if closed:  # an empty region, e.g. "[TOOL_CALLS] []"
            self._end_region(events)
        else:
            self._abandon_region(events)
        return True

    def _call(self, events: list[ScanEvent]) -> bool:
        reader = self._reader
        new_events, used = reader.feed(self._buf)
        events += new_events
        self._buf = self._buf[used:]
        if not (reader.done or reader.failed):
            return False
        shown = reader.raw if self._region_ok else self._syntax + reader.raw
        settled, ok = reader.finalize(reader.done, shown)
        events += settled
        self._syntax = ""
        self._region_ok = self._region_ok or ok
        self._reader = None
        self._note_failure(settled)
        if reader.done:
            self._state = "sep"
        elif self._failed_index is not None and self._fmt.tail_to_close:
            self._state = "tail"
        else:  # broke off mid-text: where its region ends is unknown, what follows is text
            self._state, self._failed_index = "text", None
        self._seen_separator = False
        return True

    def _note_failure(self, settled: list[ScanEvent]) -> None:
        """Remember a call that failed after its name went out: the rest of its region
        is its tail."""
        for event in settled:
            if isinstance(event, FailedEvent) and event.tool_index is not None:
                self._failed_index = event.tool_index

    def _tail(self, events: list[ScanEvent]) -> bool:
        ends = [self._buf.find(token) for token in (self._fmt.close_token, self._fmt.bot_token)]
        found = [end for end in ends if end >= 0]
        if not found:
            keep = max(partial_suffix_len(self._buf, self._fmt.close_token),
                       partial_suffix_len(self._buf, self._fmt.bot_token))  # fmt: skip
            self._failed_tail(events, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        end = min(found)
        if end == ends[0]:  # the close is the region's: the tail takes it
            end += len(self._fmt.close_token)
        self._failed_tail(events, self._buf[:end])
        self._buf = self._buf[end:]
        self._failed_index = None
        self._state = "text"
        return True

    def _failed_tail(self, events: list[ScanEvent], text: str) -> None:
        if text:
            events.append(FailedTailEvent(self._failed_index, text))

    def _sep(self, events: list[ScanEvent]) -> bool:
        self._take_whitespace()
        if not self._buf:
            return False
        separator = self._fmt.separator
        if separator and not self._seen_separator:
            matched = self._take_token(separator, skip_whitespace=False)
            if matched is None:
                return False
            if matched:
                self._seen_separator = True
                return True
        elif self._seen_separator and self._fmt.starts_call(self._buf[0]):
            self._begin_call()
            return True
        return self._sep_close(events)

    def _sep_close(self, events: list[ScanEvent]) -> bool:
        close = self._fmt.close_token
        matched = self._take_token(close, skip_whitespace=False) if close else False
        if matched is None:
            return False
        # not closed (llama3 has no close): the text goes on here, and the spacing taken
        # as the region's since its last call is that text's own (hermes's is text too)
        spacing = "" if matched or not self._region_ok else _trailing_space(self._syntax)
        self._end_region(events)
        _emit(events, spacing)
        return True

    def _begin_call(self) -> None:
        self._reader = self._fmt.new_reader(self._names, self._indices)
        self._state = "call"

    def _end_region(self, events: list[ScanEvent]) -> None:
        if self._failed_index is not None and not self._region_ok:
            self._failed_tail(events, self._syntax)
        elif not self._region_ok:
            _emit(events, self._syntax)
        self._syntax, self._failed_index = "", None
        self._state = "text"

    def _abandon_region(self, events: list[ScanEvent]) -> None:
        """The opening was not followed by a call: it was text."""
        _emit(events, self._syntax)
        self._syntax = ""
        self._state = "text"

    def _take_whitespace(self) -> None:
        stripped = self._buf.lstrip(JSON_WHITESPACE)
        self._syntax += self._buf[: len(self._buf) - len(stripped)]
        self._buf = stripped

    def _take_token(self, token: str, skip_whitespace: bool = True) -> bool | None:
        """Consume `token` at the start of the buffer: True, False (absent), None (undecided)."""
        if skip_whitespace:
            self._take_whitespace()
        if self._buf.startswith(token):
            self._syntax += token
            self._buf = self._buf[len(token) :]
            return True
        if token.startswith(self._buf):
            return None
        return False


def _trailing_space(text: str) -> str:
    return text[len(text.rstrip(JSON_WHITESPACE)) :]


def _emit(events: list[ScanEvent], text: str) -> None:
    if text:
        events.append(TextEvent(text))
