"""The attention backend interface (a plugin seam).

A backend runs the attention of every layer of one forward over the paged KV
pool. Per forward, the runner calls `init_forward_metadata(forward_batch)` once
before `model.forward`; each attention layer then calls `forward(...)`, which
writes the step's new K/V into the pool at `forward_batch.out_cache_loc` and
attends over each request's slots from `req_to_token`.

The caller must hold: a ForwardBatch whose `req_to_token` rows are written for
every position in [0, seq_len) of every request (the scheduler's job), and
`out_cache_loc` slots the allocator handed out for this step. The backend
mutates only the KV pool (at `out_cache_loc`) and its own metadata.

Per layer, `layer.sliding_window_size` (None = full) limits a query at position
q to keys in (q - window, q], and `layer.logit_cap` soft-caps the scores; a
backend must honour both in extend and decode.

CUDA graphs (decode only, `model_executor/cuda_graph_runner.py`): a backend that
sets `supports_cuda_graph` keeps its decode metadata in static buffers. The graph
runner calls `init_cuda_graph_state(max_bs)` once, then per captured batch size
`init_forward_metadata_capture_cuda_graph(fb)` before capturing, and before each
replay `init_forward_metadata_replay_cuda_graph(fb)`, which must only write into
the buffers captured for `fb.batch_size` (a padded batch: rows past the real ones
have seq_len 1, req_pool_index 0 and out_cache_loc 0, the padding slot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend:
    supports_cuda_graph = False

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Build the per-forward metadata (index tensors, masks) shared by all layers."""
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q: [T, Hq * D]; k, v: [T, Hkv * D] -> [T, Hq * D]."""
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        """New tokens attend to their cached prefix and causally to each other (within the
        layer's window)."""
        raise NotImplementedError

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        """One new token per request attends to its request's tokens (within the layer's
        window)."""
        raise NotImplementedError

    # -- CUDA graphs (decode) -------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        """Allocate the static decode metadata buffers for batches of up to `max_bs`."""
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Metadata for capturing a decode graph of `forward_batch.batch_size` rows."""
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Refresh the captured buffers of `forward_batch.batch_size` for this batch."""
        raise NotImplementedError


def attention_layers(model: torch.nn.Module) -> list[RadixAttention]:
    """Every attention layer of `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, RadixAttention)]


SUPPORTED_ATTENTION_BACKENDS = ("torch_native", "triton", "flashinfer")


def create_attention_backend(name: str | None, runner) -> AttentionBackend:
    """The backend named `name` (None = torch_native) for a ModelRunner."""
    name = name or "torch_native"
    if name == "torch_native":
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        return TorchNativeAttnBackend(runner)
    if name == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(runner)
    if name == "flashinfer":
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(runner)
    raise ValueError(
        f"unsupported attention backend {name!r}; supported: "
        f"{', '.join(SUPPORTED_ATTENTION_BACKENDS)}"
    )
