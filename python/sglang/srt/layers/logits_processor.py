"""Hidden states -> logits for the positions the step needs.

Only the last token of each request gets logits, unless input (prompt)
logprobs are requested; then the chunk positions from
`extend_input_logprob_start_lens` on do too, computed a slice of rows at a
time so a long prompt over a large vocabulary never holds all its logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.layers.linear import linear
from sglang.srt.layers.listed_logprobs import listed

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


_MAX_CARRIED = 256  # logprob rows kept for a request's next chunk (see _carried_head)
_LOGPROB_CHUNK_ELEMENTS = 1 << 24  # logits held at once while computing input logprobs


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # float32[bs, vocab]; [num_tokens, vocab] for all logits
    # per request: one entry per chunk position in [start, extend_len)
    input_token_logprobs: list[list[float | None]] | None = None
    # ... and their listed logprobs (listed_logprobs.py: the k best, then the asked ids')
    input_top_logprobs: list[list[list[tuple[float, int]]]] | None = None


LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # token indices int64[n] -> float32[n, vocab]


class LogitsProcessor(nn.Module):
    def __init__(
        self, vocab_size: int, tp_size: int = 1, final_logit_softcap: float | None = None
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = tp_size
        # Gemma 2: logits become cap * tanh(logits / cap)
        self.final_logit_softcap = final_logit_softcap or None

    def forward(
        self, hidden_states: torch.Tensor, lm_head: nn.Module, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        """hidden_states: [num_tokens, H]."""
        fb = forward_batch
        if fb.forward_mode.is_decode():
            return LogitsProcessorOutput(self._logits(hidden_states, lm_head))
        if fb.return_all_logits:  # speculative verification: [num_tokens, vocab]
            return LogitsProcessorOutput(self._logits(hidden_states, lm_head))
        if len(fb.extend_seq_lens_cpu) == hidden_states.shape[0]:  # every token is a last one
            out = LogitsProcessorOutput(self._logits(hidden_states, lm_head))
        else:
            ends = torch.tensor(fb.extend_seq_lens_cpu, device=hidden_states.device).cumsum(0)
            last = hidden_states.index_select(0, ends - 1)
            out = LogitsProcessorOutput(self._logits(last, lm_head))
        if _wants_input_logprobs(fb):

            def logits_fn(rows: torch.Tensor) -> torch.Tensor:
                return self._logits(hidden_states.index_select(0, rows), lm_head)

            _input_logprobs(out, logits_fn, fb)
        return out

    def _logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        logits = linear(hidden, lm_head.weight)
        if self.tp_size > 1:
            from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_gather

            logits = tensor_model_parallel_all_gather(logits, dim=-1)
        logits = logits[:, : self.vocab_size].float()
        if self.final_logit_softcap is not None:
            cap = self.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits


def _wants_input_logprobs(fb: ForwardBatch) -> bool:
    starts = fb.extend_input_logprob_start_lens
    if not fb.return_logprob or starts is None:
        return False
    return any(s < e for s, e in zip(starts, fb.extend_seq_lens_cpu))


def _input_logprobs(out: LogitsProcessorOutput, logits_fn: LogitsFn, fb: ForwardBatch) -> None:
    """Fill out.input_token_logprobs / input_top_logprobs (per request, [] when not asked)."""
    bs = fb.batch_size
    token_lp: list[list[float | None]] = [[] for _ in range(bs)]
    top_lp: list[list[list[tuple[float, int]]]] = [[] for _ in range(bs)]
    asks = list(zip(fb.top_logprobs_nums or [0] * bs, fb.logprob_token_ids or [None] * bs))
    # rows per logits slice, so one slice holds at most _LOGPROB_CHUNK_ELEMENTS logits
    step = max(1, _LOGPROB_CHUNK_ELEMENTS // out.next_token_logits.shape[-1])
    offset = 0
    for r, ext in enumerate(fb.extend_seq_lens_cpu):
        start = min(fb.extend_input_logprob_start_lens[r], ext)
        if start < ext:
            values, tops = _segment_logprobs(logits_fn, fb, offset, start, ext, asks[r], step)
            if start == 0:  # chunk position 0 is predicted by the previous chunk
                head_value, head_top = _carried_head(fb, r, int(fb.input_ids[offset]), asks[r])
                values, tops = [head_value, *values], [head_top, *tops]
            token_lp[r], top_lp[r] = values, tops
            _store_carry(
                fb,
                offset + ext - 1,
                fb.seq_lens_cpu[r],
                torch.log_softmax(out.next_token_logits[r], dim=-1),
            )
        offset += ext
    out.input_token_logprobs, out.input_top_logprobs = token_lp, top_lp


def _segment_logprobs(
    logits_fn: LogitsFn,
    fb: ForwardBatch,
    offset: int,
    start: int,
    ext: int,
    ask: tuple[int, list[int] | None],
    step: int,
):
    """Logprobs of chunk positions max(start, 1) .. ext-1, from the rows before each,
    and their listed logprobs; ask = (top k, asked token ids)."""
    first = max(start - 1, 0)
    rows = torch.arange(offset + first, offset + ext - 1, device=fb.input_ids.device)
    targets = fb.input_ids[offset + first + 1 : offset + ext]
    values: list[float | None] = []
    tops: list[list[tuple[float, int]]] = []
    for i in range(0, rows.shape[0], step):
        logprobs = torch.log_softmax(logits_fn(rows[i : i + step]), dim=-1)  # [n, vocab]
        picked = logprobs.gather(1, targets[i : i + step].unsqueeze(1)).squeeze(1)
        values.extend(picked.tolist())
        tops.extend(listed(logprobs, *ask))
    return values, tops


def _carried_head(fb: ForwardBatch, r: int, token_id: int, ask: tuple[int, list[int] | None]):
    """(logprob, listed logprobs) of chunk position 0, from the row an earlier forward
    carried.

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
    return float(entry[1][token_id]), listed(entry[1].unsqueeze(0), *ask)[0]


def _store_carry(fb: ForwardBatch, last_token_idx: int, seq_len: int, row: torch.Tensor) -> None:
    """Keep the logprobs that follow this chunk, keyed by its last token's KV slot."""
    carry = fb.logprob_carry
    if carry is None:
        return
    carry[int(fb.out_cache_loc[last_token_idx])] = (seq_len, row.clone())
    while len(carry) > _MAX_CARRIED:
        carry.pop(next(iter(carry)))
