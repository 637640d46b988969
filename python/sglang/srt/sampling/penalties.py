"""Repetition, frequency and presence penalties over the tokens generated so far."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def output_token_counts(
    output_ids: list[list[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """int32[bs, vocab]: how often each token occurs in each request's output."""
    bs = len(output_ids)
    counts = torch.zeros(bs, vocab_size, dtype=torch.int32)
    lens = [len(ids) for ids in output_ids]
    if sum(lens):
        rows = torch.repeat_interleave(torch.arange(bs), torch.tensor(lens))
        cols = torch.tensor([t for ids in output_ids for t in ids], dtype=torch.int64)
        counts.index_put_((rows, cols), torch.ones_like(cols, dtype=torch.int32), accumulate=True)
    return counts.to(device)


class RunningTokenCounts:
    """int32[bs, vocab] output-token counts of a running batch, kept across steps.

    Rebuilding the counts each step costs O(tokens generated so far) per request (4.6 ms a
    step for 32 requests 1,000 tokens in); here a step adds only each row's new tokens
    (one per decode step), and a membership change keeps the surviving rows and counts
    only the newcomers' outputs. Rows are matched by the request object itself (not its
    id(), which a new request may reuse), in the batch's order.
    """

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._owners: list[Any] = []  # row i counts the outputs of _owners[i]
        self._counted: list[int] = []  # row i holds _owners[i]'s first _counted[i] outputs
        self._counts: torch.Tensor | None = None  # int32[len(_owners), vocab]

    def update(self, owners: Sequence[Any], output_ids: Sequence[list[int]]) -> torch.Tensor:
        """The counts of `output_ids[i]` in row i (owners[i]'s outputs so far)."""
        if len(owners) != len(self._owners) or any(
            a is not b for a, b in zip(owners, self._owners)
        ):
            self._regroup(owners)
        rows: list[int] = []
        cols: list[int] = []
        for row, ids in enumerate(output_ids):
            counted = self._counted[row]
            if len(ids) < counted:  # never seen (outputs only grow); recount, not guess
                self._counts[row].zero_()
                counted = 0
            if len(ids) > counted:
                rows.extend([row] * (len(ids) - counted))
                cols.extend(ids[counted:])
                self._counted[row] = len(ids)
        if cols:
            index = (torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device))
            ones = torch.ones(len(cols), dtype=torch.int32, device=self.device)
            self._counts.index_put_(index, ones, accumulate=True)
        return self._counts

    def _regroup(self, owners: Sequence[Any]) -> None:
        """Rows for `owners`: survivors keep their counts, newcomers start at zero."""
        counts = torch.zeros(len(owners), self.vocab_size, dtype=torch.int32, device=self.device)
        old_row = {id(owner): row for row, owner in enumerate(self._owners)}
        counted = [0] * len(owners)
        new_rows, old_rows = [], []
        for row, owner in enumerate(owners):
            old = old_row.get(id(owner))
            if old is not None and self._owners[old] is owner:
                new_rows.append(row)
                old_rows.append(old)
                counted[row] = self._counted[old]
        if new_rows:
            counts[new_rows] = self._counts[old_rows]
        self._owners, self._counted, self._counts = list(owners), counted, counts


def apply_penalties(
    logits: torch.Tensor,  # float32[bs, vocab], modified in place
    counts: torch.Tensor,  # int32[bs, vocab]
    frequency: torch.Tensor | None,  # float32[bs, 1]; None = no request uses it
    presence: torch.Tensor | None,  # float32[bs, 1]
    repetition: torch.Tensor | None,  # float32[bs, 1]
) -> torch.Tensor:
    """OpenAI frequency/presence penalties and the HF-style repetition penalty."""
    if repetition is not None:
        seen = counts > 0
        rep = torch.where(seen, repetition, 1.0)
        logits.copy_(torch.where(logits > 0, logits / rep, logits * rep))
    if frequency is not None:
        logits -= frequency * counts
    if presence is not None:
        logits -= presence * (counts > 0)
    return logits
