"""Attention in our own Triton kernels over the paged KV pool (CUDA and ROCm).

Decode splits each request's keys over several programs and merges the pieces
(`triton_ops/decode_attention.py`), so a long context uses many GPU cores; extend
attends the cached prefix through `req_to_token`, then the new tokens causally
(`triton_ops/extend_attention.py`). Both read the page table token by token, so any
page size works, and honour the layer's sliding window and logit cap.

On cpu the kernels run only in the Triton interpreter (TRITON_INTERPRET=1, set before
the kernel modules are imported): that is for correctness tests, not for speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, attention_layers

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

# Decode: a request gets one split per this many keys, at most _MAX_KV_SPLITS of them
_MIN_KEYS_PER_SPLIT = 256
_MAX_KV_SPLITS = 8


@dataclass
class _ExtendMetadata:
    extend_start: torch.Tensor  # int64[bs]: first row of each request's new tokens
    extend_lens: torch.Tensor  # int64[bs]
    max_extend_len: int


@dataclass
class _DecodeMetadata:
    # int32[bs] by attention window (None = full): how many pieces each request's keys
    # are split into; a window's entry is built when its first layer runs
    num_kv_splits: dict[int | None, torch.Tensor]
    # float32 scratch by (Hq, D): [bs, Hq, max_kv_splits, D] and [bs, Hq, max_kv_splits]
    scratch: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _GraphBuffers:
    """Static decode metadata for CUDA graphs, rows [0, bs) used by a graph of size bs."""

    num_kv_splits: dict[int | None, torch.Tensor]  # int32[max_bs] by attention window
    scratch: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # as _DecodeMetadata

    def metadata(self, bs: int) -> _DecodeMetadata:
        splits = {w: buf[:bs] for w, buf in self.num_kv_splits.items()}
        scratch = {key: (out[:bs], lse[:bs]) for key, (out, lse) in self.scratch.items()}
        return _DecodeMetadata(splits, scratch)


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(
        self,
        runner,
        max_kv_splits: int = _MAX_KV_SPLITS,
        min_keys_per_split: int = _MIN_KEYS_PER_SPLIT,
    ) -> None:
        self.device = runner.device
        require_triton(self.device)
        from sglang.srt.layers.attention.triton_ops import decode_attention, extend_attention

        if self.device.type == "cpu":
            _require_interpreted(decode_attention._decode_split_kernel)
        self._decode_fwd = decode_attention.decode_attention_fwd
        self._extend_fwd = extend_attention.extend_attention_fwd
        self.max_kv_splits, self.min_keys_per_split = max_kv_splits, min_keys_per_split
        self.metadata: _DecodeMetadata | _ExtendMetadata | None = None
        self._runner = runner  # its model's layers size the CUDA graph buffers
        self._graph: _GraphBuffers | None = None

    # -- per forward --------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        if fb.forward_mode.is_decode():
            self.metadata = _DecodeMetadata({None: self._num_kv_splits(fb, None)}, {})
            return
        ext = fb.extend_seq_lens_cpu
        lens = torch.tensor(ext, dtype=torch.int64)
        starts = torch.cumsum(lens, 0) - lens
        self.metadata = _ExtendMetadata(starts.to(self.device), lens.to(self.device), max(ext))

    def _num_kv_splits(self, fb: ForwardBatch, window: int | None) -> torch.Tensor:
        kv_lens = fb.seq_lens if window is None else fb.seq_lens.clamp(max=window)
        splits = (kv_lens + self.min_keys_per_split - 1) // self.min_keys_per_split
        return splits.clamp(1, self.max_kv_splits).to(torch.int32)

    def _decode_scratch(self, bs: int, hq: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        md: _DecodeMetadata = self.metadata
        if (hq, d) not in md.scratch:
            shape = (bs, hq, self.max_kv_splits)
            out = torch.empty(*shape, d, dtype=torch.float32, device=self.device)
            md.scratch[hq, d] = out, torch.empty(shape, dtype=torch.float32, device=self.device)
        return md.scratch[hq, d]

    # -- CUDA graphs (decode) -----------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        layers = attention_layers(self._runner.model)
        windows = {layer.sliding_window_size for layer in layers} | {None}
        shapes = {(layer.tp_q_head_num, layer.head_dim) for layer in layers}
        splits = {w: torch.ones(max_bs, dtype=torch.int32, device=self.device) for w in windows}
        self._graph = _GraphBuffers(splits, {})
        for hq, d in shapes:
            shape = (max_bs, hq, self.max_kv_splits)
            out = torch.empty(*shape, d, dtype=torch.float32, device=self.device)
            self._graph.scratch[hq, d] = (
                out,
                torch.empty(shape, dtype=torch.float32, device=self.device),
            )

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        self.init_forward_metadata_replay_cuda_graph(forward_batch)
        self.metadata = self._graph.metadata(forward_batch.batch_size)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        for window, buf in self._graph.num_kv_splits.items():
            buf[:bs].copy_(self._num_kv_splits(forward_batch, window))

    # -- per layer ----------------------------------------------------------------------

    def forward_decode(
        self,
        q,
        k,
        v,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        fb, md = forward_batch, self.metadata
        bs, hq, hkv, d = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        pool = fb.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(
                layer.layer_id, fb.out_cache_loc, k.view(bs, hkv, d), v.view(bs, hkv, d)
            )
        window = layer.sliding_window_size
        if window not in md.num_kv_splits:
            md.num_kv_splits[window] = self._num_kv_splits(fb, window)
        kv = pool.get_kv_buffer(layer.layer_id)  # [slots, 2, Hkv, D]
        out = q.new_empty(bs, hq, d)
        split_out, split_lse = self._decode_scratch(bs, hq, d)
        self._decode_fwd(
            q.view(bs, hq, d), kv[:, 0], kv[:, 1], out, fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, fb.seq_lens, md.num_kv_splits[window], split_out, split_lse,
            layer.scaling, layer.logit_cap, window,
        )  # fmt: skip
        return out.view(bs, hq * d)

    def forward_extend(
        self,
        q,
        k,
        v,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        fb, md = forward_batch, self.metadata
        t, hq, hkv, d = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        k, v = k.view(t, hkv, d), v.view(t, hkv, d)
        pool = fb.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        kv = pool.get_kv_buffer(layer.layer_id)  # [slots, 2, Hkv, D]
        out = q.new_empty(t, hq, d)
        self._extend_fwd(
            q.view(t, hq, d), k, v, out, kv[:, 0], kv[:, 1], fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, fb.seq_lens, md.extend_start, md.extend_lens,
            md.max_extend_len, layer.scaling, layer.logit_cap, layer.sliding_window_size,
        )  # fmt: skip
        return out.view(t, hq * d)


def require_triton(device: torch.device) -> None:
    """Raise, naming what is missing, unless the kernels can run on `device`."""
    from sglang.srt.arg_groups.attention_support import triton_unavailable_reason

    reason = triton_unavailable_reason(device.type)
    if reason is not None:
        raise RuntimeError(f"attention backend 'triton' cannot run on {device.type}: {reason}")


def _require_interpreted(kernel) -> None:
    """On cpu the kernels must have been decorated in interpreter mode."""
    if type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "attention backend 'triton' on cpu: its kernels were compiled for a GPU because "
            "triton_ops was imported before TRITON_INTERPRET=1 was set; set it at process start"
        )
