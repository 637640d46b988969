"""Split a reasoning model's output into reasoning_content and content.

Output shapes, by whether the chat template already opened the think block:

    not forced (qwen3):      "<think>\\nreasoning\\n</think>\\n\\ncontent"  or  "content"
    forced (deepseek-r1):    "reasoning\\n</think>\\n\\ncontent"  (a leading <think> is dropped)

Reasoning is stripped of surrounding whitespace and content of leading
whitespace after the end tag; content that is not preceded by reasoning is
kept verbatim. Output cut off before the end tag is all reasoning. Streaming
holds back only what may be part of a tag, and, inside reasoning, a trailing
run of whitespace (it is dropped if the end tag follows).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.parser.function_call.text_utils import partial_suffix_len


@dataclass(frozen=True)
class ReasoningFormat:
    start_tag: str
    end_tag: str
    force: bool  # the prompt already opened the think block


_THINK = ("<think>", "</think>")
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat(*_THINK, force=True),
    "deepseek-v3": ReasoningFormat(*_THINK, force=False),  # hybrid; request's `thinking`
    "glm45": ReasoningFormat(*_THINK, force=False),
    "kimi": ReasoningFormat("◁think▷", "◁/think▷", force=False),
    "qwen3": ReasoningFormat(*_THINK, force=False),  # hybrid; request's `enable_thinking`
    "qwen3-thinking": ReasoningFormat(*_THINK, force=True),
}
REASONING_PARSER_NAMES = tuple(REASONING_FORMATS)


def reasoning_format(model_type: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[model_type]
    except KeyError:
        choices = ", ".join(REASONING_PARSER_NAMES)
        raise ValueError(
            f"unknown reasoning parser {model_type!r}; choose one of: {choices}"
        ) from None


class ReasoningParser:
    """One instance per response; streaming state lives in it.

    `force_reasoning` overrides the format's default (False when a request
    turns thinking off); `stream_reasoning=False` sends the reasoning in one
    piece when it ends.
    """

    def __init__(
        self,
        model_type: str,
        stream_reasoning: bool = True,
        force_reasoning: bool | None = None,
    ) -> None:
        self._format = reasoning_format(model_type)
        self._force = self._format.force if force_reasoning is None else force_reasoning
        self._stream_reasoning = stream_reasoning
        self._state = _SplitState(self._format, self._force)
        self._unsent_reasoning = ""  # held while stream_reasoning is off

    def parse_non_stream(self, text: str) -> tuple[str | None, str]:
        """(reasoning_content or None when there is none, content)."""
        state = _SplitState(self._format, self._force)
        reasoning, content = state.feed(text)
        more_reasoning, more_content = state.finish()
        return (reasoning + more_reasoning) or None, content + more_content

    def parse_stream_chunk(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of output."""
        reasoning, content = self._state.feed(delta)
        return self._release(reasoning), content

    def finish(self) -> tuple[str, str]:
        """What was held back at the end of the output."""
        reasoning, content = self._state.finish()
        return self._release(reasoning, final=True), content

    def _release(self, reasoning: str, final: bool = False) -> str:
        if self._stream_reasoning:
            return reasoning
        self._unsent_reasoning += reasoning
        if not (final or self._state.phase == "content"):
            return ""
        whole, self._unsent_reasoning = self._unsent_reasoning, ""
        return whole


class _SplitState:
    """phase: "start" (may open with start_tag), "reasoning", "content"."""

    def __init__(self, fmt: ReasoningFormat, force: bool) -> None:
        self._fmt = fmt
        self._force = force
        self.phase = "start"
        self._buf = ""  # held back: a possible tag, or reasoning's trailing whitespace
        self._strip_leading = False  # drop whitespace until text that is not

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        if self.phase == "start":
            self._leave_start()
        if self.phase == "reasoning":
            return self._reasoning(), self._content()
        return "", self._content()

    def finish(self) -> tuple[str, str]:
        if self.phase == "start":  # only a possible start tag was held
            self._enter("reasoning" if self._force else "content", keep_leading=not self._force)
        if self.phase == "reasoning":  # cut off before the end tag: all of it is reasoning
            reasoning, self._buf = self._strip(self._buf).rstrip(), ""
            return reasoning, ""
        return "", self._content()

    def _leave_start(self) -> None:
        start_tag = self._fmt.start_tag
        stripped = self._buf.lstrip()
        if stripped.startswith(start_tag):
            self._buf = stripped[len(start_tag) :]
            self._enter("reasoning")
        elif not start_tag.startswith(stripped):
            self._enter("reasoning" if self._force else "content", keep_leading=not self._force)

    def _enter(self, phase: str, keep_leading: bool = False) -> None:
        self.phase = phase
        self._strip_leading = not keep_leading

    def _reasoning(self) -> str:
        end_tag = self._fmt.end_tag
        end = self._buf.find(end_tag)
        if end >= 0:
            reasoning = self._strip(self._buf[:end]).rstrip()
            self._buf = self._buf[end + len(end_tag) :]
            self._enter("content")
            return reasoning
        keep = partial_suffix_len(self._buf, end_tag)
        ready, tail = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        text = self._strip(ready)
        sure = text.rstrip()
        self._buf = text[len(sure) :] + tail
        return sure

    def _content(self) -> str:
        if self.phase != "content":
            return ""
        content, self._buf = self._strip(self._buf), ""
        return content

    def _strip(self, text: str) -> str:
        if self._strip_leading:
            text = text.lstrip()
            self._strip_leading = not text
        return text
