"""Hidden states -> logits for the positions the step needs.

Only the last token of each request gets logits, unless input (prompt)
logprobs are requested; then the chunk positions from
`extend_input_logprob_start_lens` on do too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


_MAX_CARRIED = 256  # logprob rows kept for a request's next chunk (see _carried_head)


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # float32[bs, vocab]
    # per request: one entry per chunk position in [start, extend_len)
    input_token_logprobs: list[list[float | None]] | None = None
    input_top_logprobs: list[list[list[tuple[float, int]]]] | None = None


@dataclass
class _Rows:
    """Which hidden-state rows get logits, and where each request's segment lies."""

    rows: list[int]  # token indices into hidden_states
    last: list[int]  # per request: index into `rows` of its last token
    segments: list[tuple[int, int, int]]  # per logprob request: (req, first row idx, start)


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int, tp_size: int = 1) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = tp_size

    def forward(
        self, hidden_states: torch.Tensor, lm_head: nn.Module, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        """hidden_states: [num_tokens, H]."""
        if forward_batch.forward_mode.is_decode():
            return LogitsProcessorOutput(self._logits(hidden_states, lm_head))
        sel = _select_rows(forward_batch)
        if not sel.segments and len(sel.rows) == hidden_states.shape[0]:
            logits = self._logits(hidden_states, lm_head)  # every token is a last token
        else:
            index = torch.tensor(sel.rows, device=hidden_states.device)
            logits = self._logits(hidden_states.index_select(0, index), lm_head)
        last = torch.tensor(sel.last, device=logits.device)
        out = LogitsProcessorOutput(logits.index_select(0, last) if sel.segments else logits)
        if sel.segments:
            _input_logprobs(out, logits, sel, forward_batch)
        return out

    def _logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        logits = F.linear(hidden, lm_head.weight)
        if self.tp_size > 1:
            from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_gather

            logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[:, : self.vocab_size].float()


def _select_rows(fb: ForwardBatch) -> _Rows:
    starts = fb.extend_input_logprob_start_lens if fb.return_logprob else None
    sel = _Rows([], [], [])
    offset = 0
    for r, ext in enumerate(fb.extend_seq_lens_cpu):
        start = ext if starts is None else min(starts[r], ext)
        if start < ext:
            first = max(start - 1, 0)
            sel.segments.append((r, len(sel.rows), start))
            sel.rows.extend(range(offset + first, offset + ext))
        else:
            sel.rows.append(offset + ext - 1)
        sel.last.append(len(sel.rows) - 1)
        offset += ext
    return sel


def _input_logprobs(
    out: LogitsProcessorOutput, logits: torch.Tensor, sel: _Rows, fb: ForwardBatch
) -> None:
    """Fill out.input_token_logprobs / input_top_logprobs for the logprob requests."""
    bs = fb.batch_size
    token_lp: list[list[float | None]] = [[] for _ in range(bs)]
    top_lp: list[list[list[tuple[float, int]]]] = [[] for _ in range(bs)]
    offsets = [0]
    for ext in fb.extend_seq_lens_cpu:
        offsets.append(offsets[-1] + ext)
    for r, first_row, start in sel.segments:
        ext = fb.extend_seq_lens_cpu[r]
        # rows first_row .. last[r]-1 predict chunk positions max(start, 1) .. ext-1;
        # the last row predicts the token after the chunk
        rows = torch.log_softmax(logits[first_row : sel.last[r] + 1], dim=-1)  # [n + 1, vocab]
        begin = max(start, 1)
        targets = fb.input_ids[offsets[r] + begin : offsets[r] + ext]
        values = rows[:-1].gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        k = (fb.top_logprobs_nums or [0] * bs)[r]
        head = [_carried_head(fb, r, int(fb.input_ids[offsets[r]]), k)] if start == 0 else []
        token_lp[r] = [h[0] for h in head] + values
        top_lp[r] = [h[1] for h in head] + _topk(rows[:-1], k)
        _store_carry(fb, offsets[r] + ext - 1, fb.seq_lens_cpu[r], rows[-1])
    out.input_token_logprobs = token_lp
    out.input_top_logprobs = top_lp


def _carried_head(fb: ForwardBatch, r: int, token_id: int, k: int):
    """(logprob, top list) of chunk position 0, from the row an earlier forward carried.

    Carried rows are keyed by the KV slot of the last token they follow; a slot's
    entry is dropped when the slot is written again (ForwardBatch.init_new), so
    a hit means the same KV prefix, whether it is this request's previous chunk
    or a radix-cache match of it. None when nothing was carried.
    """
    prefix_len = fb.extend_prefix_lens_cpu[r]
    if fb.logprob_carry is None or prefix_len == 0:
        return None, []
    row_idx = fb.req_pool_indices_cpu[r]
    slot = int(fb.req_to_token_pool.req_to_token[row_idx, prefix_len - 1])
    entry = fb.logprob_carry.get(slot)
    if entry is None or entry[0] != prefix_len:
        return None, []
    return float(entry[1][token_id]), _topk(entry[1].unsqueeze(0), k)[0]


def _store_carry(fb: ForwardBatch, last_token_idx: int, seq_len: int, row: torch.Tensor) -> None:
    """Keep the logprobs that follow this chunk, keyed by its last token's KV slot."""
    carry = fb.logprob_carry
    if carry is None:
        return
    carry[int(fb.out_cache_loc[last_token_idx])] = (seq_len, row.clone())
    while len(carry) > _MAX_CARRIED:
        carry.pop(next(iter(carry)))


def _topk(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """[n, vocab] -> n lists of (logprob, token id), best first."""
    if k <= 0:
        return [[] for _ in range(logprobs.shape[0])]
    vals, ids = logprobs.topk(k, dim=-1)
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]
