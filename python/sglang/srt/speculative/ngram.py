"""N-gram (prompt / output lookup) drafting.

The longest suffix of a request's tokens that occurred earlier predicts what
comes next: the tokens that followed its most recent earlier occurrence.

The search runs in C (`bytes.rfind`) over the tokens encoded 4 bytes each:
the first byte of a token, and no other, has its high bit set, so a match of
a pattern (which starts with a first byte) always starts on a token boundary.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import numpy as np

_TOKEN_BYTES = 4
_MAX_TOKEN_ID = (1 << 28) - 1  # 4 groups of 7 bits
_SMALL_APPEND = 16  # up to this many tokens are encoded in plain Python


def propose_ngram(
    tokens: Sequence[int], num_draft: int, min_window: int = 1, max_window: int = 12
) -> list[int]:
    """Up to `num_draft` tokens that followed the longest earlier match of a suffix.

    Suffix lengths min_window..max_window are tried; an earlier occurrence must
    end before the last token. Among occurrences of the longest matching
    length the most recent wins. [] when nothing matches or num_draft <= 0.
    Token ids must be in [0, 2**28).
    """
    if num_draft <= 0 or len(tokens) < 2:
        return []
    match_end = _match_end(_encode(tokens), min_window, max_window)
    if match_end < 0:
        return []
    return [int(t) for t in tokens[match_end : match_end + num_draft]]


class NgramIndex:
    """Incremental n-gram drafting for one request (prompt + output so far).

    `append` mutates the stored tokens (only ever add accepted tokens);
    `propose` reads them and equals `propose_ngram(all tokens, ...)`.
    """

    def __init__(self, tokens: Sequence[int] = (), min_window: int = 1, max_window: int = 12):
        self.min_window = min_window
        self.max_window = max_window
        self._tokens: list[int] = []
        self._encoded = bytearray()  # _TOKEN_BYTES per token of _tokens
        self.append(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def append(self, tokens: Sequence[int]) -> None:
        self._encoded += _encode(tokens)
        self._tokens.extend(int(t) for t in tokens)

    def propose(self, num_draft: int) -> list[int]:
        if num_draft <= 0:
            return []
        match_end = _match_end(self._encoded, self.min_window, self.max_window)
        if match_end < 0:
            return []
        return self._tokens[match_end : match_end + num_draft]


def _encode(tokens: Sequence[int]) -> bytes:
    """Each id as 4 bytes (little-endian 7-bit groups); the first byte gets the high bit."""
    if len(tokens) <= _SMALL_APPEND:  # a decode step's few tokens: numpy costs more
        return struct.pack(f"<{len(tokens)}I", *[_encode_id(int(t)) for t in tokens])
    ids = np.frombuffer(array("i", tokens), dtype=np.int32)
    if ids.min() < 0 or ids.max() > _MAX_TOKEN_ID:
        raise _id_error()
    encoded = (ids & 0x7F) | ((ids << 1) & 0x7F00) | ((ids << 2) & 0x7F0000)
    encoded |= ((ids << 3) & 0x7F000000) | 0x80
    return encoded.astype("<i4", copy=False).tobytes()


def _encode_id(token_id: int) -> int:
    if not 0 <= token_id <= _MAX_TOKEN_ID:
        raise _id_error()
    t = token_id
    return (t & 0x7F) | ((t << 1) & 0x7F00) | ((t << 2) & 0x7F0000) | ((t << 3) & 0x7F000000) | 0x80


def _id_error() -> ValueError:
    return ValueError(f"token ids must be in [0, {_MAX_TOKEN_ID}] for n-gram lookup")


def _match_end(encoded: bytes | bytearray, min_window: int, max_window: int) -> int:
    """Token index just past the best earlier occurrence of a suffix, or -1."""
    num_tokens = len(encoded) // _TOKEN_BYTES
    # An occurrence of a length-(n+1) suffix ending at e holds a length-n one
    # ending at e, so matching lengths form a range from min_window up: grow
    # the window until it fails, searching only up to the last match's end.
    search_end = (num_tokens - 1) * _TOKEN_BYTES  # occurrences end before the last token
    match_end = -1  # byte offset
    for window in range(max(min_window, 1), min(max_window, num_tokens - 1) + 1):
        window_bytes = window * _TOKEN_BYTES
        start = encoded.rfind(encoded[len(encoded) - window_bytes :], 0, search_end)
        if start < 0:
            break
        match_end = search_end = start + window_bytes
    return match_end // _TOKEN_BYTES if match_end >= 0 else -1
