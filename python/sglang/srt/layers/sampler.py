"""Logits -> next tokens (+ their logprobs).

Order of operations per row: logit adjustments (penalties, logit_bias,
min_new_tokens ban, grammar mask) -> greedy argmax, or temperature -> softmax ->
top-k -> top-p -> min-p -> sample. Reported logprobs are log_softmax of the
adjusted logits before temperature. A row whose adjustments ban every token (say
min_new_tokens bans EOS, the only token a finished grammar allows) samples
NO_ALLOWED_TOKEN; the scheduler fails that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.listed_logprobs import listed_per_row
from sglang.srt.sampling.penalties import apply_penalties
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

_TWO_64 = 1 << 64
NO_ALLOWED_TOKEN = -1  # the id a row samples when every token of it is banned
_TOP_CANDIDATES = 1024  # tokens considered by top-k / top-p / min-p before a full sort


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # int64[bs]
    logprobs: torch.Tensor | None = None  # float32[bs]: of the chosen tokens
    # per row: its listed logprobs (listed_logprobs.py: the k best, then the asked ids')
    top_logprobs: list[list[tuple[float, int]]] | None = None


class Sampler(nn.Module):
    def forward(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo | None,
        return_logprob: bool = False,
        top_logprobs_nums: list[int] | None = None,
        logprob_token_ids: list[list[int]] | None = None,
    ) -> SampleOutput:
        """logits: float32[bs, vocab] (not modified)."""
        if info is None or (info.is_all_greedy and not info.has_logit_adjustments):
            ids = greedy_ids(logits)  # fast path: nothing to adjust or draw
        else:
            logits = adjust_logits(logits.clone(), info)
            ids = _sample(logits, info)
        if not return_logprob:
            return SampleOutput(ids)
        return _with_logprobs(ids, logits, top_logprobs_nums, logprob_token_ids)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """int64[bs]: each row's argmax (its first max), as torch.argmax. On CPU the kernel:
    torch's CPU argmax is 3-5x slower ([32, 8192]: 0.33 vs 0.09 ms at 2 threads)."""
    if cpu_kernels.usable(logits) and logits.dim() == 2 and logits.stride(1) == 1:
        ids = torch.empty(logits.shape[0], dtype=torch.int64)
        cpu_kernels.load().argmax_rows(ids, logits)
        return ids
    return torch.argmax(logits, dim=-1)


