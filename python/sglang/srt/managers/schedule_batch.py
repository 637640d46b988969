"""Scheduler-side request state and the two batch shapes (prefill, decode).

Token regions of one request (all_ids = origin_input_ids + output_ids):

    [0, cache_protected_len)   KV owned by the prefix cache, locked via last_node
    [cache_protected_len, kv_len)
                               KV owned by the request (req_to_token row)
    [kv_len, len(all_ids))     no KV yet: the next extend (or, in decode, the
                               single last token) computes it
While decoding, kv_len == len(all_ids) - 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.managers.request_errors import aborted_reason
from sglang.srt.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch
from sglang.srt.sampling.penalties import RunningTokenCounts
from sglang.srt.sampling.sampling_batch_info import has_penalty

if TYPE_CHECKING:
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

# Cap on the output tokens a request is assumed to still need, for admission.
CLIP_MAX_NEW_TOKENS = 4096


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length, "matched": None}


def finish_stop(matched: int | str | None) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_abort(message: str, status_code: int | None = None) -> dict[str, Any]:
    reason = aborted_reason(message)
    if status_code is not None:
        reason["status_code"] = status_code
    return reason


class Req:
    """One request's state in the scheduler."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        *,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        logprob_token_ids: list[int] | None = None,
        logprob_start_len: int = -1,
        stream: bool = False,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.output_ids: list[int] = []
        self.sampling_params = sampling_params
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        # token ids whose logprobs every position lists (SGLang's token_ids_logprob)
        self.logprob_token_ids = logprob_token_ids or []
        self.logprob_start_len = logprob_start_len
        self.stream = stream
        self.parent_rid: str | None = None  # the request whose sample this is (n > 1)
        # require_reasoning: the grammar starts after this token (constrained/reasoning_gate)
        self.reasoning_end_token_id: int | None = None
        max_new = sampling_params.max_new_tokens
        self.max_new_tokens = CLIP_MAX_NEW_TOKENS if max_new is None else max_new
        # Nothing but its length (or an abort) can end this request: it will take all of
        # its remaining_new_tokens, so admission reserves them in full (not a guess).
        self.ends_by_length_only = sampling_params.ends_by_length_only
        self.finished_reason: dict[str, Any] | None = None
        # memory (see the region table above)
        self.req_pool_idx: int | None = None
        self.kv_len = 0
        self.cache_protected_len = 0
        self.last_node: Any = None
        # this step's extend (prefill batches only)
        self.extend_len = 0
        self.is_chunked = False
        self.num_cached_tokens = 0
        self.admitted_once = False
        # queue time: arrival at the scheduler -> first admission into a prefill batch
        self.arrival_time_s = time.monotonic()
        self.queue_time_s: float | None = None
        # streaming progress: output_ids[:send_offset] already sent
        self.send_offset = 0
        self.sent_decode_params = False
        self.logprobs = LogprobState() if return_logprob else None
        # constrained decoding: this request's matcher (constrained/base.Grammar), set
        # once its grammar compiled; None for an unconstrained request
        self.grammar: Any = None
        self._init_speculation_state()
        # embedding servers: the pooled vector, once the whole prompt is prefilled
        self.embedding: list[float] | None = None

    def _init_speculation_state(self) -> None:
        """Speculative decoding: decode rounds this request took part in, and its draft
        runner state (STANDALONE: row in the draft's pools, positions with draft KV,
        this round's starting position; NGRAM: the index of all_ids())."""
        self.spec_verify_ct = 0
        self.draft_pool_idx: int | None = None
        self.draft_kv_len = 0
        self.draft_round_base: int | None = None
        self.ngram_index: Any = None  # speculative.ngram.NgramIndex

    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def remaining_new_tokens(self) -> int:
        return min(self.max_new_tokens - len(self.output_ids), CLIP_MAX_NEW_TOKENS)

    def needs_fresh_sampling_info(self) -> bool:
        """Sampling tensors that change with every generated token (seeded draws, a pending
        min_new_tokens ban, penalties over the outputs so far)."""
        p = self.sampling_params
        return (
            p.seed is not None
            or len(self.output_ids) < p.min_new_tokens
            or p.frequency_penalty != 0.0
            or p.presence_penalty != 0.0
            or p.repetition_penalty != 1.0
        )

    def lists_logprobs(self) -> bool:
        """Whether each position lists logprobs beyond its own token's (the k best, or
        asked token ids)."""
        return bool(self.top_logprobs_num or self.logprob_token_ids)

    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and not self.output_ids

    def max_prefix_len(self) -> int:
        """At least one token must be computed (its logits give the next token).

        With input logprobs from position s, the prefix stops before s - 1: the
        logprob of token s comes from the row of token s - 1, which must be computed
        (a cached prefix carries no logits)."""
        limit = self.seq_len - 1
        if self.wants_input_logprobs():
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return limit

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, in={len(self.origin_input_ids)}, out={len(self.output_ids)})"


