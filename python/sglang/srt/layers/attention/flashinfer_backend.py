"""Attention in FlashInfer's paged kernels (NVIDIA CUDA, float16/bfloat16).

Our pool stores one tensor per layer, [num_slots, 2, Hkv, D] (K at [:, 0], V at
[:, 1]). Viewed as [num_slots, 2, 1, Hkv, D] it is FlashInfer's NHD paged layout
with pages of one token, so a KV slot id is a page id and the page table of a
batch is its `req_to_token` rows (`build_kv_page_table` with page_size 1), whatever
page size our allocator uses.

FlashInfer binds the softmax scale, sliding window and logit cap when it plans, so
the backend keeps one wrapper per distinct (window, cap, scale) among the model's
attention layers (one for most models, two for alternating-window ones) and plans
each once per forward:

    decode                        BatchDecodeWithPagedKVCacheWrapper
    extend over a cached prefix   BatchPrefillWithPagedKVCacheWrapper, causal: a new
    and target verify (k + 1      token at chunk offset i sees keys [0, prefix + i]
    new tokens per request)       (bottom-right aligned), the new K/V written first

flashinfer is imported here, when a runner builds this backend, never at package
import (it is the optional `cuda` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.srt.arg_groups.attention_support import flashinfer_unavailable_reason
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, attention_layers

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's float scratch (split-KV partial outputs)
FLASHINFER_PAGE_SIZE = 1  # one token per page: a slot id is a page id (module docstring)
_TENSOR_CORE_MIN_GROUP = 4  # GQA group from which decode runs on the prefill (MMA) kernels


def build_kv_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    num_pages_total: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page table of a batch, from the request-to-token table.

    req_to_token: int32[rows, max_len] slot of each position, pages contiguous in slots
    (slot = page_idx * page_size + offset); req_pool_indices, seq_lens: int[bs].
    Returns, all int32 on req_to_token's device:

        kv_indptr        [bs + 1]  request b's pages are kv_indices[indptr[b]:indptr[b + 1]]
        kv_indices       [pages]   page ids (slot // page_size of each page's first token)
        kv_last_page_len [bs]      tokens in each request's last page, in [1, page_size]

    A request of seq_len 0 has no pages and last_page_len 0. `num_pages_total` (the sum of
    pages, known on the host from seq_lens_cpu) saves a device-to-host sync.
    """
    device = req_to_token.device
    seq_lens = seq_lens.to(device, torch.int64)
    num_pages = (seq_lens + page_size - 1) // page_size  # int64[bs]
    kv_indptr = torch.zeros(seq_lens.numel() + 1, dtype=torch.int64, device=device)
    kv_indptr[1:] = torch.cumsum(num_pages, 0)
    if num_pages_total is None:
        num_pages_total = int(kv_indptr[-1])
    req = torch.repeat_interleave(
        torch.arange(seq_lens.numel(), device=device), num_pages, output_size=num_pages_total
    )  # int64[pages]: the request each page belongs to
    page_in_req = torch.arange(num_pages_total, device=device) - kv_indptr[req]
    rows = req_pool_indices.to(device, torch.int64)[req]
    first_slots = req_to_token[rows, page_in_req * page_size]
    kv_indices = torch.div(first_slots, page_size, rounding_mode="floor")
    last_page_len = seq_lens - (num_pages - 1).clamp(min=0) * page_size
    return kv_indptr.to(torch.int32), kv_indices.to(torch.int32), last_page_len.to(torch.int32)


@dataclass(frozen=True)
class _Variant:
    """What FlashInfer binds at plan time, per attention layer."""

    window: int | None  # keys a query sees, itself included; None = all
    logit_cap: float | None
    scaling: float

    @classmethod
    def of(cls, layer: RadixAttention) -> _Variant:
        return cls(layer.sliding_window_size, layer.logit_cap, layer.scaling)

    def plan_kwargs(self) -> dict:
        # FlashInfer's window_left counts the keys left of the query: window - 1
        window_left = -1 if self.window is None else self.window - 1
        return {"window_left": window_left, "logits_soft_cap": self.logit_cap,
                "sm_scale": self.scaling}  # fmt: skip


@dataclass(frozen=True)
class _Heads:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def plan_args(self) -> tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, FLASHINFER_PAGE_SIZE


class FlashInferAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, runner) -> None:
        import flashinfer

        layers = attention_layers(runner.model)
        self.device = runner.device
        self.q_dtype, self.kv_dtype = runner.model_config.dtype, runner.kv_cache_dtype
        self.heads = _require_runnable(self.device, layers, self.q_dtype, self.kv_dtype)
        self.max_context_len = runner.req_to_token_pool.max_context_len
        self._flashinfer = flashinfer
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        group = self.heads.num_qo_heads // self.heads.num_kv_heads
        self.use_tensor_cores = group >= _TENSOR_CORE_MIN_GROUP
        self.variants = sorted({_Variant.of(layer) for layer in layers}, key=repr)
        self._prefill = {v: self._prefill_wrapper() for v in self.variants}
        self._decode = {v: self._decode_wrapper() for v in self.variants}
        self._active: dict[_Variant, object] = {}  # the wrappers planned for this forward
        # CUDA graphs: {batch size: {variant: decode wrapper on static buffers}}
        self._graph_decode: dict[int, dict[_Variant, object]] = {}

    def _prefill_wrapper(self):
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")

    def _decode_wrapper(self, **graph_buffers):
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores, **graph_buffers
        )

    # -- per forward --------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode():
            self._plan_decode(self._decode, forward_batch)
        else:
            self._plan_extend(forward_batch)

    def _page_table(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return build_kv_page_table(
            fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens,
            FLASHINFER_PAGE_SIZE, num_pages_total=sum(fb.seq_lens_cpu),
        )  # fmt: skip

    def _plan_decode(self, wrappers: dict, fb: ForwardBatch) -> None:
        indptr, indices, last_page_len = self._page_table(fb)
        for variant, wrapper in wrappers.items():
            wrapper.plan(
                indptr, indices, last_page_len, *self.heads.plan_args,
                q_data_type=self.q_dtype, kv_data_type=self.kv_dtype, **variant.plan_kwargs(),
            )  # fmt: skip
        self._active = wrappers

    def _plan_extend(self, fb: ForwardBatch) -> None:
        indptr, indices, last_page_len = self._page_table(fb)
        extend_lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32)
        qo_indptr = torch.zeros(len(extend_lens) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.cumsum(extend_lens, 0)
        qo_indptr = qo_indptr.to(self.device)
        for variant, wrapper in self._prefill.items():
            wrapper.plan(
                qo_indptr, indptr, indices, last_page_len, *self.heads.plan_args,
                causal=True, q_data_type=self.q_dtype, kv_data_type=self.kv_dtype,
                **variant.plan_kwargs(),
            )  # fmt: skip
        self._active = self._prefill

    # -- CUDA graphs (decode) -----------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        # one page-id buffer shared by every captured size: each replay plans first
        self._graph_kv_indices = torch.zeros(
            max_bs * self.max_context_len, dtype=torch.int32, device=self.device
        )

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        self._graph_decode[bs] = {v: self._graph_decode_wrapper(bs) for v in self.variants}
        self._plan_decode(self._graph_decode[bs], forward_batch)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        self._plan_decode(self._graph_decode[forward_batch.batch_size], forward_batch)

    def _graph_decode_wrapper(self, bs: int):
        return self._decode_wrapper(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
            paged_kv_indices_buffer=self._graph_kv_indices,
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=self.device),
        )

    # -- per layer ----------------------------------------------------------------------

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch, save_kv_cache)

    def _run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        fb: ForwardBatch,
        save_kv_cache: bool,
    ) -> torch.Tensor:
        """q: [T, Hq * D]; k, v: [T, Hkv * D] -> [T, Hq * D]. New K/V are written first."""
        t, hq, hkv, d = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        pool = fb.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(
                layer.layer_id, fb.out_cache_loc, k.view(t, hkv, d), v.view(t, hkv, d)
            )
        kv = pool.get_kv_buffer(layer.layer_id).unsqueeze(2)  # [slots, 2, page 1, Hkv, D]
        wrapper = self._active[_Variant.of(layer)]
        out = wrapper.run(q.reshape(t, hq, d).contiguous(), kv)  # [T, Hq, D]
        return out.view(t, hq * d)


def _require_runnable(
    device: torch.device, layers: list, q_dtype: torch.dtype, kv_dtype: torch.dtype
) -> _Heads:
    """The layers' head shape, or a RuntimeError naming why FlashInfer cannot run them."""
    heads = {_Heads(x.tp_q_head_num, x.tp_k_head_num, x.head_dim) for x in layers}
    if len(heads) != 1:
        raise RuntimeError(f"attention backend 'flashinfer': layers differ in heads {heads}")
    (shape,) = heads
    if q_dtype != kv_dtype:
        raise RuntimeError(
            f"attention backend 'flashinfer': model dtype {q_dtype} and KV cache dtype "
            f"{kv_dtype} differ; use --kv-cache-dtype auto"
        )
    dtype_name = str(kv_dtype).removeprefix("torch.")
    reason = flashinfer_unavailable_reason(device.type, dtype_name, shape.head_dim)
    if reason is not None:
        raise RuntimeError(f"attention backend 'flashinfer' cannot run on {device}: {reason}")
    return shape
