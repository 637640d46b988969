"""Detokenization: token ids -> incremental text, stop strings trimmed.

`IncrementalDetokenizer` is the pure part (no I/O); `BatchDetokenizer` turns a
BatchTokenIDOutput into a BatchStrOutput, failing one request at a time;
`DetokenizerManager` runs it as a process between the schedulers and the
TokenizerManager (detokenizer_mode process), or the TokenizerManager runs a
BatchDetokenizer itself (inline).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.managers.fault_injection import FaultInjector
from sglang.srt.managers.io_struct import (
    BatchStrOutput,
    BatchTokenIDOutput,
    DecodeParams,
    TokenizerHandoff,
)
from sglang.srt.managers.request_errors import internal_error_reason

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
IDLE_STEP_MS = 200  # an idle detokenizer process still steps (and stamps its clock) this often


@dataclass
class DecodeState:
    """One request's decoding progress.

    ids[:surr_offset]            decoded and emitted, used as context
    ids[surr_offset:read_offset] decoded and emitted; re-decoded as context
    ids[read_offset:]            not yet decoded into `text`
    text[:sent_len]              already sent to the TokenizerManager

    With a clean-up pass, the splice builds `raw` (the decode without the pass) and
    text = clean_text + the settled part of clean(raw[clean_pos:]), where
    clean_text = clean(raw[:clean_pos]) (see `cleanup_cut`).
    """

    params: DecodeParams
    ids: list[int] = field(default_factory=list)
    surr_offset: int = 0
    read_offset: int = 0
    text: str = ""
    sent_len: int = 0
    raw: str = ""
    clean_pos: int = 0
    clean_text: str = ""


def find_stop(
    text: str, stop_strs: Sequence[str], ends_after: int = 0
) -> tuple[int, str] | None:
    """The earliest occurrence of any stop string that ends past text[:ends_after]
    (one the newest characters completed): (index, stop string)."""
    best: tuple[int, str] | None = None
    for stop in stop_strs:
        idx = text.find(stop, max(0, ends_after - len(stop) + 1))
        if idx >= 0 and (best is None or idx < best[0]):
            best = (idx, stop)
    return best


# Tokens decoded in front of a stop string's own (see stop_window_tokens).
STOP_WINDOW_MARGIN = 4
# Tokens decoded to find where a stop token's text starts (the token, and context
# for a leading space or a character it completes).
STOP_TOKEN_WINDOW = 1 + STOP_WINDOW_MARGIN


# How many tokens that decode to nothing a stop window reaches over, at most, beyond
# its own `window` counted tokens.
MAX_STOP_WINDOW_SILENT_TOKENS = 1024


def stop_window_tokens(stop_strs: Sequence[str]) -> int:
    """Output tokens whose decode must contain any stop string the last token completed.

    A token decodes to at least one byte, so a stop of b UTF-8 bytes spans at
    most b tokens; the margin gives its first token the context it decodes in.
    Tokens that decode to nothing are not counted: see stop_window_start."""
    return max(len(s.encode("utf-8")) for s in stop_strs) + STOP_WINDOW_MARGIN


def stop_window_start(
    ids: Sequence[int], window: int, silent: Container[int], byte_ids: Container[int] = ()
) -> int:
    """Where in `ids` the stop window of `window` tokens begins, leaving out of the
    count the `silent` ones (special tokens, which a skip_special_tokens decode
    drops: a stop may span a run of them), at most MAX_STOP_WINDOW_SILENT_TOKENS of
    them (a stop of up to 1024 characters needs up to 4,100 counted tokens). A
    window never starts inside a run of `byte_ids` (byte_fallback_ids): decoded from
    its middle, a run can read as characters the whole text does not hold."""
    start, counted = len(ids), 0
    floor = max(0, len(ids) - window - MAX_STOP_WINDOW_SILENT_TOKENS)
    while start > floor and counted < window:
        start -= 1
        counted += ids[start] not in silent
    if start < len(ids) and ids[start] in byte_ids:
        while start > 0 and ids[start - 1] in byte_ids:
            start -= 1
    return start


def stop_window(
    ids: Sequence[int],
    stop_strs: Sequence[str],
    silent: Container[int],
    byte_ids: Container[int] = (),
) -> list[int]:
    """The last tokens of `ids` whose decode holds any stop the last token completed
    (stop_window_tokens of them, not counting the `silent` ones)."""
    start = stop_window_start(ids, stop_window_tokens(stop_strs), silent, byte_ids)
    return list(ids[start:])


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_fallback_ids(tokenizer: Any) -> frozenset[int]:
    """The `<0x..>` byte tokens of a SentencePiece-style tokenizer with byte fallback
    (Llama 2, Mistral, Gemma). Its decoder turns a run of them that is not valid UTF-8 as
    a whole into one U+FFFD per byte, a character completed earlier in the run included:
    the text of a run is known only once the run ends. Empty for other tokenizers."""
    if tokenizer is None or not callable(getattr(tokenizer, "get_vocab", None)):
        return frozenset()
    ids = frozenset(i for token, i in tokenizer.get_vocab().items() if _BYTE_TOKEN.fullmatch(token))
    return ids if len(ids) == 256 else frozenset()


def token_piece_text(tokenizer: Any, token_id: int) -> str:
    """One token's text as it reads inside a text: decode([id]), with the leading space
    a SentencePiece piece (`▁w`) stands for, which decoding it alone drops."""
    text = tokenizer.decode([token_id])
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    piece = convert(token_id) if convert is not None else None
    if isinstance(piece, str) and piece.startswith("▁") and not text.startswith(" "):
        return " " + text
    return text


def drops_first_space(tokenizer: Any) -> bool:
    """Whether decoding drops the leading space of a text's first `▁` piece (Llama's and
    Mistral's decoders strip one; Gemma's keeps it)."""
    vocab = tokenizer.get_vocab() if callable(getattr(tokenizer, "get_vocab", None)) else {}
    piece = next((p for p in vocab if p.startswith("▁") and p[1:2].isalpha()), None)
    return piece is not None and not tokenizer.decode([vocab[piece]]).startswith(" ")


def silent_token_ids(tokenizer: Any) -> frozenset[int]:
    """The special tokens a skip_special_tokens decode turns into no text (the
    added tokens marked special too: `all_special_ids` leaves out e.g. <|im_start|>)."""
    if tokenizer is None:
        return frozenset()
    candidates = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    candidates.update(i for i, token in added.items() if getattr(token, "special", False))
    return frozenset(
        i for i in candidates if tokenizer.decode([i], skip_special_tokens=True) == ""
    )


def _is_token_id(matched: Any) -> bool:
    return isinstance(matched, int) and not isinstance(matched, bool)


def last_token_start(decode: Callable[[list[int]], str], ids: Sequence[int], window: int) -> int:
    """How many characters of decode(ids[-window:]) come before the last token's: the
    window decoded without its last token, less an incomplete character that the last
    token completes (its text is the last token's too)."""
    if len(ids) <= 1:
        return 0
    before = decode(list(ids[-window:-1]))
    if before.endswith(REPLACEMENT_CHAR) and decode(list(ids[-window:])).startswith(before):
        return len(before)  # the U+FFFD stays: a byte the last token did not complete
    return len(trim_incomplete_utf8(before))


def trim_incomplete_utf8(text: str) -> str:
    """`text` without the U+FFFD run that an incomplete trailing character decodes to."""
    return text.rstrip(REPLACEMENT_CHAR)


def partial_stop_len(text: str, stop_strs: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stop_strs:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def cleanup_hold(text: str) -> int:
    """Where the part of a text a clean-up pass may still rewrite starts: the first space
    among its last 6 characters (the pass's patterns start with a space and are at most 4
    characters; a later character can undo a match before it, " ' " + "." is "'." but
    " ' ." is " '.", so the hold reaches past one pattern). Fuzzed over random strings
    of the patterns' characters in test_detokenizer_sentencepiece."""
    for i in range(max(0, len(text) - _CLEANUP_HOLD_CHARS), len(text)):
        if text[i] == " ":
            return i
    return len(text)


_CLEANUP_HOLD_CHARS = 6


def cleaned_tail(raw_tail: str, clean: Callable[[str], str]) -> str:
    """What of clean(raw_tail) no later character changes: the pass over the text before
    the hold, where the whole tail's pass starts with it."""
    settled = clean(raw_tail[: cleanup_hold(raw_tail)])
    return settled if clean(raw_tail).startswith(settled) else ""


def cleanup_cut(raw: str, start: int) -> int:
    """The furthest split point p > start near the end of `raw` with
    clean(raw[start:]) == clean(raw[start:p]) + clean(raw[p:]), else start. Every
    pattern of the pass is a space and then non-spaces (" ' " ends in one too), and the
    pass only deletes spaces; a match across p leaves on its left a space, or a space
    and a proper prefix of the pattern's rest: its last character is in _SPAN_ENDS, at
    every stage (the last character of raw[:p], when no space, is never deleted); and
    with no space among the (up to 3) characters before p, none can start before p."""
    for p in range(len(raw), max(start, len(raw) - _CUT_SEARCH_CHARS), -1):
        if raw[p - 1] not in _SPAN_ENDS or " " not in raw[max(start, p - 3) : p]:
            return p
    return start


_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
# how the left part of a match across a split can end: a space, or a pattern's
# character that is neither its first nor its last (" 've" -> "'", "v")
_SPAN_ENDS = frozenset(" ") | {p[i] for p in _CLEANUP_PATTERNS for i in range(1, len(p) - 1)}
_CUT_SEARCH_CHARS = 8  # a text without such a point near its end keeps one tail


_STANDARD_CLEANUP = "PreTrainedTokenizerBase.clean_up_tokenization"
_CLEANUP_PROBE = "a , b . c ? d ! e ' s f n't g 're"


def decode_cleans_up(tokenizer: Any) -> bool:
    """Whether `tokenizer.decode` runs transformers' clean-up pass (" ." -> "."). The flag
    alone does not say: transformers 5 skips the pass for BPE models (Llama 3 sets the
    flag), so a probe text decoded both ways decides; the flag where the probe's tokens
    decode to no pattern of the pass."""
    if tokenizer is None or not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    ids = tokenizer.encode(_CLEANUP_PROBE, add_special_tokens=False)
    raw = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    cleaned = tokenizer.clean_up_tokenization(raw)
    if cleaned == raw:
        return True
    return tokenizer.decode(ids) == cleaned


def splices_cleanup(tokenizer: Any) -> bool:
    """Whether the pass is transformers' own (the patterns `cleanup_cut` knows)."""
    method = getattr(type(tokenizer), "clean_up_tokenization", None)
    return getattr(method, "__qualname__", "") == _STANDARD_CLEANUP


def raw_rust_decoder(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` behind a fast HF tokenizer: batch_decode's text without
    the clean-up pass (spaces_between_special_tokens only applies to slow tokenizers)."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is None or not callable(getattr(rust, "decode", None)):
        return None
    return rust


def rust_decoder(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` behind a fast HF tokenizer when decoding through it gives
    batch_decode's text (its decode runs no clean-up pass), else None. transformers'
    decode adds ~10 us of Python per sequence (to_py_obj, kwargs, list building): a
    third of the HTTP process's time per streamed token at concurrency 1."""
    return None if decode_cleans_up(tokenizer) else raw_rust_decoder(tokenizer)


class IncrementalDetokenizer:
    """Turns per-request token streams into text deltas (UTF-8 safe)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}
        self.silent_ids = silent_token_ids(tokenizer)
        self.byte_ids = byte_fallback_ids(tokenizer)
        # a clean-up pass (" ." -> ".") may drop a space the next token follows
        self._cleans_up = decode_cleans_up(tokenizer)
        self._splices_cleanup = self._cleans_up and splices_cleanup(tokenizer)
        self._rust_raw = raw_rust_decoder(tokenizer)
        self._rust = None if self._cleans_up else self._rust_raw

    def _decode_many(
        self, seqs: list[list[int]], params: list[DecodeParams], raw: bool = False
    ) -> list[str]:
        """batch_decode, one call per distinct (skip_special, spaces_between) pair;
        `raw`: without the tokenizer's clean-up pass."""
        if self.tokenizer is None:  # skip_tokenizer_init: ids only
            return [""] * len(seqs)
        rust = self._rust_raw if raw else self._rust
        if rust is not None:  # what batch_decode returns, without its Python layers
            return [
                rust.decode(ids, skip_special_tokens=p.skip_special_tokens)
                for ids, p in zip(seqs, params)
            ]
        no_cleanup = {"clean_up_tokenization_spaces": False} if raw else {}
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i, p in enumerate(params):
            key = (p.skip_special_tokens, p.spaces_between_special_tokens)
            groups.setdefault(key, []).append(i)
        out = [""] * len(seqs)
        for (skip, spaces), idxs in groups.items():
            texts = self.tokenizer.batch_decode(
                [seqs[i] for i in idxs],
                skip_special_tokens=skip,
                spaces_between_special_tokens=spaces,
                **no_cleanup,
            )
            for i, text in zip(idxs, texts):
                out[i] = text
        return out

    def step(
        self,
        rids: list[str],
        new_ids: list[list[int]],
        finished: list[dict[str, Any] | None],
        params: list[DecodeParams | None],
    ) -> list[str]:
        """Absorb new tokens; returns the text delta to send for each request."""
        states = [self._state(r, p) for r, p in zip(rids, params)]
        for state, ids in zip(states, new_ids):
            state.ids.extend(ids)
        self._advance_streaming(
            [s for s, f in zip(states, finished) if f is None and s.params.stream]
        )
        self._decode_finished([s for s, f in zip(states, finished) if f is not None])
        deltas = [self._take_delta(s, f) for s, f in zip(states, finished)]
        for rid, fin in zip(rids, finished):
            if fin is not None:
                self.states.pop(rid, None)
        return deltas

    def snapshot(self, rids: list[str]) -> dict[str, tuple | None]:
        """O(1) per request: what `restore` needs to undo a failed `step`."""
        out: dict[str, tuple | None] = {}
        for rid in rids:
            st = self.states.get(rid)
            out[rid] = (
                None
                if st is None
                else (st, len(st.ids), st.surr_offset, st.read_offset, st.text, st.sent_len,
                      st.raw, st.clean_pos, st.clean_text)  # fmt: skip
            )
        return out

    def restore(self, saved: dict[str, tuple | None]) -> None:
        for rid, snap in saved.items():
            if snap is None:
                self.states.pop(rid, None)
                continue
            st, num_ids, st.surr_offset, st.read_offset, st.text, st.sent_len = snap[:6]
            st.raw, st.clean_pos, st.clean_text = snap[6:]
            del st.ids[num_ids:]
            self.states[rid] = st

    def _state(self, rid: str, params: DecodeParams | None) -> DecodeState:
        state = self.states.get(rid)
        if state is None:
            state = DecodeState(params=params or DecodeParams())
            self.states[rid] = state
        return state

    def _advance_streaming(self, states: list[DecodeState]) -> None:
        if not states:
            return
        if self._cleans_up and not self._splices_cleanup:
            self._advance_cleaned_whole(states)
            return
        pieces = self._splice(states, raw=self._cleans_up)
        for state, piece in zip(states, pieces):
            if piece is None:
                continue
            if self._cleans_up:
                state.raw += piece
                self._advance_cleaned(state)
            else:
                state.text += piece

    def _splice(self, states: list[DecodeState], raw: bool) -> list[str | None]:
        """The text each state's new tokens add, None where it may still change.
        Region [surr_offset, read_offset) is re-decoded so that token-boundary effects
        (leading-space handling, split UTF-8) are resolved in context."""
        params = [s.params for s in states]
        surr = [s.ids[s.surr_offset : s.read_offset] for s in states]
        full = [s.ids[s.surr_offset :] for s in states]
        texts = self._decode_many(surr + full, params + params, raw=raw)
        pieces: list[str | None] = []
        for i, state in enumerate(states):
            surr_text, new_text = texts[i], texts[len(states) + i]
            if self._unsettled(state, surr_text, new_text):
                pieces.append(None)  # hold back until later tokens settle it
                continue
            pieces.append(new_text[len(surr_text) :])
            state.surr_offset, state.read_offset = state.read_offset, len(state.ids)
        return pieces

    def _unsettled(self, state: DecodeState, surr_text: str, new_text: str) -> bool:
        """Whether the text the new tokens decode to may still change with later ones:
        an incomplete UTF-8 character, nothing new, a run of byte tokens not ended yet;
        or the context read differently (its text is sent already)."""
        return (
            new_text.endswith(REPLACEMENT_CHAR)
            or len(new_text) <= len(surr_text)
            or not new_text.startswith(surr_text)
            or state.ids[-1] in self.byte_ids
        )

    def _advance_cleaned(self, state: DecodeState) -> None:
        """A clean-up pass (" ." -> ".", " ' " -> "'") rewrites text across token
        boundaries: the pass runs over the raw text from the last split point that it
        cannot cross, and the result is kept up to where later text may still change it."""
        clean = self.tokenizer.clean_up_tokenization
        cut = cleanup_cut(state.raw, state.clean_pos)
        if cut > state.clean_pos:
            state.clean_text += clean(state.raw[state.clean_pos : cut])
            state.clean_pos = cut
        settled = state.clean_text + cleaned_tail(state.raw[state.clean_pos :], clean)
        if len(settled) > len(state.text) and settled.startswith(state.text):
            state.text = settled

    def _advance_cleaned_whole(self, states: list[DecodeState]) -> None:
        """A tokenizer with its own clean-up pass: the whole output is decoded, and its
        text is kept up to where later text may still change it (O(tokens) a step)."""
        texts = self._decode_many([s.ids for s in states], [s.params for s in states])
        for state, text in zip(states, texts):
            if state.ids and state.ids[-1] in self.byte_ids:
                continue
            text = trim_incomplete_utf8(text)
            settled = text[: cleanup_hold(text)]
            if len(settled) > len(state.text) and settled.startswith(state.text):
                state.text = settled

    def _decode_finished(self, states: list[DecodeState]) -> None:
        if not states:
            return
        texts = self._decode_many([s.ids for s in states], [s.params for s in states])
        for state, text in zip(states, texts):
            state.text = text

    def _take_delta(self, state: DecodeState, finished: dict[str, Any] | None) -> str:
        """The text not sent yet. Text is trimmed at a stop string only when the
        scheduler finished the request on it; a running stream holds back a tail that
        may grow into a stop. A stop the scheduler let pass (inside min_new_tokens) is
        text like any other. A request finished by a stop token (EOS, stop_token_ids)
        leaves that token's text out, as SGLang and vLLM do (kept with no_stop_trim)."""
        text, stops = state.text, state.params.stop_strs
        end = len(text)
        matched = finished.get("matched") if finished is not None else None
        if isinstance(matched, str) and matched:
            idx = self._stop_index(state, matched)
            if idx is not None:
                end = idx + len(matched) if state.params.no_stop_trim else idx
        elif _is_token_id(matched) and not state.params.no_stop_trim and self._cleans_up:
            # the pass may merge the stop token's text into the text before it ("? ' s"
            # -> "?'s"): the text is the decode without it, whole
            state.text = self._decode_many([state.ids[:-1]], [state.params])[0]
            end = len(state.text)
        elif _is_token_id(matched) and not state.params.no_stop_trim:
            end = self._last_token_start(state)  # a stop token's text is left out
        elif stops and finished is None:
            end -= partial_stop_len(text, stops)
        if end <= state.sent_len:
            return ""
        delta = state.text[state.sent_len : end]
        state.sent_len = end
        return delta

    def _last_token_start(self, state: DecodeState) -> int:
        """Where in state.text the last token's text starts."""

        def decode(ids: list[int]) -> str:
            return self._decode_many([ids], [state.params])[0]

        ids, window = state.ids, STOP_TOKEN_WINDOW
        # A window that starts inside a character decodes it to U+FFFD: widen it to a
        # clean start. Its text then ends state.text, and how it starts (a dropped
        # leading space) is the same with and without the last token, so it cancels.
        while window < len(ids) and decode(ids[-window:-1]).startswith(REPLACEMENT_CHAR):
            window *= 2
        last_len = len(decode(ids[-window:])) - last_token_start(decode, ids, window)
        return min(len(state.text), max(0, len(state.text) - last_len))

    def _stop_index(self, state: DecodeState, stop: str) -> int | None:
        """Where in state.text the stop the last token completed starts (the scheduler
        checks every token, so it is the first one ending in the last token's text)."""

        def decode(ids: list[int]) -> str:
            return self._decode_many([ids], [state.params])[0]

        silent = self.silent_ids if state.params.skip_special_tokens else ()
        tail = stop_window(state.ids, [stop], silent, self.byte_ids)
        offset = len(state.text) - len(decode(tail))  # the window ends text
        hit = find_stop(state.text, [stop], offset + last_token_start(decode, tail, len(tail)))
        if hit is None:
            # a stop ending before the last token's text: one with a U+FFFD, which the
            # scheduler matches once a later token shows it is not an unfinished
            # character; it took the window's first
            idx = state.text.find(stop, max(offset, 0))
            if idx < 0:  # the window decoded apart from the whole text: the last one
                idx = state.text.rfind(stop)
            return idx if idx >= 0 else None
        return hit[0]


class BatchDetokenizer:
    """BatchTokenIDOutput -> BatchStrOutput: the detokenizer process's work, also run
    inside the TokenizerManager with detokenizer_mode inline.

    A batch whose decoding raises is decoded again one request at a time; a
    request that still fails ends with an `abort` finish carrying status 500 and
    `origin: detokenizer` (the TokenizerManager then aborts it in the scheduler),
    and its later outputs are passed through undecoded until its finish arrives.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.fault_injector = FaultInjector.from_env()
        self.failed_rids: set[str] = set()

    def handle(self, msg: BatchTokenIDOutput) -> BatchStrOutput:
        live = [i for i, rid in enumerate(msg.rids) if rid not in self.failed_rids]
        reasons = list(msg.finished_reasons)
        deltas = [""] * len(msg.rids)
        saved = self.detok.snapshot([msg.rids[i] for i in live])
        try:
            for i, delta in zip(live, self._step(msg, live)):
                deltas[i] = delta
        except Exception:
            logger.exception("detokenizing a batch failed; retrying request by request")
            self.detok.restore(saved)
            for i in live:
                deltas[i], reasons[i] = self._step_one(msg, i)
        self._forget_finished(msg)
        out = BatchStrOutput.from_token_output(msg, deltas)
        out.finished_reasons = reasons
        return out

    def _step(self, msg: BatchTokenIDOutput, idx: list[int]) -> list[str]:
        rids = [msg.rids[i] for i in idx]
        self.fault_injector.check("detokenize", rids)
        return self.detok.step(
            rids,
            [msg.new_output_ids[i] for i in idx],
            [msg.finished_reasons[i] for i in idx],
            [msg.decode_params[i] for i in idx],
        )

    def _step_one(self, msg: BatchTokenIDOutput, i: int) -> tuple[str, dict[str, Any] | None]:
        rid = msg.rids[i]
        try:
            return self._step(msg, [i])[0], msg.finished_reasons[i]
        except Exception as exc:
            logger.error("request %s: detokenizing failed: %s: %s", rid, type(exc).__name__, exc)
            self.detok.states.pop(rid, None)
            if msg.finished_reasons[i] is None:
                self.failed_rids.add(rid)
            return "", _detokenizer_error(exc)

    def _forget_finished(self, msg: BatchTokenIDOutput) -> None:
        for rid, reason in zip(msg.rids, msg.finished_reasons):
            if reason is not None:
                self.failed_rids.discard(rid)


class DetokenizerManager(BatchDetokenizer):
    """The detokenizer process (detokenizer_mode process): receives BatchTokenIDOutput
    from the schedulers, sends BatchStrOutput (and every other message as it came) to
    the TokenizerManager."""

    def __init__(self, tokenizer: Any, recv_from_scheduler: Any, send_to_tokenizer: Any):
        super().__init__(tokenizer)
        self.recv_from_scheduler = recv_from_scheduler
        self.send_to_tokenizer = send_to_tokenizer

    def event_loop(self, clock: Any = None) -> None:
        """Relay forever; `clock` (a ForwardClock shared with the launcher) is stamped at
        each step, at least every IDLE_STEP_MS, so a frozen detokenizer (SIGSTOP, a
        deadlock) is seen and killed rather than holding every request."""
        while True:
            if clock is not None:
                clock.step()
            msg = self.recv_from_scheduler.recv(timeout_ms=IDLE_STEP_MS)
            if msg is None:
                continue
            if isinstance(msg, BatchTokenIDOutput):
                self.send_to_tokenizer.send(self.handle(msg))
            elif isinstance(msg, TokenizerHandoff):  # another DP rank's copy
                continue
            else:
                self.send_to_tokenizer.send(msg)


def _detokenizer_error(exc: BaseException) -> dict[str, Any]:
    reason = internal_error_reason(exc)
    reason["origin"] = "detokenizer"
    return reason


def run_detokenizer_process(
    server_args: Any, port_args: Any, clock: Any, ready_writer: Any
) -> None:
    """Process entry: publish, take the scheduler's tokenizer, report ready, loop forever
    stamping `clock` (None: no hang watch)."""
    from sglang.srt.managers.process_entry import run_child

    run_child("detokenizer", server_args, ready_writer, lambda: _build(port_args, clock))


def _build(port_args: Any, clock: Any = None):
    import zmq

    from sglang.srt.managers.ipc import PullEndpoint, PushEndpoint

    ctx = zmq.Context(1)  # one I/O thread: two sockets, 2 cores to share
    recv_from_scheduler = PullEndpoint(ctx, port_args.detokenizer_ipc_name)
    manager = DetokenizerManager(
        _await_tokenizer(recv_from_scheduler),
        recv_from_scheduler,
        PushEndpoint(ctx, port_args.tokenizer_ipc_name),
    )
    return {}, lambda: manager.event_loop(clock)


def _await_tokenizer(recv_from_scheduler: Any) -> Any:
    """The tokenizer the scheduler sends before any output (blocks until it comes).

    This process does not import torch: loading with AutoTokenizer would (through
    transformers' config classes), so it unpickles the scheduler's instead.
    """
    msg = recv_from_scheduler.recv()
    assert isinstance(msg, TokenizerHandoff), f"expected TokenizerHandoff first, got {msg!r}"
    return msg.tokenizer
