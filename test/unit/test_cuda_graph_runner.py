"""The pure parts of CUDA-graph decode, on cpu: captured sizes, padding to a size, when a
runner captures nothing, and the static inputs' padding rows. The capture and replay
themselves need a GPU (test/gpu/test_gpu_cuda_graph.py)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.model_executor.cuda_graph_runner import (
    _StaticInputs,
    cuda_graph_batch_sizes,
    cuda_graph_skip_reason,
    default_cuda_graph_max_bs,
    padded_batch_size,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


def test_batch_sizes():
    assert cuda_graph_batch_sizes(160) == [1, 2, 4, 8, *range(16, 161, 8)]
    assert cuda_graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert cuda_graph_batch_sizes(3) == [1, 2, 3]
    assert cuda_graph_batch_sizes(1) == [1]
    assert cuda_graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]


@pytest.mark.parametrize(
    "bs, padded", [(1, 1), (3, 4), (8, 8), (9, 16), (17, 24), (159, 160), (160, 160), (161, None)]
)
def test_padded_batch_size(bs, padded):
    assert padded_batch_size(bs, cuda_graph_batch_sizes(160)) == padded


def test_every_batch_up_to_max_fits_its_padded_size():
    sizes = cuda_graph_batch_sizes(100)
    for bs in range(1, 101):
        size = padded_batch_size(bs, sizes)
        assert size >= bs and size - bs < 8 and size in sizes


def test_default_max_bs():
    assert default_cuda_graph_max_bs(2048) == 160
    assert default_cuda_graph_max_bs(48) == 48


def _reason(**kw):
    args = dict(device="cuda", disabled=False, supports_cuda_graph=True, backend="triton",
                tp_size=1, is_draft=False, is_embedding=False) | kw  # fmt: skip
    return cuda_graph_skip_reason(**args)


def test_when_a_runner_captures():
    assert _reason() is None
    assert "only on CUDA devices" in _reason(device="cpu")
    assert _reason(disabled=True) == "--disable-cuda-graph"
    assert "torch_native" in _reason(supports_cuda_graph=False, backend="torch_native")
    assert "tp_size 2" in _reason(tp_size=2)
    assert "draft" in _reason(is_draft=True)
    assert "embedding" in _reason(is_embedding=True)


def test_static_inputs_load_pads_the_tail():
    inputs = _StaticInputs.allocate(8, torch.device("cpu"))
    for buf in (inputs.input_ids, inputs.positions, inputs.req_pool_indices, inputs.out_cache_loc):
        buf.fill_(99)  # what an earlier, larger batch left behind
    inputs.seq_lens.fill_(99)
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=3,
        input_ids=torch.tensor([5, 6, 7]), positions=torch.tensor([9, 1, 4]),
        req_pool_indices=torch.tensor([2, 0, 1]), seq_lens=torch.tensor([10, 2, 5]),
        out_cache_loc=torch.tensor([30, 31, 32]), seq_lens_cpu=[10, 2, 5],
    )  # fmt: skip
    inputs.load(fb, 4)
    assert inputs.input_ids[:5].tolist() == [5, 6, 7, 0, 99]
    assert inputs.seq_lens[:5].tolist() == [10, 2, 5, 1, 99]
    assert inputs.req_pool_indices[:4].tolist() == [2, 0, 1, 0]
    assert inputs.out_cache_loc[:4].tolist() == [30, 31, 32, 0]
    assert inputs.positions[:4].tolist() == [9, 1, 4, 0]


def test_cpu_runner_has_no_graph_runner(tiny_llama_dir):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(
        model_path=str(tiny_llama_dir), device="cpu", max_total_tokens=256
    ):
        worker = TpModelWorker(ModelConfig(str(tiny_llama_dir)))
    assert worker.model_runner.graph_runner is None
