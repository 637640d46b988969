"""Decode forwards captured as CUDA graphs, replayed for batches padded to a captured size.

A decode step of a small batch is launch-bound: hundreds of small kernels whose
launch costs more than their work. Capturing the whole model forward once per batch
size in `cuda_graph_batch_sizes(max_bs)` turns a step into one graph launch.

The graph reads its inputs from static buffers (`_StaticInputs`) and the attention
backend's decode metadata from buffers the backend keeps for graphs (see the CUDA
graph section of `base_attn_backend`). A batch of `raw_bs` requests replays the graph
of the smallest captured size `bs >= raw_bs`; rows [raw_bs, bs) are padding:

    input_ids 0, positions 0, seq_len 1, req_pool_index 0, out_cache_loc 0

so a padding row writes its K/V into slot 0 (the pool's padding slot, which the
graph-capable backends never read) and reads one key from req_to_token[0, 0]; its
logits are dropped. Batches larger than the largest captured size run eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

DEFAULT_CUDA_GRAPH_MAX_BS = 160
_SMALL_SIZES = (1, 2, 4, 8)
_SIZE_STEP = 8  # captured sizes past 8: 16, 24, 32, ...
_WARMUP_RUNS = 2  # eager runs before a capture: Triton JIT, cuBLAS workspaces


def cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """The batch sizes captured for `max_bs`: 1, 2, 4, 8, then every 8th, then max_bs."""
    sizes = [s for s in _SMALL_SIZES if s <= max_bs]
    sizes += list(range(2 * _SIZE_STEP, max_bs + 1, _SIZE_STEP))
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def padded_batch_size(bs: int, captured: list[int]) -> int | None:
    """The smallest captured size that holds `bs` rows (sorted `captured`); None: too big."""
    for size in captured:
        if size >= bs:
            return size
    return None


def default_cuda_graph_max_bs(max_running_requests: int) -> int:
    return min(DEFAULT_CUDA_GRAPH_MAX_BS, max_running_requests)


def cuda_graph_skip_reason(
    device: str,
    disabled: bool,
    supports_cuda_graph: bool,
    backend: str | None,
    tp_size: int,
    is_draft: bool,
    is_embedding: bool,
) -> str | None:
    """Why a runner captures no graphs (None: it captures). Logged when the device is cuda."""
    if device != "cuda":
        return f"CUDA graphs exist only on CUDA devices, not {device}"
    if disabled:
        return "--disable-cuda-graph"
    if is_embedding:
        return "an embedding server only prefills"
    if is_draft:
        return "draft runners decode eagerly"
    if not supports_cuda_graph:
        return f"attention backend {backend!r} keeps no static decode metadata"
    if tp_size > 1:
        return f"tp_size {tp_size}: collectives are not captured yet"
    return None


@dataclass
class _StaticInputs:
    """The graphs' inputs, rows [0, bs) read by the graph of size bs."""

    input_ids: torch.Tensor  # int64[max_bs]
    positions: torch.Tensor  # int64[max_bs]
    req_pool_indices: torch.Tensor  # int64[max_bs]
    seq_lens: torch.Tensor  # int64[max_bs]
    out_cache_loc: torch.Tensor  # int64[max_bs]

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device) -> _StaticInputs:
        def zeros() -> torch.Tensor:
            return torch.zeros(max_bs, dtype=torch.int64, device=device)

        inputs = cls(zeros(), zeros(), zeros(), zeros(), zeros())
        inputs.seq_lens.fill_(1)
        return inputs

    def load(self, fb: ForwardBatch, bs: int) -> None:
        """Copy `fb`'s rows in and reset the padding rows [fb.batch_size, bs)."""
        raw = fb.batch_size
        for name in ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc"):
            static = getattr(self, name)
            static[:raw].copy_(getattr(fb, name))
            static[raw:bs].fill_(1 if name == "seq_lens" else 0)


class CudaGraphRunner:
    """Captures the runner's decode forward for each size of `cuda_graph_batch_sizes`."""

    def __init__(self, runner: ModelRunner, max_bs: int) -> None:
        self.runner = runner
        self.batch_sizes = cuda_graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        self.inputs = _StaticInputs.allocate(self.max_bs, runner.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # float32[bs, vocab]: each graph's output
        self.static_batches: dict[int, ForwardBatch] = {}
        runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self._capture_all()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    # -- capture ------------------------------------------------------------------------

    @torch.inference_mode()
    def _capture_all(self) -> None:
        start = time.perf_counter()
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.runner.device)
        # largest first: smaller graphs reuse the shared pool's blocks
        for bs in reversed(self.batch_sizes):
            self._capture(bs, pool, stream)
        torch.cuda.synchronize(self.runner.device)
        logger.info(
            "captured %d decode CUDA graphs (batch sizes %s) with %s attention in %.1f s",
            len(self.graphs),
            self.batch_sizes,
            self.runner.attention_backend_name,
            time.perf_counter() - start,
        )

    def _capture(self, bs: int, pool, stream: torch.cuda.Stream) -> None:
        fb = self._static_batch(bs, [1] * bs)
        self.static_batches[bs] = fb
        self.runner.attn_backend.init_forward_metadata_capture_cuda_graph(fb)
        stream.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP_RUNS):
                self._forward(fb)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            logits = self._forward(fb)
        self.graphs[bs], self.logits[bs] = graph, logits

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        return self.runner.model.forward(fb.input_ids, fb.positions, fb).next_token_logits

    def _static_batch(self, bs: int, seq_lens_cpu: list[int]) -> ForwardBatch:
        """A DECODE batch of `bs` rows over the static buffers."""
        s, runner = self.inputs, self.runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=s.input_ids[:bs],
            positions=s.positions[:bs],
            req_pool_indices=s.req_pool_indices[:bs],
            seq_lens=s.seq_lens[:bs],
            out_cache_loc=s.out_cache_loc[:bs],
            seq_lens_cpu=seq_lens_cpu,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
        )

    # -- replay -------------------------------------------------------------------------

    def replay(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        """The logits of decode batch `fb` (its attention metadata not built: the graph's
        buffers are refreshed here)."""
        raw_bs = fb.batch_size
        bs = padded_batch_size(raw_bs, self.batch_sizes)
        self.inputs.load(fb, bs)
        padded = replace(
            self.static_batches[bs], seq_lens_cpu=fb.seq_lens_cpu + [1] * (bs - raw_bs)
        )
        self.runner.attn_backend.init_forward_metadata_replay_cuda_graph(padded)
        self.graphs[bs].replay()
        return LogitsProcessorOutput(self.logits[bs][:raw_bs])
