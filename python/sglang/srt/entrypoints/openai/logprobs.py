"""meta_info logprob lists -> the OpenAI completion and chat logprob shapes.

meta_info entries are `(logprob, token_id, text | None)`; top-logprob entries are
per position a list of such triples (or None). The first prompt token has no
logprob (None).
"""

from __future__ import annotations

from typing import Any

from sglang.srt.entrypoints.openai.protocol import (
    ChatLogProbs,
    ChatTokenLogprob,
    CompletionLogProbs,
    TopLogprob,
)

Entry = tuple  # (logprob | None, token_id, text | None)


def token_text(entry: Entry, tokenizer: Any) -> str:
    if len(entry) > 2 and entry[2] is not None:
        return entry[2]
    if tokenizer is None:
        return str(entry[1])
    return tokenizer.decode([entry[1]])


def _top_dict(entries: list[Entry] | None, tokenizer: Any) -> dict[str, float] | None:
    if entries is None:
        return None
    return {token_text(e, tokenizer): e[0] for e in entries}


def completion_logprobs(
    token_entries: list[Entry],
    top_entries: list[list[Entry] | None] | None,
    tokenizer: Any,
    text_offset: int = 0,
) -> CompletionLogProbs:
    """The legacy completions shape; `text_offset` is where the first token starts."""
    out = CompletionLogProbs()
    offset = text_offset
    for pos, entry in enumerate(token_entries):
        text = token_text(entry, tokenizer)
        out.tokens.append(text)
        out.token_logprobs.append(entry[0])
        out.text_offset.append(offset)
        offset += len(text)
        top = top_entries[pos] if top_entries is not None and pos < len(top_entries) else None
        out.top_logprobs.append(_top_dict(top, tokenizer))
    return out


def merge_completion_logprobs(first: CompletionLogProbs, second: CompletionLogProbs) -> None:
    """Append `second` to `first` in place (echoed prompt, then the completion)."""
    first.tokens.extend(second.tokens)
    first.token_logprobs.extend(second.token_logprobs)
    first.text_offset.extend(second.text_offset)
    first.top_logprobs.extend(second.top_logprobs)


def _chat_top(entry: Entry, tokenizer: Any) -> TopLogprob:
    text = token_text(entry, tokenizer)
    return TopLogprob(token=text, logprob=entry[0], bytes=list(text.encode("utf-8")))


def chat_logprobs(
    token_entries: list[Entry],
    top_entries: list[list[Entry] | None] | None,
    tokenizer: Any,
) -> ChatLogProbs:
    content = []
    for pos, entry in enumerate(token_entries):
        top = top_entries[pos] if top_entries is not None and pos < len(top_entries) else None
        head = _chat_top(entry, tokenizer)
        tops = [_chat_top(e, tokenizer) for e in top or []]
        content.append(ChatTokenLogprob(**head.model_dump(), top_logprobs=tops))
    return ChatLogProbs(content=content)


def output_slices(meta: dict[str, Any], start: int) -> tuple[list[Entry], list | None]:
    """Output logprob entries from position `start` on (for stream deltas)."""
    tokens = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs")
    return tokens[start:], (tops[start:] if tops is not None else None)
