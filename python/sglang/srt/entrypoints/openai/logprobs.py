"""meta_info logprob lists -> the OpenAI completion and chat logprob shapes.

meta_info entries are `(logprob, token_id, text | None)`; top-logprob entries are
per position a list of such triples (or None). The first prompt token has no
logprob (None).
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Container
from typing import Any

from sglang.srt.entrypoints.openai.protocol import (
    ChatLogProbs,
    ChatTokenLogprob,
    CompletionLogProbs,
    TopLogprob,
)
from sglang.srt.managers.detokenizer_manager import token_piece_text

Entry = tuple  # (logprob | None, token_id, text | None)


def token_text(entry: Entry, tokenizer: Any) -> str:
    if len(entry) > 2 and entry[2] is not None:
        return entry[2]
    if tokenizer is None:
        return str(entry[1])
    return token_piece_text(tokenizer, entry[1])


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


@functools.lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> the byte it spells: printable
    bytes stand for themselves, the other 68 for 256 + their rank."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(256 + rank): b for rank, b in enumerate(others)})
    return table


@functools.lru_cache(maxsize=8)
def _is_byte_level(tokenizer: Any) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return "ByteLevel" in repr(decoder)  # a ByteLevel decoder, alone or in a Sequence


@functools.lru_cache(maxsize=1 << 16)
def raw_token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for where its vocabulary entry spells them (a byte-level
    BPE piece, a byte-fallback "<0xE9>"); None elsewhere. A token holding part of a
    UTF-8 character decodes to U+FFFD: only these bytes tell such tokens apart."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    piece = convert(token_id) if convert is not None else None
    if not isinstance(piece, str):
        return None
    byte = _BYTE_FALLBACK.fullmatch(piece)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    if _is_byte_level(tokenizer):
        alphabet = _byte_level_alphabet()
        if all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
    return None


def token_bytes(entry: Entry, tokenizer: Any) -> bytes:
    """The token's UTF-8 bytes: its raw bytes where its text lost them (U+FFFD)."""
    text = token_text(entry, tokenizer)
    if "\ufffd" in text and tokenizer is not None:
        raw = raw_token_bytes(tokenizer, entry[1])
        if raw is not None:
            return raw
    return text.encode("utf-8")


def completion_token(entry: Entry, tokenizer: Any) -> str:
    """A token as the legacy completions API names it: its text, or for part of a
    UTF-8 character "bytes:\\xNN..." (as OpenAI does), so such tokens stay apart."""
    text = token_text(entry, tokenizer)
    if "\ufffd" not in text:
        return text
    raw = token_bytes(entry, tokenizer)
    if raw == text.encode("utf-8"):
        return text
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _top_dict(entries: list[Entry] | None, tokenizer: Any) -> dict[str, float] | None:
    """Best first; where two tokens still share a name, the better logprob stays."""
    if entries is None:
        return None
    top: dict[str, float] = {}
    for entry in entries:
        top.setdefault(completion_token(entry, tokenizer), entry[0])
    return top


class TextOffsets:
    """Where each token's text starts in a choice's text, token after token (a stream
    keeps one across its chunks). A token holding part of a UTF-8 character adds nothing
    until the token that completes it adds the whole character, as the text grows."""

    def __init__(
        self,
        start: int = 0,
        skipped: Container[int] = (),
        first_space_dropped: bool = False,
        num_silent_first: int = 0,
    ) -> None:
        """`skipped`: token ids the text leaves out (special tokens under
        skip_special_tokens); `first_space_dropped`: the decode drops the first token's
        leading space (a SentencePiece tokenizer that strips the `▁` it starts with);
        `num_silent_first`: the first tokens have no text (the BOS a tokenizer adds to
        a text prompt that is echoed as the client sent it)."""
        self.offset = start
        self.skipped = skipped
        self._drop_space = first_space_dropped
        self._num_silent = num_silent_first
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def take(self, entry: Entry, tokenizer: Any) -> int:
        """`entry`'s offset; the next one moves past the characters it completes."""
        if self._num_silent > 0:
            self._num_silent -= 1
            return self.offset
        if tokenizer is None or entry[1] in self.skipped:  # no text of its own
            return self.offset
        pending = self._decoder.getstate()[0]  # an earlier token's unfinished character
        data = token_bytes(entry, tokenizer)
        if self._drop_space:
            self._drop_space = False
            data = data.removeprefix(b" ")
        here = self.offset + (_orphaned_chars(pending, data) if pending else 0)
        self.offset += len(self._decoder.decode(data))
        return here


def _orphaned_chars(pending: bytes, data: bytes) -> int:
    """How many U+FFFD the `pending` bytes (the valid start of a character) leave in the
    text when `data`, the next token's bytes, does not finish that character: they
    belong to the earlier token, and this token's text starts after them."""
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(pending + data)
    except UnicodeDecodeError as exc:
        if exc.start == 0:
            return len(pending.decode("utf-8", "replace"))
    return 0


def completion_logprobs(
    token_entries: list[Entry],
    top_entries: list[list[Entry] | None] | None,
    tokenizer: Any,
    offsets: TextOffsets | int = 0,
) -> CompletionLogProbs:
    """The legacy completions shape; `offsets` is where the first token starts (or the
    running offsets of a stream). Each position's top_logprobs holds the chosen token
    too, as OpenAI's and vLLM's (up to logprobs + 1 entries; the chosen one alone for
    logprobs 0; OpenAI's type is a dict)."""
    if isinstance(offsets, int):
        offsets = TextOffsets(offsets)
    out = CompletionLogProbs()
    for pos, entry in enumerate(token_entries):
        out.tokens.append(completion_token(entry, tokenizer))
        out.token_logprobs.append(entry[0])
        out.text_offset.append(offsets.take(entry, tokenizer))
        top = top_entries[pos] if top_entries is not None and pos < len(top_entries) else None
        if entry[0] is not None and (top_entries is None or top is not None):
            top = _with_chosen(top or [], entry)
        out.top_logprobs.append(_top_dict(top, tokenizer))
    return out


def _with_chosen(top: list[Entry], chosen: Entry) -> list[Entry]:
    """`top`, and after it the chosen token when it is not among them."""
    return top if any(e[1] == chosen[1] for e in top) else [*top, chosen]


def merge_completion_logprobs(first: CompletionLogProbs, second: CompletionLogProbs) -> None:
    """Append `second` to `first` in place (echoed prompt, then the completion)."""
    first.tokens.extend(second.tokens)
    first.token_logprobs.extend(second.token_logprobs)
    first.text_offset.extend(second.text_offset)
    first.top_logprobs.extend(second.top_logprobs)


def _chat_top(entry: Entry, tokenizer: Any) -> TopLogprob:
    text = token_text(entry, tokenizer)
    return TopLogprob(token=text, logprob=entry[0], bytes=list(token_bytes(entry, tokenizer)))


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
