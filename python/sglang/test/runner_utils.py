"""A minimal scheduler for driving a TpModelWorker in tests and benchmarks.

It does the scheduler's bookkeeping for a TpModelWorker: a req_to_token row
per request, KV slots from the allocator written into that row, and
ModelWorkerBatch objects for extend (prefill, chunked prefill, prefix hits)
and decode steps. No policy: the caller says what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang.srt.layers import cpu_kernels, fused_decode
from sglang.srt.model_executor.forward_batch_info import (
    ForwardMode,
    GenerationBatchResult,
    ModelWorkerBatch,
)
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class MiniReq:
    """One request. Token regions: all_ids[:kv_len] have KV in the pool."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_len: int = 0  # tokens whose KV is cached (and whose slots are in req_to_token)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class MiniScheduler:
    def __init__(self, worker) -> None:
        self.worker = worker
        self.runner = worker.model_runner
        self.vocab_size = worker.model_config.vocab_size

    # -- bookkeeping ------------------------------------------------------------------

    def _assign_rows(self, reqs: list[MiniReq]) -> None:
        new = [r for r in reqs if r.req_pool_idx is None]
        rows = self.runner.req_to_token_pool.alloc(len(new))
        assert rows is not None, "out of request slots"
        for req, row in zip(new, rows):
            req.req_pool_idx = row

    def _alloc_slots(self, reqs: list[MiniReq], new_lens: list[int]) -> torch.Tensor:
        """Allocate KV slots for each request's new tokens and write them into req_to_token."""
        allocator = self.runner.token_to_kv_pool_allocator
        if allocator.page_size == 1:
            locs = allocator.alloc(sum(new_lens))
        else:  # each request fills its own pages
            table = self.runner.req_to_token_pool.req_to_token
            last = [int(table[r.req_pool_idx, r.kv_len - 1]) if r.kv_len else -1 for r in reqs]
            seq_lens = [r.kv_len + n for r, n in zip(reqs, new_lens)]
            locs = allocator.alloc_extend([r.kv_len for r in reqs], seq_lens, last)
        assert locs is not None, "out of KV slots"
        offset = 0
        for req, n in zip(reqs, new_lens):
            self.runner.req_to_token_pool.write(
                (req.req_pool_idx, slice(req.kv_len, req.kv_len + n)), locs[offset : offset + n]
            )
            offset += n
        return locs

    def release(self, reqs: list[MiniReq]) -> None:
        """Free each request's KV slots and row."""
        table = self.runner.req_to_token_pool.req_to_token
        for req in reqs:
            if req.req_pool_idx is None:
                continue
            slots = table[req.req_pool_idx, : req.kv_len].to(torch.int64)
            self.runner.token_to_kv_pool_allocator.free(slots)
            self.runner.req_to_token_pool.free(req.req_pool_idx)
            req.req_pool_idx, req.kv_len = None, 0

    def sampling_info(self, reqs: list[MiniReq]) -> SamplingBatchInfo:
        return SamplingBatchInfo.from_requests(
            [r.params for r in reqs],
            [r.output_ids for r in reqs],
            self.vocab_size,
            self.runner.device,
            eos_token_ids=self.worker.model_config.eos_token_ids,
            prompt_ids=[r.prompt_ids for r in reqs],
        )

    # -- steps ----------------------------------------------------------------------

    def build_extend(
        self,
        reqs: list[MiniReq],
        chunk_lens: list[int] | None = None,
        return_logprob: bool = False,
        logprob_start_lens: list[int] | None = None,
        top_logprobs_num: int = 0,
    ) -> ModelWorkerBatch:
        """An EXTEND batch adding each request's next `chunk_lens` uncached tokens (default: all)."""
        self._assign_rows(reqs)
        if chunk_lens is None:
            chunk_lens = [len(r.all_ids) - r.kv_len for r in reqs]
        prefix_lens = [r.kv_len for r in reqs]
        locs = self._alloc_slots(reqs, chunk_lens)
        ids = [t for r, n in zip(reqs, chunk_lens) for t in r.all_ids[r.kv_len : r.kv_len + n]]
        for req, n in zip(reqs, chunk_lens):
            req.kv_len += n
        return ModelWorkerBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
            seq_lens=torch.tensor([r.kv_len for r in reqs], dtype=torch.int64),
            out_cache_loc=locs,
            extend_seq_lens=list(chunk_lens),
            extend_prefix_lens=prefix_lens,
            sampling_info=self.sampling_info(reqs),
            return_logprob=return_logprob,
            top_logprobs_nums=[top_logprobs_num] * len(reqs),
            extend_input_logprob_start_lens=logprob_start_lens or list(chunk_lens),
        )

    def build_decode(
        self, reqs: list[MiniReq], return_logprob: bool = False, top_logprobs_num: int = 0
    ) -> ModelWorkerBatch:
        """A DECODE batch feeding each request's last output token."""
        assert all(len(r.all_ids) - r.kv_len == 1 for r in reqs), "decode needs one new token"
        locs = self._alloc_slots(reqs, [1] * len(reqs))
        for req in reqs:
            req.kv_len += 1
        return ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=torch.tensor([r.all_ids[-1] for r in reqs], dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
            seq_lens=torch.tensor([r.kv_len for r in reqs], dtype=torch.int64),
            out_cache_loc=locs,
            sampling_info=self.sampling_info(reqs),
            return_logprob=return_logprob,
            top_logprobs_nums=[top_logprobs_num] * len(reqs),
        )

    def run(self, reqs: list[MiniReq], batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Forward + sample; appends each request's new token."""
        result = self.worker.forward_batch_generation(batch)
        for req, tok in zip(reqs, result.next_token_ids):
            req.output_ids.append(tok)
        return result

    def generate(self, reqs: list[MiniReq], max_new_tokens: int) -> list[list[int]]:
        """Prefill all, then decode all together for max_new_tokens - 1 steps (no stops)."""
        self.run(reqs, self.build_extend(reqs))
        for _ in range(max_new_tokens - 1):
            self.run(reqs, self.build_decode(reqs))
        outputs = [list(r.output_ids) for r in reqs]
        self.release(reqs)
        return outputs


def greedy_on_kernel_and_torch(
    worker, prompts: list[list[int]], max_new_tokens: int, monkeypatch
) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy outputs of `prompts` decoded by the CPU kernels, then with them disabled
    (the torch path over the same pool). Asserts decode reached the kernel: the paged
    attention op itself, or a fused C++ layer, which calls it."""
    kernels = cpu_kernels.load()
    calls = []
    real_attention, real_layer = kernels.paged_attention, fused_decode.run_layer
    monkeypatch.setattr(
        kernels, "paged_attention", lambda *a: calls.append(1) or real_attention(*a)
    )
    monkeypatch.setattr(fused_decode, "run_layer", lambda *a: calls.append(1) or real_layer(*a))
    sched = MiniScheduler(worker)
    with_kernel = sched.generate([MiniReq(list(p)) for p in prompts], max_new_tokens)
    assert calls, "decode did not take the kernel"
    with cpu_kernels.disabled():
        torch_path = sched.generate([MiniReq(list(p)) for p in prompts], max_new_tokens)
    return with_kernel, torch_path
