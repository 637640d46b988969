"""N-gram (prompt / output lookup) drafting.

The longest suffix of a request's tokens that occurred earlier predicts what
comes next: the tokens that followed its most recent earlier occurrence.

Tokens live in a byte buffer of int32s so the search runs in C
(`bytes.rfind`); a match must start on a token boundary.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

_TYPECODE = "i"  # int32 token ids
_ITEM_BYTES = array(_TYPECODE).itemsize


def propose_ngram(
    tokens: Sequence[int], num_draft: int, min_window: int = 1, max_window: int = 12
) -> list[int]:
    """Up to `num_draft` tokens that followed the longest earlier match of a suffix.

    Suffix lengths min_window..max_window are tried; an earlier occurrence must
    end before the last token. Among occurrences of the longest matching
    length the most recent wins. [] when nothing matches or num_draft <= 0.
    """
    if num_draft <= 0:
        return []
    buf = array(_TYPECODE, tokens).tobytes()
    return _propose(buf, num_draft, min_window, max_window)


class NgramIndex:
    """Incremental n-gram drafting for one request (prompt + output so far).

    `append` mutates the stored tokens (only ever add accepted tokens);
    `propose` reads them and is equal to `propose_ngram(all tokens, ...)`.
    """

    def __init__(self, tokens: Sequence[int] = (), min_window: int = 1, max_window: int = 12):
        self.min_window = min_window
        self.max_window = max_window
        self._buf = bytearray()  # int32[num_tokens] as bytes
        self.append(tokens)

    def __len__(self) -> int:
        return len(self._buf) // _ITEM_BYTES

    def append(self, tokens: Sequence[int]) -> None:
        self._buf += array(_TYPECODE, tokens).tobytes()

    def propose(self, num_draft: int) -> list[int]:
        if num_draft <= 0:
            return []
        return _propose(self._buf, num_draft, self.min_window, self.max_window)


def _propose(buf: bytes | bytearray, num_draft: int, min_window: int, max_window: int) -> list[int]:
    num_tokens = len(buf) // _ITEM_BYTES
    # An occurrence of a length-(n+1) suffix ending at e holds a length-n one
    # ending at e, so matching lengths form a range from min_window up: grow
    # the window until it fails, searching only up to the last match's end.
    search_end = (num_tokens - 1) * _ITEM_BYTES  # occurrences end before the last token
    match_end = -1  # byte offset just past the best occurrence
    for window in range(max(min_window, 1), min(max_window, num_tokens - 1) + 1):
        window_bytes = window * _ITEM_BYTES
        start = _rfind_aligned(buf, buf[len(buf) - window_bytes :], search_end)
        if start < 0:
            break
        match_end = search_end = start + window_bytes
    if match_end < 0:
        return []
    return array(_TYPECODE, buf[match_end : match_end + num_draft * _ITEM_BYTES]).tolist()


def _rfind_aligned(buf: bytes | bytearray, pattern: bytes | bytearray, end: int) -> int:
    """Byte offset of the last token-aligned `pattern` in buf[:end], or -1."""
    while True:
        pos = buf.rfind(pattern, 0, end)
        if pos < 0 or pos % _ITEM_BYTES == 0:
            return pos
        end = pos + len(pattern) - 1  # retry with occurrences starting before pos