def adjust_logits(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Apply penalties, biases and masks to `logits` ([bs, vocab]) in place."""
    if info.penalty_counts is not None:
        apply_penalties(
            logits,
            info.penalty_counts,
            info.frequency_penalties,
            info.presence_penalties,
            info.repetition_penalties,
            info.prompt_seen,
        )
    if info.vocab_bias is not None:
        logits += info.vocab_bias
    if info.grammar_mask is not None:  # last: a banned token stays banned
        info.grammar_mask.apply(logits)
    return logits


def _sample(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    best_ids = greedy_ids(logits)
    # a row's best logit is -inf only when every token of it is banned
    none_allowed = logits.gather(1, best_ids.unsqueeze(1)).squeeze(1) == float("-inf")
    if info.is_all_greedy:
        return best_ids.masked_fill_(none_allowed, NO_ALLOWED_TOKEN)
    if info.repetition_penalties is not None:
        # a tiny penalty boosts logits up to the float32 max (apply_penalties), which a
        # temperature below 1 would overflow to inf (softmax of inf is NaN): shifted by
        # the row's max first (softmax's own shift), every value is <= 0 and stays so.
        # A row with every token banned (max -inf) gets NaN here and samples none anyway.
        logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(logits / info.temperatures, dim=-1)  # [bs, vocab]
    weights, token_ids = _candidates(probs, info)
    if token_ids is not None and any(seed is not None for seed in info.seeds):
        # A seeded row draws in vocab order whatever its batch: the candidates' order
        # depends on which filters other rows use, and the same uniform must pick the
        # same token (zero weights for the tokens filtered out).
        weights = torch.zeros_like(probs).scatter_(1, token_ids, weights)
        token_ids = None
    picked = _draw(weights, info)  # int64[bs]: a column of `weights`
    if token_ids is not None:
        picked = token_ids.gather(1, picked.unsqueeze(1)).squeeze(1)
    picked = torch.where(info.greedy_mask, best_ids, picked)
    return picked.masked_fill_(none_allowed, NO_ALLOWED_TOKEN)


def _candidates(probs: torch.Tensor, info: SamplingBatchInfo):
    """(weights [bs, C], token ids [bs, C] or None = all) after top-k / top-p / min-p.

    Filtering works on the best C tokens only (a top-k instead of a full sort),
    unless some row's top-k or top-p reaches past them.
    """
    vocab = probs.shape[-1]
    if info.need_top_p_sampling:
        num = min(vocab, max(_TOP_CANDIDATES, int(info.top_ks.clamp(max=vocab).max())))
    elif info.need_top_k_sampling:
        num = int(info.top_ks.clamp(max=vocab).max())
    elif info.need_min_p_sampling:  # no ranking needed: mask below min_p * max
        max_prob = probs.max(dim=-1, keepdim=True).values
        return probs.masked_fill(probs < max_prob * info.min_ps.unsqueeze(1), 0.0), None
    else:
        return probs, None
    weights, token_ids = probs.topk(num, dim=-1)  # sorted, best first
    if num < vocab and info.need_top_p_sampling:
        covered = weights.sum(dim=-1) >= info.top_ps
        if not bool(covered.all()):  # a flat distribution: top-p needs more tokens
            weights, token_ids = probs.sort(dim=-1, descending=True)
    return _filter_sorted(weights, info), token_ids


def _filter_sorted(weights: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero the sorted candidates outside top-k / top-p / min-p (left unnormalized)."""
    rank = torch.arange(weights.shape[-1], device=weights.device).unsqueeze(0)
    drop = rank >= info.top_ks.unsqueeze(1)
    if info.need_top_p_sampling:
        # keep a token while the mass strictly before it is at most top_p (the first stays)
        mass_before = weights.cumsum(dim=-1) - weights
        drop |= mass_before > info.top_ps.unsqueeze(1)
    if info.need_min_p_sampling:
        drop |= weights < weights[:, :1] * info.min_ps.unsqueeze(1)
    return weights.masked_fill(drop, 0.0)


def _draw(weights: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """One column per row of `weights` ([bs, C], unnormalized), by inverse CDF.

    One uniform per row; rows with a seed take theirs from a hash of (seed, step),
    so the same seed gives the same tokens.
    """
    cdf = weights.cumsum(dim=-1)  # [bs, C]
    uniform = torch.rand(weights.shape[0], device=weights.device)
    rows = [row for row, seed in enumerate(info.seeds) if seed is not None]
    if rows:
        seeded = torch.tensor([seeded_uniform(info.seeds[r], info.steps[r]) for r in rows])
        uniform.index_copy_(
            0, _to_device(torch.tensor(rows), uniform.device), _to_device(seeded, uniform.device)
        )
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return picked.clamp_(max=weights.shape[-1] - 1)


def seeded_uniform(seed: int, step: int) -> float:
    """The uniform in [0, 1) of a seeded row at `step`, from a 64-bit hash of both (no
    generator: torch's CPU one keeps 32 bits of its seed), so every seed of the range
    [-2**63, 2**64) is its own stream (one below 0 is that plus 2**64, as for
    torch.manual_seed), the same on every device. 24 bits: exact in float32, below 1."""
    mixed = _splitmix64(_splitmix64(seed % _TWO_64) ^ step)
    return (mixed >> 40) / float(1 << 24)


def _splitmix64(x: int) -> int:
    """A 64-bit integer hash (SplitMix64's finalizer over x + the golden gamma)."""
    x = (x + 0x9E3779B97F4A7C15) % _TWO_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % _TWO_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % _TWO_64
    return x ^ (x >> 31)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU through pinned memory, without a host sync."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _with_logprobs(
    ids: torch.Tensor,
    logits: torch.Tensor,
    top_logprobs_nums: list[int] | None,
    logprob_token_ids: list[list[int]] | None,
) -> SampleOutput:
    logprobs = torch.log_softmax(logits, dim=-1)  # [bs, vocab]
    chosen = logprobs.gather(1, ids.clamp(min=0).unsqueeze(1)).squeeze(1)  # NO_ALLOWED_TOKEN
    nums = top_logprobs_nums or [0] * ids.shape[0]
    return SampleOutput(ids, chosen, listed_per_row(logprobs, nums, logprob_token_ids))
