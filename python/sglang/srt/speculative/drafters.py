"""Where draft tokens come from: n-gram lookup in the request's own tokens, or a small
draft model (STANDALONE) with its own ModelRunner and KV pool beside the target.

A drafter answers `propose(reqs, budgets)` with up to budgets[i] draft tokens per
request (and, for sampled requests of a model drafter, the distributions they were
drawn from), `commit(req, num_accepted)` after the target verified them, and
`release(req)` when the request leaves the running batch (finished, aborted,
retracted).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch
from sglang.srt.speculative.ngram import NgramIndex
from sglang.srt.speculative.verify import target_probs

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.tp_worker import TpModelWorker

logger = logging.getLogger(__name__)


class NgramDrafter:
    """Prompt/output lookup: what followed the longest earlier match of the sequence's end."""

    draws_from_q = False  # its drafts are point masses

    def __init__(self, min_window: int, max_window: int) -> None:
        self.min_window, self.max_window = min_window, max_window

    def propose(self, reqs: list[Req], budgets: list[int]) -> tuple[list[list[int]], None]:
        return [self._index(r).propose(k) if k else [] for r, k in zip(reqs, budgets)], None

    def _index(self, req: Req) -> NgramIndex:
        """The request's index of its tokens, brought up to date with new outputs."""
        index = req.ngram_index
        if index is None:
            index = req.ngram_index = NgramIndex(req.all_ids(), self.min_window, self.max_window)
        else:
            index.append(req.output_ids[len(index) - len(req.origin_input_ids) :])
        return index

    def commit(self, req: Req, num_accepted: int) -> None:
        pass

    def release(self, req: Req) -> None:
        req.ngram_index = None

    def live_figures(self) -> dict[str, Any]:
        return {}


