"""The batch handed from the scheduler to the model worker, and its device-side form.

`ModelWorkerBatch` is plain data built by the scheduler (CPU tensors are fine).
`ForwardBatch` is what the model and the attention backend see: the same batch
on the runner's device, plus the pools and the backend.

Token regions of one request in an EXTEND step (positions are absolute):

    [0, prefix_len)            already in the KV cache (radix hit or earlier chunk)
    [prefix_len, seq_len)      this step's new tokens (extend_len of them); their
                               KV slots are `out_cache_loc`, already written into
                               `req_to_token` by the scheduler
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class ForwardMode(IntEnum):
    EXTEND = 1  # prefill, possibly on top of a cached prefix
    DECODE = 2  # one new token per request
    IDLE = 3  # nothing to run (a DP rank with no requests)

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass
class ModelWorkerBatch:
    """One step's batch, as the scheduler builds it (see interfaces.md section 2)."""

    forward_mode: ForwardMode
    input_ids: torch.Tensor  # int64[num_new_tokens]
    req_pool_indices: torch.Tensor  # int64[bs]
    seq_lens: torch.Tensor  # int64[bs], prefix + new, after this step
    out_cache_loc: torch.Tensor  # int64[num_new_tokens], already in req_to_token
    sampling_info: SamplingBatchInfo | None = None
    extend_seq_lens: list[int] | None = None  # EXTEND only: new tokens per request
    extend_prefix_lens: list[int] | None = None  # EXTEND only: cached tokens per request
    return_logprob: bool = False
    top_logprobs_nums: list[int] | None = None  # per request; 0 = none
    # per request: token ids whose logprobs it asks for ([] = none); None: no request asks
    logprob_token_ids: list[list[int]] | None = None
    # EXTEND only, per request: first chunk position whose input logprob is
    # wanted; == extend_seq_len means none.
    extend_input_logprob_start_lens: list[int] | None = None
    # EXTEND only: logits for every new token, not just each request's last
    # (speculative verification: row j scores the token after input j)
    return_all_logits: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])


@dataclass
class GenerationBatchResult:
    """What one forward + sample returns to the scheduler (plain Python data)."""

    next_token_ids: list[int]
    next_token_logprobs: list[float] | None = None
    next_token_top_logprobs: list[list[tuple[float, int]]] | None = None
    # Per request, one entry per chunk position in [start, extend_len): the
    # logprob of that position's token given all earlier tokens. Chunk position 0
    # is None for the first prompt token, and for a prefix this worker did not
    # just compute with return_logprob (a radix-cache hit); after an earlier chunk
    # of the same request that wanted input logprobs it is filled in.
    input_token_logprobs: list[list[float | None]] | None = None
    input_top_logprobs: list[list[list[tuple[float, int]]]] | None = None


@dataclass
class EmbeddingBatchResult:
    """What one embedding forward returns: per request, its pooled vector (float32,
    L2-normalised); for a request whose prefill is not finished (a chunk), the last
    chunk token's, which the scheduler ignores."""

    embeddings: list[list[float]]


@dataclass
class ForwardBatch:
    """A batch on the runner's device, as the model and attention backend see it."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # int64[num_tokens]
    positions: torch.Tensor  # int64[num_tokens], absolute positions
    req_pool_indices: torch.Tensor  # int64[bs]
    seq_lens: torch.Tensor  # int64[bs]
    out_cache_loc: torch.Tensor  # int64[num_tokens]
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    req_to_token_pool: ReqToTokenPool | None = None
    token_to_kv_pool: MHATokenToKVPool | None = None
    attn_backend: AttentionBackend | None = None
    return_logprob: bool = False
    top_logprobs_nums: list[int] | None = None
    logprob_token_ids: list[list[int]] | None = None
    extend_input_logprob_start_lens: list[int] | None = None
    sampling_info: SamplingBatchInfo | None = None
    return_all_logits: bool = False
    # input logprobs across chunk boundaries: the runner's {kv_slot: (seq_len, row)}
    logprob_carry: dict | None = field(default=None, repr=False)
    req_pool_indices_cpu: list[int] | None = None

    @classmethod
    def init_new(cls, batch: ModelWorkerBatch, runner) -> ForwardBatch:
        """Move `batch` to the runner's device and build the attention metadata once."""
        device = runner.device
        seq_lens_cpu = batch.seq_lens.tolist()
        fb = cls(
            forward_mode=batch.forward_mode,
            batch_size=batch.batch_size,
            input_ids=batch.input_ids.to(device, torch.int64),
            positions=_positions(batch, seq_lens_cpu).to(device),
            req_pool_indices=batch.req_pool_indices.to(device, torch.int64),
            seq_lens=batch.seq_lens.to(device, torch.int64),
            out_cache_loc=batch.out_cache_loc.to(device, torch.int64),
            seq_lens_cpu=seq_lens_cpu,
            extend_seq_lens_cpu=batch.extend_seq_lens,
            extend_prefix_lens_cpu=batch.extend_prefix_lens,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            return_logprob=batch.return_logprob,
            top_logprobs_nums=batch.top_logprobs_nums,
            logprob_token_ids=batch.logprob_token_ids,
            extend_input_logprob_start_lens=batch.extend_input_logprob_start_lens,
            sampling_info=batch.sampling_info,
            return_all_logits=batch.return_all_logits,
        )
        _drop_overwritten_carry(runner.logprob_carry, batch.out_cache_loc)
        if batch.return_logprob and batch.forward_mode.is_extend():
            fb.logprob_carry = runner.logprob_carry
            fb.req_pool_indices_cpu = batch.req_pool_indices.tolist()
        if not fb.forward_mode.is_idle() and not runner.replays_cuda_graph(fb):
            runner.attn_backend.init_forward_metadata(fb)  # a graph replay builds its own
        return fb


def _drop_overwritten_carry(carry: dict, out_cache_loc: torch.Tensor) -> None:
    """Carried logprob rows are keyed by KV slot: a slot written again invalidates its row."""
    if carry:
        for slot in set(carry).intersection(out_cache_loc.tolist()):
            del carry[slot]


def _positions(batch: ModelWorkerBatch, seq_lens_cpu: list[int]) -> torch.Tensor:
    """int64[num_tokens]: absolute position of each new token."""
    if batch.forward_mode.is_decode():
        return batch.seq_lens.to(torch.int64) - 1
    if batch.forward_mode.is_idle():
        return torch.empty(0, dtype=torch.int64)
    prefix = torch.tensor(batch.extend_prefix_lens, dtype=torch.int64)
    ext = torch.tensor(batch.extend_seq_lens, dtype=torch.int64)
    # position = prefix_len of the token's request + offset inside its chunk
    starts = torch.repeat_interleave(prefix, ext)
    offsets = torch.arange(int(ext.sum()), dtype=torch.int64) - torch.repeat_interleave(
        torch.cumsum(ext, 0) - ext, ext
    )
    return starts + offsets
