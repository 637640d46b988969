"""Attention with torch's scaled_dot_product_attention over the paged KV pool.

Works on any device. A ragged batch is padded to a dense [bs, heads, len, dim]
layout with a boolean mask; index tensors and masks are built once per forward
and attention window, so a layer costs a KV write, one gather and one SDPA call
(decode: one per cache-sized chunk of requests).

Sliding windows: a layer whose `sliding_window_size` is W lets the query at
position q see keys k with q - W < k <= q (W keys, itself included; HF's
`sliding_window`). Extend masks the keys outside the window; decode gathers only
each request's last W slots. Layers with a `logit_cap` (Gemma 2) soft-cap their
scores, cap * tanh(scores / cap), before the mask, in plain matmul attention.

KV outside every layer's window is not freed: the slots stay with their request
until it finishes (or in the radix cache), as for a full-attention model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import FP8_DTYPES

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class _DecodeChunk:
    """Consecutive requests (in length order) whose gathered K/V stay cache-sized."""

    rows: slice  # their rows in the length-sorted batch
    kv_indices: torch.Tensor  # int64[n * max_len]: slot ids, row-major; padding -> slot 0
    max_len: int
    mask: torch.Tensor | None  # bool[n, 1, 1, max_len]; None when all lengths agree


@dataclass
class _DecodeMetadata:
    order: torch.Tensor | None  # int64[bs]: batch rows by descending length; None = as is
    inverse: torch.Tensor | None  # int64[bs]: sorted position of each batch row
    chunks: list[_DecodeChunk]


@dataclass
class _ExtendMetadata:
    bs: int
    max_extend_len: int
    pad_index: torch.Tensor | None  # int64[num_tokens]: row in the [bs * max_ext] layout
    kv_indices: torch.Tensor | None  # int64[bs, max_seq_len]; None when nothing is cached
    mask: torch.Tensor | None  # bool[bs, 1, max_ext, kv_len]; None = plain causal
    use_causal: bool  # no mask: plain causal over equal-length, prefix-free requests


@dataclass
class _ReqExtend:
    """One request of a ragged extend batch, attended on its own."""

    token_start: int  # first row of this request in the batch's new tokens
    extend_len: int
    kv_indices: torch.Tensor | None  # int64[seq_len]; None when nothing is cached
    mask: torch.Tensor | None  # bool[1, 1, extend_len, seq_len]; None = plain causal


@dataclass
class _RaggedExtendMetadata:
    reqs: list[_ReqExtend]


@dataclass
class _KernelPaged:
    """Attention through the CPU paged-attention kernel, which reads req_to_token itself."""

    extend_lens: torch.Tensor  # int64[bs] new tokens per request; empty for decode


_Metadata = _DecodeMetadata | _ExtendMetadata | _RaggedExtendMetadata | _KernelPaged


# Pad a ragged extend batch to one SDPA call unless padding multiplies the work by more
_MAX_PAD_WASTE = 2.0
# Extends of at most this many new tokens per request (speculative verify, short chunks)
# take the CPU kernel's per-token path on any build; longer ones its tiled path where
# the build has it (`extend_tiled`: the vector build, head_dim a multiple of its vector
# width), else SDPA
_KERNEL_MAX_EXTEND = 16
# Pool dtypes the CPU kernels read (each with the q dtypes of kernel_takes)
KERNEL_POOL_DTYPES = (*cpu_kernels.SUPPORTED_DTYPES, *FP8_DTYPES)
# Decode gathers K/V for this many bytes of requests at a time: attention then reads the
# gathered copy from cache instead of memory (about 20% faster on CPU at batch 64).
# Requests are taken in length order, so each chunk pads only to its own longest
_DECODE_CHUNK_BYTES = 2 << 20


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, runner) -> None:
        self.device = runner.device
        # this forward's metadata by attention window (None = full attention); the full
        # one is built in init_forward_metadata, a window's when its first layer runs
        self.metadata: dict[int | None, _Metadata] = {}
        # decode gathers each chunk's K/V into this one buffer, so the copy stays in cache
        # (a fresh 2 MB tensor per chunk costs page faults): [slots, 2, Hkv, D]
        self.gather_buffer: torch.Tensor | None = None

    # -- per forward --------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.metadata = {None: self._build_metadata(forward_batch, None)}

    def _metadata_for(self, layer: RadixAttention, fb: ForwardBatch) -> _Metadata:
        window = layer.sliding_window_size
        if window not in self.metadata:
            self.metadata[window] = self._build_metadata(fb, window)
        return self.metadata[window]

    def _build_metadata(self, fb: ForwardBatch, window: int | None) -> _Metadata:
        extend_lens = self.kernel_extend_lens(fb)
        if extend_lens is not None:
            return _KernelPaged(extend_lens)
        if fb.forward_mode.is_decode():
            return self._decode_metadata(fb, window)
        return self._extend_metadata(fb, window)

    @staticmethod
    def _kv_indices(
        req_to_token_pool,
        pool_idx: torch.Tensor,
        seq_lens: torch.Tensor,
        max_len: int,
        window: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot ids int64[n, max_len] with padding -> 0, valid bool[n, max_len]): row i
        holds the slots of its request's last min(seq_len, window) tokens (all: None)."""
        table = req_to_token_pool.req_to_token
        cols = torch.arange(max_len, device=table.device)
        if window is None:
            idx = table[:, :max_len].index_select(0, pool_idx).to(torch.int64)
            kv_lens = seq_lens
        else:
            kv_lens = seq_lens.clamp(max=window)
            pos = ((seq_lens - kv_lens).unsqueeze(1) + cols).clamp(max=table.shape[1] - 1)
            idx = table[pool_idx.unsqueeze(1), pos].to(torch.int64)
        valid = cols.unsqueeze(0) < kv_lens.unsqueeze(1)
        return idx.masked_fill(~valid, 0), valid

    def kernel_extend_lens(self, fb: ForwardBatch) -> torch.Tensor | None:
        """The new tokens per request (int64[bs]; empty for decode) when the CPU kernel
        serves this forward's attention (for q in the pool's dtype, see kernel_takes),
        else None."""
        if not self._kernel_usable(fb):
            return None
        if fb.forward_mode.is_decode():
            return _NO_EXTEND_LENS
        return torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64)

    @staticmethod
    def _kernel_usable(fb: ForwardBatch) -> bool:
        """Decode, or an extend the kernel's per-token or tiled path takes, on CPU with
        the kernels."""
        pool = fb.token_to_kv_pool
        if pool.dtype not in KERNEL_POOL_DTYPES or not cpu_kernels.serves(fb.out_cache_loc):
            return False
        if fb.forward_mode.is_decode():
            return True
        if not fb.extend_seq_lens_cpu:
            return False
        longest = max(fb.extend_seq_lens_cpu)
        return longest <= _KERNEL_MAX_EXTEND or cpu_kernels.load().extend_tiled(
            longest, pool.head_dim
        )

    def _torch_metadata_for(self, layer: RadixAttention, fb: ForwardBatch) -> _Metadata:
        """This layer's metadata for the torch path. A kernel placeholder is replaced (the
        kernel was not taken: a pool dtype it cannot pair with q's, see kernel_takes)."""
        md = self._metadata_for(layer, fb)
        if isinstance(md, _KernelPaged):
            window = layer.sliding_window_size
            build = self._decode_metadata if fb.forward_mode.is_decode() else self._extend_metadata
            md = self.metadata[window] = build(fb, window)
        return md

    def _decode_metadata(self, fb: ForwardBatch, window: int | None) -> _DecodeMetadata:
        """Requests sorted by length (of what they attend to) and cut into chunks, each
        padded to its own longest."""
        lens = fb.seq_lens_cpu
        if window is not None:
            lens = [min(n, window) for n in lens]
        order_list = sorted(range(len(lens)), key=lambda i: -lens[i])
        sorted_lens = [lens[i] for i in order_list]
        order = inverse = None
        pool_idx, seq_lens = fb.req_pool_indices, fb.seq_lens
        if order_list != list(range(len(lens))):
            order = torch.tensor(order_list, dtype=torch.int64, device=self.device)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(len(lens), device=self.device)
            pool_idx, seq_lens = pool_idx.index_select(0, order), seq_lens.index_select(0, order)
        idx, valid = self._kv_indices(
            fb.req_to_token_pool, pool_idx, seq_lens, sorted_lens[0], window
        )
        kv = fb.token_to_kv_pool.get_kv_buffer(0)
        slot_bytes = kv[0].numel() * kv.element_size()
        chunks = []
        for rows in _chunk_rows(sorted_lens, _DECODE_CHUNK_BYTES // slot_bytes):
            top, bottom = sorted_lens[rows.start], sorted_lens[rows.stop - 1]
            mask = None if top == bottom else valid[rows, None, None, :top]
            chunks.append(_DecodeChunk(rows, idx[rows, :top].reshape(-1), top, mask))
        self._reserve_gather_buffer(kv, max(c.kv_indices.numel() for c in chunks))
        return _DecodeMetadata(order, inverse, chunks)

    def _reserve_gather_buffer(self, kv: torch.Tensor, num_slots: int) -> None:
        buf = self.gather_buffer
        if buf is None or buf.shape[0] < num_slots or buf.shape[1:] != kv.shape[1:]:
            self.gather_buffer = kv.new_empty(num_slots, *kv.shape[1:])

    def _extend_metadata(
        self, fb: ForwardBatch, window: int | None
    ) -> _ExtendMetadata | _RaggedExtendMetadata:
        ext, pre = fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu
        bs, max_ext = len(ext), max(ext)
        padded_work = bs * max_ext * max(fb.seq_lens_cpu)
        if padded_work > _MAX_PAD_WASTE * sum(e * s for e, s in zip(ext, fb.seq_lens_cpu)):
            return self._ragged_metadata(fb, window)
        uniform = min(ext) == max_ext
        pad_index = None if uniform else _pad_index(ext, max_ext, self.device)
        if not any(pre):
            if uniform and (window is None or max_ext <= window):  # plain causal suffices
                return _ExtendMetadata(bs, max_ext, pad_index, None, None, True)
            mask = _causal_mask([0] * bs, ext, max_ext, max_ext, self.device, window)
            return _ExtendMetadata(bs, max_ext, pad_index, None, mask, False)
        max_seq = max(fb.seq_lens_cpu)
        idx, _ = self._kv_indices(fb.req_to_token_pool, fb.req_pool_indices, fb.seq_lens, max_seq)
        mask = _causal_mask(pre, ext, max_ext, max_seq, self.device, window)
        return _ExtendMetadata(bs, max_ext, pad_index, idx, mask, False)

    def _ragged_metadata(self, fb: ForwardBatch, window: int | None) -> _RaggedExtendMetadata:
        table = fb.req_to_token_pool.req_to_token
        pool_indices = fb.req_pool_indices.tolist()
        reqs, start = [], 0
        for row, ext, pre in zip(pool_indices, fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu):
            idx = mask = None
            if pre:
                idx = table[row, : pre + ext].to(torch.int64)
            if pre or (window is not None and ext > window):
                mask = _causal_mask([pre], [ext], ext, pre + ext, self.device, window)
            reqs.append(_ReqExtend(start, ext, idx, mask))
            start += ext
        return _RaggedExtendMetadata(reqs)

    # -- per layer ----------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q: [T, Hq * D]; k, v: [T, Hkv * D] -> [T, Hq * D]: the CPU kernel when this
        forward's metadata chose it and it takes q's and the pool's dtypes, else the torch
        path."""
        md = self._metadata_for(layer, forward_batch)
        if isinstance(md, _KernelPaged) and kernel_takes(
            q.dtype, forward_batch.token_to_kv_pool.dtype
        ):
            return _kernel_attention(q, k, v, layer, forward_batch, md, save_kv_cache)
        return super().forward(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(
        self,
        q,
        k,
        v,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        md = self._torch_metadata_for(layer, forward_batch)
        pool = forward_batch.token_to_kv_pool
        bs, hq, hkv, d = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        if save_kv_cache:
            pool.set_kv_buffer(
                layer.layer_id, forward_batch.out_cache_loc, k.view(bs, hkv, d), v.view(bs, hkv, d)
            )
        # the query heads sharing a KV head become rows: [bs, Hkv, Hq / Hkv, D]
        qg = q.view(bs, hkv, hq // hkv, d)
        if md.order is not None:
            qg = qg.index_select(0, md.order)
        kv_buffer = pool.get_kv_buffer(layer.layer_id)
        out = torch.empty_like(qg)  # [bs, Hkv, Hq / Hkv, D], in length order
        for c in md.chunks:
            out[c.rows] = _decode_attn(qg[c.rows], kv_buffer, c, self.gather_buffer, layer)
        if md.inverse is not None:
            out = out.index_select(0, md.inverse)
        return out.reshape(bs, hq * d)

    def forward_extend(
        self,
        q,
        k,
        v,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        md = self._torch_metadata_for(layer, forward_batch)
        pool = forward_batch.token_to_kv_pool
        t, hq, hkv, d = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        k, v = k.view(t, hkv, d), v.view(t, hkv, d)
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        if isinstance(md, _RaggedExtendMetadata):
            return self._ragged_extend(q.view(t, hq, d), k, v, layer, pool, md)
        qp = self._pad(q.view(t, hq, d), md)  # [bs, Hq, max_ext, D]
        if md.kv_indices is None:  # nothing cached: attend over the new tokens only
            keys, values = self._pad(k, md), self._pad(v, md)
        else:
            kv = _gather(pool.get_kv_buffer(layer.layer_id), md.kv_indices)  # [bs, S, 2, Hkv, D]
            keys = kv[:, :, 0].transpose(1, 2).to(q.dtype)
            values = kv[:, :, 1].transpose(1, 2).to(q.dtype)
        out = _attention(qp, keys, values, md.mask, md.use_causal, layer)  # [bs, Hq, max_ext, D]
        return self._unpad(out, md, hq * d)

    @staticmethod
    def _ragged_extend(q, k, v, layer: RadixAttention, pool, md: _RaggedExtendMetadata):
        """q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq * D], one SDPA call per request."""
        kv_buffer = pool.get_kv_buffer(layer.layer_id)
        outs = []
        for r in md.reqs:
            rows = slice(r.token_start, r.token_start + r.extend_len)
            qi = q[rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, ext, D]
            if r.kv_indices is None:
                ki, vi = k[rows].transpose(0, 1), v[rows].transpose(0, 1)  # [Hkv, ext, D]
            else:
                kv = kv_buffer.index_select(0, r.kv_indices)  # [seq, 2, Hkv, D]
                ki, vi = kv[:, 0].transpose(0, 1).to(q.dtype), kv[:, 1].transpose(0, 1).to(q.dtype)
            out = _attention(qi, ki.unsqueeze(0), vi.unsqueeze(0), r.mask, r.mask is None, layer)
            outs.append(out[0].transpose(0, 1).reshape(r.extend_len, -1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    @staticmethod
    def _pad(x: torch.Tensor, md: _ExtendMetadata) -> torch.Tensor:
        """[T, H, D] -> [bs, H, max_ext, D] (zeros in padded rows)."""
        _, h, d = x.shape
        if md.pad_index is None:
            return x.view(md.bs, md.max_extend_len, h, d).transpose(1, 2)
        padded = x.new_zeros(md.bs * md.max_extend_len, h, d).index_copy_(0, md.pad_index, x)
        return padded.view(md.bs, md.max_extend_len, h, d).transpose(1, 2)

    @staticmethod
    def _unpad(out: torch.Tensor, md: _ExtendMetadata, width: int) -> torch.Tensor:
        """[bs, H, max_ext, D] -> [T, H * D]."""
        flat = out.transpose(1, 2).reshape(md.bs * md.max_extend_len, width)
        return flat if md.pad_index is None else flat.index_select(0, md.pad_index)


_NO_EXTEND_LENS = torch.empty(0, dtype=torch.int64)


def kernel_takes(q_dtype: torch.dtype, pool_dtype: torch.dtype) -> bool:
    """The kernel's dtype pairs: q in the pool's dtype, a float32 q (model) over a
    bf16/fp16 pool (--kv-cache-dtype bfloat16/float16: half the KV bytes to read), or a
    float32/bf16 q over an fp8 pool (--kv-cache-dtype fp8_e4m3/fp8_e5m2: a quarter)."""
    if pool_dtype in FP8_DTYPES:
        return q_dtype in (torch.float32, torch.bfloat16)
    return q_dtype == pool_dtype or (
        q_dtype == torch.float32 and pool_dtype in (torch.bfloat16, torch.float16)
    )


def _kernel_attention(
    q, k, v, layer: RadixAttention, fb: ForwardBatch, md: _KernelPaged, save_kv: bool
) -> torch.Tensor:
    """q: [T, Hq * D]; k, v: [T, Hkv * D] (rows may be strided views of one qkv output)
    -> [T, Hq * D]: the new K/V written into the pool and attention read from it, in C++."""
    out = q.new_empty(q.shape[0], layer.tp_q_head_num * layer.head_dim)
    cpu_kernels.load().paged_attention(
        out,
        q,
        k,
        v,
        fb.token_to_kv_pool.get_kv_buffer(layer.layer_id),
        fb.out_cache_loc,
        fb.req_to_token_pool.req_to_token,
        fb.req_pool_indices,
        fb.seq_lens,
        md.extend_lens,
        layer.scaling,
        layer.logit_cap or 0.0,
        layer.sliding_window_size or 0,
        save_kv,
    )
    return out


def _decode_attn(
    qg: torch.Tensor,
    kv_buffer: torch.Tensor,
    chunk: _DecodeChunk,
    gather_buffer: torch.Tensor,
    layer: RadixAttention,
) -> torch.Tensor:
    """qg: [n, Hkv, Hq / Hkv, D] -> [n, Hkv, Hq / Hkv, D], over the chunk's gathered K/V."""
    n, num_slots = qg.shape[0], chunk.kv_indices.numel()
    kv = gather_buffer[:num_slots]  # [n * S, 2, Hkv, D]
    torch.index_select(kv_buffer, 0, chunk.kv_indices, out=kv)
    kv = kv.view(n, chunk.max_len, *kv_buffer.shape[1:])
    keys = kv[:, :, 0].transpose(1, 2)  # [n, Hkv, S, D]
    values = kv[:, :, 1].transpose(1, 2)
    if keys.dtype != qg.dtype:
        keys, values = keys.to(qg.dtype), values.to(qg.dtype)
    return _attention(qg, keys, values, chunk.mask, False, layer)


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    layer: RadixAttention,
) -> torch.Tensor:
    """q: [..., Hq, L, D]; k, v: [..., Hkv, S, D] (Hq a multiple of Hkv) -> [..., Hq, L, D].

    SDPA, unless the layer soft-caps its scores: then the HF eager formula, op for op.
    """
    if not layer.logit_cap:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            scale=layer.scaling,
            enable_gqa=q.shape[-3] != k.shape[-3],
        )
    if q.shape[-3] != k.shape[-3]:  # query head h reads KV head h // group
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * layer.scaling  # [..., Hq, L, S]
    scores = torch.tanh(scores / layer.logit_cap) * layer.logit_cap
    if is_causal:
        q_len, kv_len = scores.shape[-2:]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _chunk_rows(sorted_lens: list[int], slots_per_chunk: int) -> list[slice]:
    """Cut requests sorted by descending length into runs whose padded K/V
    (count x first length) fit `slots_per_chunk` slots; at least one request each."""
    chunks, start = [], 0
    while start < len(sorted_lens):
        count = max(1, slots_per_chunk // sorted_lens[start])
        chunks.append(slice(start, min(start + count, len(sorted_lens))))
        start += count
    return chunks


def _gather(kv_buffer: torch.Tensor, kv_indices: torch.Tensor) -> torch.Tensor:
    """[num_slots, 2, H, D] gathered at int64[bs, S] -> [bs, S, 2, H, D].

    index_select, not advanced indexing: on CPU it is several times faster.
    """
    bs, seq = kv_indices.shape
    return kv_buffer.index_select(0, kv_indices.reshape(-1)).view(bs, seq, *kv_buffer.shape[1:])


def _pad_index(ext: list[int], max_ext: int, device) -> torch.Tensor:
    """int64[sum(ext)]: for each new token, its row b * max_ext + i in the padded layout."""
    ext_t = torch.tensor(ext, dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(ext)) * max_ext, ext_t)
    starts = torch.repeat_interleave(torch.cumsum(ext_t, 0) - ext_t, ext_t)
    return (rows + torch.arange(int(ext_t.sum())) - starts).to(device)


def _causal_mask(
    pre: list[int], ext: list[int], max_ext: int, kv_len: int, device, window: int | None = None
) -> torch.Tensor:
    """bool[bs, 1, max_ext, kv_len]: query i of request b (at position q = prefix + i) sees
    keys j <= q, j < seq, and with a window also j > q - window."""
    pre_t = torch.tensor(pre, dtype=torch.int64, device=device)
    seq_t = pre_t + torch.tensor(ext, dtype=torch.int64, device=device)
    q_pos = pre_t.unsqueeze(1) + torch.arange(max_ext, device=device)  # [bs, max_ext]
    k_pos = torch.arange(kv_len, device=device).view(1, 1, kv_len)
    mask = (k_pos <= q_pos.unsqueeze(2)) & (k_pos < seq_t.view(-1, 1, 1))
    if window is not None:
        mask &= k_pos > q_pos.unsqueeze(2) - window
    return mask.unsqueeze(1)
