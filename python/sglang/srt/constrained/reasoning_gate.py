"""A constraint that starts after the model's reasoning (SGLang's `require_reasoning`).

A reasoning model asked for JSON thinks first, free, and writes the JSON after its
think block closes: the matcher allows every token until the reasoning parser's end
token (`</think>`) is sampled, and constrains from the token after it on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang.srt.constrained.base import Grammar

if TYPE_CHECKING:
    import torch

_ALL_TOKENS = -1  # an int32 word with every bit set


class ReasoningGate(Grammar):
    """`inner`, open only once `end_token_id` was accepted."""

    def __init__(self, inner: Grammar, end_token_id: int) -> None:
        self.inner = inner
        self.end_token_id = end_token_id
        # per accepted token: whether it went to `inner` (rollback undoes the right ones)
        self._to_inner: list[bool] = []
        self._end_at: int | None = None  # index in _to_inner of the end token

    @property
    def reasoning(self) -> bool:
        return self._end_at is None

    def accept_token(self, token_id: int) -> bool:
        if self.reasoning:
            if token_id == self.end_token_id:
                self._end_at = len(self._to_inner)
            self._to_inner.append(False)
            return True
        if not self.inner.accept_token(token_id):
            return False
        self._to_inner.append(True)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.reasoning:
            bitmask[row].fill_(_ALL_TOKENS)
        else:
            self.inner.fill_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return not self.reasoning and self.inner.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        undone = self._to_inner[len(self._to_inner) - num_tokens :]
        del self._to_inner[len(self._to_inner) - num_tokens :]
        if sum(undone):
            self.inner.rollback(sum(undone))
        if self._end_at is not None and self._end_at >= len(self._to_inner):
            self._end_at = None
