"""The logprobs a request lists at each position beside its own token's.

A request may ask for its k best tokens (`top_logprobs_num`) and for chosen
token ids (`token_ids_logprob`, SGLang's field: say the logprobs of "Yes" and
"No" at every step). The model side computes both from one log_softmax row and
hands them on as one list per position: the k best (logprob, token id) pairs,
best first, then the asked ids' pairs in the order asked. The scheduler splits
the list at k (`split_listed`), which k <= vocab makes exact.
"""

from __future__ import annotations

import torch


def listed(logprobs: torch.Tensor, k: int, token_ids: list[int] | None) -> list[list[tuple]]:
    """logprobs: float32[n, vocab] (log_softmax rows) -> per row, the k best pairs, then
    the pairs of `token_ids`."""
    n = logprobs.shape[0]
    rows: list[list[tuple]] = [[] for _ in range(n)]
    if k > 0:
        values, ids = logprobs.topk(k, dim=-1)
        rows = [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]
    if token_ids:
        index = torch.tensor(token_ids, dtype=torch.int64, device=logprobs.device)
        picked = logprobs.index_select(1, index).tolist()  # [n, len(token_ids)]
        for row, values in zip(rows, picked):
            row.extend(zip(values, token_ids))
    return rows


def listed_per_row(
    logprobs: torch.Tensor, nums: list[int], token_ids: list[list[int]] | None
) -> list[list[tuple]]:
    """As `listed`, each row with its own k (`nums[r]`) and ids (`token_ids[r]`). Rows
    are ranked with their own k: which of several tied values (the -inf of tokens a
    grammar forbids) make a top list depends on k, and a row's list must not depend
    on what its batch neighbours ask for."""
    rows: list[list[tuple]] = [[] for _ in range(logprobs.shape[0])]
    for k in set(nums) - {0}:
        chosen = [r for r, n in enumerate(nums) if n == k]
        index = torch.tensor(chosen, dtype=torch.int64, device=logprobs.device)
        for r, row in zip(chosen, listed(logprobs.index_select(0, index), k, None)):
            rows[r] = row
    for r, asked in enumerate(token_ids or ()):
        if asked:
            rows[r].extend(listed(logprobs[r : r + 1], 0, asked)[0])
    return rows


def split_listed(entry: list[tuple] | None, k: int) -> tuple[list[tuple] | None, list[tuple]]:
    """One position's listed pairs -> (the k best, the asked ids'); None stays None."""
    if entry is None:
        return None, []
    return entry[:k], entry[k:]
