"""The sampling parameters of a batch, as tensors the sampler consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.sampling.penalties import output_token_counts, prompt_token_mask
from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # float32[bs, 1]; 1.0 on greedy rows
    top_ps: torch.Tensor  # float32[bs]
    top_ks: torch.Tensor  # int64[bs]
    min_ps: torch.Tensor  # float32[bs]
    greedy_mask: torch.Tensor  # bool[bs]
    is_all_greedy: bool
    need_top_p_sampling: bool
    need_top_k_sampling: bool
    need_min_p_sampling: bool
    seeds: list[int | None]  # per request; None = the global generator
    steps: list[int]  # per request: tokens generated so far (mixes into the seed)
    vocab_bias: torch.Tensor | None = None  # float32[bs, vocab]: logit_bias + min_new_tokens
    penalty_counts: torch.Tensor | None = None  # int32[bs, vocab]
    frequency_penalties: torch.Tensor | None = None  # float32[bs, 1]; None = unused
    presence_penalties: torch.Tensor | None = None  # float32[bs, 1]
    repetition_penalties: torch.Tensor | None = None  # float32[bs, 1]
    prompt_seen: torch.Tensor | None = None  # bool[bs, vocab]; with repetition_penalties
    # This step's grammar mask (constrained/grammar_manager.GrammarMask): it has
    # `apply(logits)`; None when no request in the batch is constrained.
    grammar_mask: Any = None

    @property
    def batch_size(self) -> int:
        return int(self.top_ps.shape[0])

    @property
    def has_logit_adjustments(self) -> bool:
        return (
            self.vocab_bias is not None
            or self.penalty_counts is not None
            or self.grammar_mask is not None
        )

    @classmethod
    def from_requests(
        cls,
        params: list[SamplingParams],
        output_ids: list[list[int]],
        vocab_size: int,
        device: torch.device | str = "cpu",
        eos_token_ids: set[int] | None = None,
        penalty_counts: torch.Tensor | None = None,
        prompt_ids: list[list[int]] | None = None,
        prompt_seen: torch.Tensor | None = None,
    ) -> SamplingBatchInfo:
        """Build from each request's params and the tokens it generated so far.

        `eos_token_ids` (the model's) are banned, like each request's
        `stop_token_ids`, while a request has fewer than `min_new_tokens` outputs.
        `prompt_ids` are the prompts the repetition penalty also covers (none given: no
        prompt tokens). `penalty_counts` (int32[bs, vocab]) and `prompt_seen` (bool[bs,
        vocab]), e.g. a running batch's `RunningTokenCounts`, spare counting them again.
        """
        greedy = [p.is_greedy for p in params]
        top_ks = [p.effective_top_k for p in params]
        info = cls(
            temperatures=_col(
                [1.0 if g else p.temperature for p, g in zip(params, greedy)], device
            ),
            top_ps=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            greedy_mask=torch.tensor(greedy, dtype=torch.bool, device=device),
            is_all_greedy=all(greedy),
            need_top_p_sampling=any(p.top_p < 1.0 for p in params),
            need_top_k_sampling=any(k < vocab_size for k in top_ks),
            need_min_p_sampling=any(p.min_p > 0.0 for p in params),
            seeds=[p.seed for p in params],
            steps=[len(ids) for ids in output_ids],
        )
        info.vocab_bias = _vocab_bias(params, output_ids, vocab_size, device, eos_token_ids)
        if any(has_penalty(p) for p in params):
            if penalty_counts is None:
                penalty_counts = output_token_counts(output_ids, vocab_size, device)
            info._init_penalties(params, penalty_counts, device)
            if info.repetition_penalties is not None:
                if prompt_seen is None:
                    prompts = prompt_ids or [[] for _ in params]
                    prompt_seen = prompt_token_mask(prompts, vocab_size, device)
                info.prompt_seen = prompt_seen
        return info

    def _init_penalties(self, params, counts, device) -> None:
        """Counts of generated tokens, and a column per penalty some request uses."""
        self.penalty_counts = counts
        if any(p.frequency_penalty != 0.0 for p in params):
            self.frequency_penalties = _col([p.frequency_penalty for p in params], device)
        if any(p.presence_penalty != 0.0 for p in params):
            self.presence_penalties = _col([p.presence_penalty for p in params], device)
        if any(p.repetition_penalty != 1.0 for p in params):
            self.repetition_penalties = _col([p.repetition_penalty for p in params], device)


def _col(values: list[float], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def has_penalty(p: SamplingParams) -> bool:
    return p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 or p.repetition_penalty != 1.0


def _vocab_bias(params, output_ids, vocab_size, device, eos_token_ids) -> torch.Tensor | None:
    """float32[bs, vocab] additive bias, or None when no request needs one."""
    entries: list[tuple[int, int, float]] = []  # (row, token id, bias)
    for row, (p, out) in enumerate(zip(params, output_ids)):
        for key, value in (p.logit_bias or {}).items():
            entries.append((row, int(key), float(value)))
        if len(out) < p.min_new_tokens:
            banned = set(p.stop_token_ids or ()) | (
                set() if p.ignore_eos else eos_token_ids or set()
            )
            entries.extend((row, t, float("-inf")) for t in banned if 0 <= t < vocab_size)
    if not entries:
        return None
    bias = torch.zeros(len(params), vocab_size, dtype=torch.float32)
    for row, token_id, value in entries:
        bias[row, token_id] += value
    return bias.to(device)
