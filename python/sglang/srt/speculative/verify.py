"""Verify drafted tokens against the target model's logits.

Row layout, shared by every function here: request i's verify input was
[last_token, d_1, ..., d_k] (k = len(drafts[i]) >= 0), so it owns k + 1
consecutive rows of the target's logits, requests in order; row j predicts
the token after input j. Draft-probability rows (one per draft token) follow
the same order without the extra row.

The verify functions return, per request, the accepted drafts followed by one
token from the target: n_accepted + 1 tokens, between 1 and k + 1.
"""

from __future__ import annotations

import torch

_TOP_CANDIDATES = 1024  # as the sampler: top-k / top-p work on the best C tokens first


def target_probs(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
) -> torch.Tensor:
    """float32[rows, V]: the distribution the sampler draws from, renormalized.

    logits float32[rows, V]; temperatures float32[rows] (or [rows, 1]), all > 0;
    top_ks int64[rows] (>= V: off); top_ps, min_ps float32[rows].
    Same filters as layers/sampler.py: top-k, then top-p keeps a token while
    the sorted mass strictly before it is <= top_p, then min-p keeps
    p >= min_p * max p.
    """
    probs = torch.softmax(logits / temperatures.reshape(-1, 1), dim=-1)  # [rows, V]
    vocab = probs.shape[-1]
    need_top_p = bool((top_ps < 1.0).any())
    need_top_k = bool((top_ks < vocab).any())
    need_min_p = bool((min_ps > 0.0).any())
    if need_top_k or need_top_p:
        weights, token_ids = _sorted_candidates(probs, top_ks, top_ps, need_top_p)
        kept = _filter_sorted(weights, top_ks, top_ps if need_top_p else None, min_ps)
        probs = torch.zeros_like(probs).scatter_(1, token_ids, kept)
    elif need_min_p:
        max_prob = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < max_prob * min_ps.unsqueeze(1), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def _sorted_candidates(
    probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, need_top_p: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, token ids), both [rows, C], best first: enough for every row's filter."""
    vocab = probs.shape[-1]
    max_top_k = int(top_ks.clamp(max=vocab).max())
    num = min(vocab, max(_TOP_CANDIDATES, max_top_k)) if need_top_p else max_top_k
    weights, token_ids = probs.topk(num, dim=-1)
    if num < vocab and need_top_p and not bool((weights.sum(dim=-1) >= top_ps).all()):
        weights, token_ids = probs.sort(dim=-1, descending=True)  # top-p needs more
    return weights, token_ids


def _filter_sorted(
    weights: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor | None, min_ps: torch.Tensor
) -> torch.Tensor:
    """Zero the sorted candidates ([rows, C]) outside top-k / top-p / min-p."""
    rank = torch.arange(weights.shape[-1], device=weights.device).unsqueeze(0)
    drop = rank >= top_ks.unsqueeze(1)
    if top_ps is not None:
        mass_before = weights.cumsum(dim=-1) - weights
        drop |= mass_before > top_ps.unsqueeze(1)
    drop |= weights < weights[:, :1] * min_ps.unsqueeze(1)
    return weights.masked_fill(drop, 0.0)


def verify_greedy(target_logits: torch.Tensor, drafts: list[list[int]]) -> list[list[int]]:
    """Accept d_{j+1} while it is row j's argmax; then the first disagreeing row's argmax."""
    _check_rows(target_logits, drafts)
    best = target_logits.argmax(dim=-1).tolist()  # [rows]
    out = []
    for first_row, draft in zip(_first_rows(drafts), drafts):
        row_best = best[first_row : first_row + len(draft) + 1]
        num_accepted = _num_leading_equal(draft, row_best)
        out.append(row_best[: num_accepted + 1])  # accepted drafts equal their rows' argmax
    return out


def _num_leading_equal(draft: list[int], row_best: list[int]) -> int:
    num = 0
    while num < len(draft) and draft[num] == row_best[num]:
        num += 1
    return num