@dataclass
class LogprobState:
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    # the logprobs of the asked token ids (token_ids_logprob), per position
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_sent: bool = False


def logprob_token_ids(reqs: list[Req]) -> list[list[int]] | None:
    """Each request's asked token ids ([] = none), for a batch's ModelWorkerBatch; None
    when no request asks (the model side then lists the k best only)."""
    asked = [r.logprob_token_ids if r.return_logprob else [] for r in reqs]
    return asked if any(asked) else None


# ----------------------------------------------------------------------------
# Prefill (EXTEND) batches
# ----------------------------------------------------------------------------


@dataclass
class PrefillBatch:
    """Requests admitted this step; each computes tokens [kv_len, kv_len + extend_len)."""

    reqs: list[Req]
    # int64[sum(extend_len)]: KV slots of the new tokens, in request order
    out_cache_loc: torch.Tensor
    prefix_lens: list[int]
    forward_mode: ForwardMode = ForwardMode.EXTEND
    # --enable-mixed-chunk: the last num_decoding reqs are running (decode-phase)
    # requests riding along, one row each (their last output token, at kv_len); they
    # stay in the running batch.
    num_decoding: int = 0

    @property
    def prefill_reqs(self) -> list[Req]:
        return self.reqs[: len(self.reqs) - self.num_decoding]

    @property
    def decoding_reqs(self) -> list[Req]:
        return self.reqs[len(self.reqs) - self.num_decoding :]

    def to_worker_batch(self, sampling_info: SamplingBatchInfo) -> ModelWorkerBatch:
        reqs = self.reqs
        input_ids: list[int] = []
        for req, prefix_len in zip(reqs, self.prefix_lens):
            input_ids.extend(_extend_tokens(req, prefix_len))
        extend_lens = [r.extend_len for r in reqs]
        return ModelWorkerBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
            seq_lens=torch.tensor(
                [p + e for p, e in zip(self.prefix_lens, extend_lens)], dtype=torch.int64
            ),
            out_cache_loc=self.out_cache_loc,
            sampling_info=sampling_info,
            extend_seq_lens=extend_lens,
            extend_prefix_lens=list(self.prefix_lens),
            return_logprob=any(r.return_logprob for r in reqs),
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in reqs],
            logprob_token_ids=logprob_token_ids(reqs),
            extend_input_logprob_start_lens=[
                _input_logprob_start(r, p) for r, p in zip(reqs, self.prefix_lens)
            ],
        )


def _extend_tokens(req: Req, prefix_len: int) -> list[int]:
    end = prefix_len + req.extend_len
    n_in = len(req.origin_input_ids)
    if end <= n_in:
        return req.origin_input_ids[prefix_len:end]
    if prefix_len >= n_in:  # outputs only (a decoding request's row): no all_ids() copy
        return req.output_ids[prefix_len - n_in : end - n_in]
    return req.all_ids()[prefix_len:end]