class StandaloneDrafter:
    """A draft model of the same tokenizer, run k steps ahead of the target.

    Draft KV per request (its own pools): `req.draft_kv_len` positions are computed.
    A round starting at target kv_len L (token L = the last, without KV) first
    extends the draft over [draft_kv_len, L + 1) (catch-up: the whole prompt after
    admission, usually one token later), drawing d_1, then decodes d_1 .. d_{k-1},
    drawing d_2 .. d_k: the draft then holds KV for [0, L + k). After the target
    accepted n drafts, positions L .. L + min(n, k - 1) saw accepted inputs: the
    draft keeps [0, L + min(n + 1, k)) and frees the rest at once.
    """

    # Sampled drafts come from a distribution q (verified by rejection sampling against
    # the target's p); a deterministic drafter's are point masses.
    draws_from_q = True

    def __init__(self, worker: TpModelWorker, target_vocab_size: int | None = None) -> None:
        """target_vocab_size: the width of the target's rows, which q rows are padded to
        (a draft's vocabulary may be smaller: Qwen2.5-0.5B 151,936 vs 7B's 152,064)."""
        self.worker = worker
        runner = worker.model_runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.max_total_num_tokens = runner.max_total_num_tokens
        self.vocab_size = worker.model_config.vocab_size
        self.q_width = max(target_vocab_size or 0, self.vocab_size)

    # ------------------------------------------------------------------ propose

    @torch.inference_mode()
    def propose(
        self, reqs: list[Req], budgets: list[int]
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Drafts per request, and float32 [sum(len(d)), vocab] draft distributions (rows
        of greedy requests are unused) or None when every drafting request is greedy."""
        drafts: list[list[int]] = [[] for _ in reqs]
        q_rows: list[list[torch.Tensor]] = [[] for _ in reqs]
        active = self._fitting(reqs, budgets)
        for i in active:
            reqs[i].draft_round_base = reqs[i].kv_len
        logits = self._extend(reqs, active)
        for step in range(max((budgets[i] for i in active), default=0)):
            if step > 0:
                active = [i for i in active if len(drafts[i]) < budgets[i]]
                active = active[: self.allocator.available_size()]  # one slot each
                if not active:
                    break
                logits = self._decode(reqs, active, drafts)
            self._draw(reqs, active, logits, drafts, q_rows)
        sampled = [row for i, rows in enumerate(q_rows) for row in rows]
        has_q = any(not reqs[i].sampling_params.is_greedy for i, d in enumerate(drafts) if d)
        return drafts, (torch.stack(sampled) if has_q else None)

    def _fitting(self, reqs: list[Req], budgets: list[int]) -> list[int]:
        """Requests that draft this round: a draft row each, and room in the draft pool for
        their catch-up extends (the k - 1 decode steps take what is left, one slot each)."""
        free = self.allocator.available_size()
        active = []
        for i, (req, budget) in enumerate(zip(reqs, budgets)):
            if budget <= 0 or not self._has_row(req):
                continue
            need = req.kv_len + 1 - req.draft_kv_len
            if need <= free:
                active.append(i)
                free -= need
        return active

    def _has_row(self, req: Req) -> bool:
        if req.draft_pool_idx is None:
            if self.req_to_token_pool.available_size() == 0:
                return False
            req.draft_pool_idx = self.req_to_token_pool.alloc(1)[0]
            req.draft_kv_len = 0
        return True

    def _extend(self, reqs: list[Req], active: list[int]) -> torch.Tensor | None:
        """Catch each active request's draft KV up to its last token; logits [n, vocab]."""
        if not active:
            return None
        input_ids, prefix_lens, extend_lens, locs = [], [], [], []
        for i in active:
            req = reqs[i]
            start, end = req.draft_kv_len, req.kv_len + 1
            loc = self.allocator.alloc(end - start)
            self.req_to_token_pool.write((req.draft_pool_idx, slice(start, end)), loc)
            input_ids += req.all_ids()[start:end]
            prefix_lens.append(start)
            extend_lens.append(end - start)
            locs.append(loc)
            req.draft_kv_len = end
        batch = ModelWorkerBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=self._known_ids(torch.tensor(input_ids, dtype=torch.int64)),
            req_pool_indices=torch.tensor([reqs[i].draft_pool_idx for i in active]),
            seq_lens=torch.tensor([reqs[i].draft_kv_len for i in active]),
            out_cache_loc=torch.cat(locs).to(torch.int64),
            extend_seq_lens=extend_lens,
            extend_prefix_lens=prefix_lens,
        )
        return self.worker.forward_batch_logits(batch).next_token_logits

    def _decode(self, reqs: list[Req], active: list[int], drafts: list[list[int]]) -> torch.Tensor:
        """One draft step: input each request's newest draft token; logits [n, vocab]."""
        loc = self.allocator.alloc(len(active))
        for slot, i in zip(loc.tolist(), active):
            req = reqs[i]
            self.req_to_token_pool.write((req.draft_pool_idx, req.draft_kv_len), torch.tensor(slot))
            req.draft_kv_len += 1
        batch = ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=self._known_ids(
                torch.tensor([drafts[i][-1] for i in active], dtype=torch.int64)
            ),
            req_pool_indices=torch.tensor([reqs[i].draft_pool_idx for i in active]),
            seq_lens=torch.tensor([reqs[i].draft_kv_len for i in active]),
            out_cache_loc=loc.to(torch.int64),
        )
        return self.worker.forward_batch_logits(batch).next_token_logits

    def _known_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Target tokens past the draft's vocabulary (ids its embedding lacks) read as
        its last id: a worse guess for the next draft, never a wrong output (the target
        verifies every draft)."""
        return ids.clamp_(max=self.vocab_size - 1)

    def _draw(self, reqs, active, logits, drafts, q_rows) -> None:
        """Greedy requests draft the argmax; sampled ones draw from their filtered q."""
        logits = logits[:, : self.vocab_size]
        best = logits.argmax(dim=-1).tolist()  # one reduction for every greedy row
        for row, i in enumerate(active):
            params = reqs[i].sampling_params
            if params.is_greedy:
                drafts[i].append(best[row])
                q_rows[i].append(logits.new_zeros(self.q_width))  # unused: greedy
                continue
            q = target_probs(
                logits[row : row + 1],
                torch.tensor([params.temperature]),
                torch.tensor([params.effective_top_k]),
                torch.tensor([params.top_p]),
                torch.tensor([params.min_p]),
            )[0]
            drafts[i].append(int(torch.multinomial(q, 1)))
            # tokens past the draft's vocabulary are never drafted: q is 0 there
            q_rows[i].append(torch.nn.functional.pad(q, (0, self.q_width - q.shape[-1])))

    # ------------------------------------------------------------------ after verify

    def commit(self, req: Req, num_accepted: int) -> None:
        """Keep the draft KV whose inputs the target accepted; free the rest now."""
        if req.draft_pool_idx is None or req.draft_round_base is None:
            return
        base, computed = req.draft_round_base, req.draft_kv_len
        keep = min(base + num_accepted + 1, computed)
        self._free_positions(req, keep, computed)
        req.draft_kv_len, req.draft_round_base = keep, None

    def release(self, req: Req) -> None:
        if req.draft_pool_idx is None:
            return
        self._free_positions(req, 0, req.draft_kv_len)
        self.req_to_token_pool.free(req.draft_pool_idx)
        req.draft_pool_idx, req.draft_kv_len, req.draft_round_base = None, 0, None

    def _free_positions(self, req: Req, start: int, end: int) -> None:
        if end > start:
            row = self.req_to_token_pool.req_to_token[req.draft_pool_idx]
            self.allocator.free(row[start:end].to(torch.int64).clone())

    def live_figures(self) -> dict[str, Any]:
        return {
            "draft_max_total_num_tokens": self.max_total_num_tokens,
            "draft_available_kv_tokens": self.allocator.available_size(),
            "draft_free_req_slots": self.req_to_token_pool.available_size(),
            "draft_total_req_slots": self.req_to_token_pool.size,
        }
