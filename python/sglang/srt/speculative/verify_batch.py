"""One verify forward's logits -> the tokens each request keeps (worker side).

Request i's verify input is `[last_token, d_1 .. d_k]` (k = len(drafts[i]) >= 0),
so its logits are k + 1 consecutive rows; row j predicts the token after input j.
A request with k = 0 is an ordinary decode row: its last row goes through the
regular Sampler with the batch's full SamplingBatchInfo (penalties, biases,
grammar masks, seeds). Only requests without per-position adjustments draft
(the scheduler decides; a grammar's per-row masks are applied to the logits
before this), so their rows need nothing but temperature and the top-k / top-p
/ min-p filters: greedy rows verify by argmax, sampled rows by rejection
sampling, which keeps the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.layers.listed_logprobs import listed
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.speculative.verify import (
    accepted_logprobs,
    target_probs,
    verify_greedy,
    verify_sampling,
)


@dataclass
class VerifyOutput:
    # per request: the accepted draft tokens, then one token of the target's (>= 1 token)
    accepted: list[list[int]]
    # per request, per accepted token (when some request asked for logprobs)
    logprobs: list[list[float]] | None = None
    # ... and their listed logprobs (listed_logprobs.py)
    top_logprobs: list[list[list[tuple[float, int]]]] | None = None


def verify(
    logits: torch.Tensor,
    info: SamplingBatchInfo,
    drafts: list[list[int]],
    draft_probs: torch.Tensor | None,
    sampler: Sampler,
    logprob_asks: tuple[list[int], list[list[int]] | None] | None,
) -> VerifyOutput:
    """logits: float32 [sum(k_i + 1), vocab]; draft_probs: [sum(k_i), vocab] or None;
    logprob_asks: (top_logprobs_nums, logprob_token_ids) when some request asked for
    logprobs."""
    lens = torch.tensor([len(d) + 1 for d in drafts])
    starts = (lens.cumsum(0) - lens).tolist()
    last_rows = (lens.cumsum(0) - 1).to(logits.device)
    want_logprobs = logprob_asks is not None
    plain = sampler(logits.index_select(0, last_rows), info, want_logprobs, *(logprob_asks or ()))
    accepted: list[list[int]] = [[t] for t in plain.next_token_ids.tolist()]
    drafting = [i for i, d in enumerate(drafts) if d]
    greedy = info.greedy_mask.tolist()
    groups = ([i for i in drafting if greedy[i]], [i for i in drafting if not greedy[i]])
    rows_of = {i: list(range(starts[i], starts[i] + len(drafts[i]) + 1)) for i in drafting}
    if groups[0]:
        _verify_greedy_group(logits, drafts, groups[0], rows_of, accepted)
    if groups[1]:
        _verify_sampled_group(logits, info, drafts, draft_probs, groups[1], rows_of, accepted)
    out = VerifyOutput(accepted)
    if want_logprobs:
        _attach_logprobs(out, logits, plain, drafts, drafting, rows_of, logprob_asks)
    return out


def _verify_greedy_group(logits, drafts, reqs, rows_of, accepted) -> None:
    rows = torch.tensor([r for i in reqs for r in rows_of[i]], device=logits.device)
    kept = verify_greedy(logits.index_select(0, rows), [drafts[i] for i in reqs])
    for i, tokens in zip(reqs, kept):
        accepted[i] = tokens


def _verify_sampled_group(logits, info, drafts, draft_probs, reqs, rows_of, accepted) -> None:
    rows = torch.tensor([r for i in reqs for r in rows_of[i]], device=logits.device)
    per_row = torch.tensor([i for i in reqs for _ in rows_of[i]], device=logits.device)
    probs = target_probs(
        logits.index_select(0, rows),
        info.temperatures.view(-1).index_select(0, per_row),
        info.top_ks.index_select(0, per_row),
        info.top_ps.index_select(0, per_row),
        info.min_ps.index_select(0, per_row),
    )
    q = None
    if draft_probs is not None:
        q = draft_probs.index_select(0, _draft_rows(drafts, reqs, logits.device))
    kept = verify_sampling(probs, [drafts[i] for i in reqs], q)
    for i, tokens in zip(reqs, kept):
        accepted[i] = tokens


def _draft_rows(drafts: list[list[int]], reqs: list[int], device) -> torch.Tensor:
    """Rows of draft_probs (one per draft token, requests in batch order) for `reqs`."""
    starts, offset = [], 0
    for d in drafts:
        starts.append(offset)
        offset += len(d)
    return torch.tensor([starts[i] + j for i in reqs for j in range(len(drafts[i]))], device=device)


def _attach_logprobs(out, logits, plain, drafts, drafting, rows_of, asks) -> None:
    """Logprobs of every kept token: the plain sampler's for k = 0 rows, else log_softmax of
    the verify rows (drafting requests carry no logit adjustments)."""
    out.logprobs = [[v] for v in plain.logprobs.tolist()]
    out.top_logprobs = [[t] for t in plain.top_logprobs]
    for i in drafting:
        rows = torch.tensor(rows_of[i], device=logits.device)
        sub = logits.index_select(0, rows)
        out.logprobs[i] = accepted_logprobs(sub, [drafts[i]], [out.accepted[i]])[0]
        top_nums, token_ids = asks
        kept = torch.log_softmax(sub[: len(out.accepted[i])], dim=-1)
        out.top_logprobs[i] = listed(kept, top_nums[i], token_ids[i] if token_ids else None)