def verify_sampling(
    probs: torch.Tensor,
    drafts: list[list[int]],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Speculative (rejection) sampling: the output follows `probs` exactly.

    probs float32[rows, V] (from `target_probs`); draft_probs float32[rows_d, V]
    (row of d_{j+1} = the q it was drawn from), or None for n-gram drafts,
    taken as q = one-hot at d. Accept d with probability min(1, p[d] / q[d]);
    at the first rejection draw the last token from normalize(max(0, p - q))
    (p itself when that has no mass); when all are accepted, from the last row.
    """
    _check_rows(probs, drafts)
    target_rows, draft_rows = _draft_row_indices(drafts, probs.device)
    assert draft_probs is None or draft_probs.shape[0] == len(draft_rows), "one q row per draft"
    flat_drafts = [d for draft in drafts for d in draft]
    draft_tokens = torch.tensor(flat_drafts, dtype=torch.int64, device=probs.device)
    p_draft = probs[target_rows, draft_tokens]  # [rows_d]: p[d]
    q_draft = (
        torch.ones_like(p_draft) if draft_probs is None else draft_probs[draft_rows, draft_tokens]
    )
    uniform = torch.rand(len(draft_tokens) + len(drafts), generator=generator, device=probs.device)
    # u < p/q without dividing: q[d] = 0 accepts iff p[d] > 0
    accept = (uniform[: len(draft_tokens)] * q_draft < p_draft).tolist()
    num_accepted = _num_accepted_per_request(accept, drafts)
    last = _draw_last_tokens(probs, drafts, draft_probs, num_accepted, uniform[len(draft_tokens) :])
    return [draft[:n] + [t] for draft, n, t in zip(drafts, num_accepted, last)]


def _num_accepted_per_request(accept: list[bool], drafts: list[list[int]]) -> list[int]:
    out, offset = [], 0
    for draft in drafts:
        flags = accept[offset : offset + len(draft)]
        out.append(flags.index(False) if False in flags else len(draft))
        offset += len(draft)
    return out


def _draw_last_tokens(
    probs: torch.Tensor,
    drafts: list[list[int]],
    draft_probs: torch.Tensor | None,
    num_accepted: list[int],
    uniform: torch.Tensor,
) -> list[int]:
    """One token per request from its residual (after a rejection) or its last row."""
    first_rows = _first_rows(drafts)
    rows = [r + n for r, n in zip(first_rows, num_accepted)]  # the row that decides
    p = probs[rows]  # [bs, V]
    q = torch.zeros_like(p)  # all accepted: q = 0 leaves p
    rejected = [i for i, (n, d) in enumerate(zip(num_accepted, drafts)) if n < len(d)]
    if rejected:
        # draft row of the rejected d_{n+1}: rows before request i, minus one per request
        q_rows = [first_rows[i] - i + num_accepted[i] for i in rejected]
        if draft_probs is None:
            tokens = [drafts[i][num_accepted[i]] for i in rejected]
            q[rejected, tokens] = 1.0
        else:
            q[rejected] = draft_probs[q_rows]
    residual = (p - q).clamp_(min=0.0)  # [bs, V]
    has_mass = residual.sum(dim=-1, keepdim=True) > 0.0
    weights = torch.where(has_mass, residual, p)
    return _inverse_cdf(weights, uniform).tolist()


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """int64[bs]: one column of unnormalized `weights` ([bs, V]) per uniform in [0, 1).

    Never a zero-weight column: target < total (u < 1, and float32 u * total
    rounds below total), and `right=True` skips columns whose cdf did not grow.
    """
    cdf = weights.cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


def accepted_logprobs(
    logits: torch.Tensor, drafts: list[list[int]], accepted: list[list[int]]
) -> list[list[float]]:
    """Per request, log_softmax(raw logits) of row j at its j-th accepted token."""
    _check_rows(logits, drafts)
    rows = [r + j for r, acc in zip(_first_rows(drafts), accepted) for j in range(len(acc))]
    tokens = [t for acc in accepted for t in acc]
    logprobs = torch.log_softmax(logits[rows], dim=-1)  # [num accepted, V]
    index = torch.tensor(tokens, dtype=torch.int64, device=logits.device).unsqueeze(1)
    flat = logprobs.gather(1, index).squeeze(1).tolist()
    out, offset = [], 0
    for acc in accepted:
        out.append(flat[offset : offset + len(acc)])
        offset += len(acc)
    return out


def _first_rows(drafts: list[list[int]]) -> list[int]:
    """Index of each request's first target row (k + 1 rows per request)."""
    out, row = [], 0
    for draft in drafts:
        out.append(row)
        row += len(draft) + 1
    return out


def _draft_row_indices(drafts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(target row, draft row) of every draft token, int64[rows_d] each."""
    target_rows = [
        r + j for r, draft in zip(_first_rows(drafts), drafts) for j in range(len(draft))
    ]
    as_tensor = torch.tensor(target_rows, dtype=torch.int64, device=device)
    return as_tensor, torch.arange(len(target_rows), device=device)


def _check_rows(rows: torch.Tensor, drafts: list[list[int]]) -> None:
    expected = sum(len(d) + 1 for d in drafts)
    assert rows.shape[0] == expected, f"{rows.shape[0]} rows for drafts needing {expected}"