def _input_logprob_start(req: Req, prefix_len: int) -> int:
    """First chunk position whose input logprob is asked (extend_len = none).

    While a request wants input logprobs, each chunk asks at least for its last
    position, so the worker carries that row to score the next chunk's first token;
    positions before `logprob_start_len` are dropped when the result comes back."""
    if not req.wants_input_logprobs():
        return req.extend_len
    return min(max(req.logprob_start_len - prefix_len, 0), req.extend_len - 1)


# ----------------------------------------------------------------------------
# The running (DECODE) batch
# ----------------------------------------------------------------------------


class RunningBatch:
    """Requests in the decode phase, with step-invariant tensors cached.

    The cached tensors are rebuilt only when membership changes; seq_lens is
    advanced in place after each decode step.
    """

    def __init__(self) -> None:
        self.reqs: list[Req] = []
        self._req_pool_indices: torch.Tensor | None = None  # int64[bs]
        self._seq_lens: torch.Tensor | None = None  # int64[bs], kv_len before the step
        self._sampling_info: SamplingBatchInfo | None = None
        self._token_counts: RunningTokenCounts | None = None  # while a request has a penalty

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, reqs: list[Req]) -> None:
        if reqs:
            self.reqs.extend(reqs)
            self._invalidate()

    def remove(self, gone: list[Req]) -> None:
        if gone:
            ids = {id(r) for r in gone}
            self.reqs = [r for r in self.reqs if id(r) not in ids]
            self._invalidate()

    def _invalidate(self) -> None:
        self._req_pool_indices = self._seq_lens = self._sampling_info = None

    def req_pool_indices(self) -> torch.Tensor:
        if self._req_pool_indices is None:
            idx = [r.req_pool_idx for r in self.reqs]
            self._req_pool_indices = torch.tensor(idx, dtype=torch.int64)
        return self._req_pool_indices

    def kv_lens(self) -> torch.Tensor:
        if self._seq_lens is None:
            self._seq_lens = torch.tensor([r.kv_len for r in self.reqs], dtype=torch.int64)
        return self._seq_lens

    def cached_sampling_info(self) -> SamplingBatchInfo | None:
        return self._sampling_info

    def set_sampling_info(self, info: SamplingBatchInfo | None) -> None:
        self._sampling_info = info

    def penalty_counts(
        self, vocab_size: int, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(int32[bs, vocab] counts of each request's outputs so far, bool[bs, vocab] its
        prompt's tokens), kept up to date step by step; None (and nothing kept) while no
        request uses a penalty."""
        if not any(has_penalty(r.sampling_params) for r in self.reqs):
            self._token_counts = None
            return None
        if self._token_counts is None:
            self._token_counts = RunningTokenCounts(vocab_size, device)
        reqs = self.reqs
        repetition = any(r.sampling_params.repetition_penalty != 1.0 for r in reqs)
        prompts = [r.origin_input_ids for r in reqs] if repetition else None
        counts = self._token_counts.update(reqs, [r.output_ids for r in reqs], prompts)
        return counts, self._token_counts.prompt_seen

    def lens_changed(self) -> None:
        """Requests' kv_len moved by different amounts (a verify step): rebuild seq_lens."""
        self._seq_lens = None

    def advance(self) -> None:
        """After a decode step every request holds one more token of KV."""
        for req in self.reqs:
            req.kv_len += 1
        if self._seq_lens is not None:
            self._seq_lens += 1

    def to_worker_batch(
        self, out_cache_loc: torch.Tensor, sampling_info: SamplingBatchInfo
    ) -> ModelWorkerBatch:
        reqs = self.reqs
        return_logprob = any(r.return_logprob for r in reqs)
        return ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64),
            req_pool_indices=self.req_pool_indices(),
            seq_lens=self.kv_lens() + 1,
            out_cache_loc=out_cache_loc,
            sampling_info=sampling_info,
            return_logprob=return_logprob,
            top_logprobs_nums=[r.top_logprobs_num for r in reqs] if return_logprob else None,
            logprob_token_ids=logprob_token_ids(reqs),
        )
