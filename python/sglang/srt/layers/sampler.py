"""Logits -> next tokens (+ their logprobs).

Order of operations per row: logit adjustments (penalties, logit_bias,
min_new_tokens ban, grammar mask) -> greedy argmax, or temperature -> softmax ->
top-k -> top-p -> min-p -> sample. Reported logprobs are log_softmax of the
adjusted logits before temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang.srt.sampling.penalties import apply_penalties
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

_SEED_MIX = 1_000_003  # step multiplier so (seed, step) pairs map to distinct seeds


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # int64[bs]
    logprobs: torch.Tensor | None = None  # float32[bs]: of the chosen tokens
    top_logprobs: list[list[tuple[float, int]]] | None = None


class Sampler(nn.Module):
    def forward(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo | None,
        return_logprob: bool = False,
        top_logprobs_nums: list[int] | None = None,
    ) -> SampleOutput:
        """logits: float32[bs, vocab] (not modified)."""
        if info is None or (info.is_all_greedy and not info.has_logit_adjustments):
            ids = torch.argmax(logits, dim=-1)  # fast path: nothing to adjust or draw
        else:
            logits = adjust_logits(logits.clone(), info)
            ids = _sample(logits, info)
        if not return_logprob:
            return SampleOutput(ids)
        return _with_logprobs(ids, logits, top_logprobs_nums)


def adjust_logits(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Apply penalties, biases and masks to `logits` ([bs, vocab]) in place."""
    if info.penalty_counts is not None:
        apply_penalties(
            logits,
            info.penalty_counts,
            info.frequency_penalties,
            info.presence_penalties,
            info.repetition_penalties,
        )
    if info.vocab_bias is not None:
        logits += info.vocab_bias
    if info.vocab_mask is not None:
        logits.masked_fill_(info.vocab_mask, float("-inf"))
    return logits


def _sample(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    greedy_ids = torch.argmax(logits, dim=-1)
    if info.is_all_greedy:
        return greedy_ids
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    probs = _filter_probs(probs, info)
    sampled = _draw(probs, info)
    return torch.where(info.greedy_mask, greedy_ids, sampled)


def _filter_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero the tokens outside top-k / top-p / min-p (unnormalized result)."""
    if info.need_top_k_sampling or info.need_top_p_sampling:
        probs = _top_k_top_p(probs, info.top_ks, info.top_ps)
    if info.need_min_p_sampling:
        max_prob = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < max_prob * info.min_ps.unsqueeze(1), 0.0)
    return probs


def _top_k_top_p(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor):
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [bs, vocab]
    rank = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)
    drop = rank >= top_ks.unsqueeze(1)
    # keep a token while the mass strictly before it is below top_p (the first always stays)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= mass_before > top_ps.unsqueeze(1)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs)


def _draw(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """One token per row; rows with a seed use their own generator seeded by (seed, step)."""
    ids = torch.multinomial(probs, 1).squeeze(1)
    for row, seed in enumerate(info.seeds):
        if seed is None:
            continue
        gen = torch.Generator(device=probs.device)
        gen.manual_seed((seed * _SEED_MIX + info.steps[row]) % (1 << 63))
        ids[row] = torch.multinomial(probs[row], 1, generator=gen)[0]
    return ids


def _with_logprobs(
    ids: torch.Tensor, logits: torch.Tensor, top_logprobs_nums: list[int] | None
) -> SampleOutput:
    logprobs = torch.log_softmax(logits, dim=-1)  # [bs, vocab]
    chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
    nums = top_logprobs_nums or []
    k = max(nums, default=0)
    top = [[] for _ in range(ids.shape[0])]
    if k > 0:
        vals, tok = logprobs.topk(k, dim=-1)
        vals_l, tok_l = vals.tolist(), tok.tolist()
        top = [list(zip(vals_l[r][:n], tok_l[r][:n])) for r, n in enumerate(nums)]
    return SampleOutput(ids, chosen, top)
