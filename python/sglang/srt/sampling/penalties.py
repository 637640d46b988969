"""Repetition, frequency and presence penalties over the tokens generated so far."""

from __future__ import annotations

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
