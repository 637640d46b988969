"""Last-token pooling, and loading a headless (embedding) checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.pooler import Pooler
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_context

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             head_dim=16, tie_word_embeddings=False)  # fmt: skip


def _extend_batch(extend_lens: list[int]) -> ForwardBatch:
    n = sum(extend_lens)
    zeros = torch.zeros(n, dtype=torch.int64)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=len(extend_lens), input_ids=zeros,
        positions=zeros, req_pool_indices=torch.arange(len(extend_lens)),
        seq_lens=torch.tensor(extend_lens), out_cache_loc=zeros, seq_lens_cpu=extend_lens,
        extend_seq_lens_cpu=extend_lens,
    )  # fmt: skip


def test_pooler_takes_each_requests_last_row_normalised():
    hidden = torch.randn(9, 6)
    out = Pooler()(hidden, _extend_batch([3, 1, 5])).embeddings
    want = torch.nn.functional.normalize(hidden[[2, 3, 8]], dim=-1)
    assert out.dtype == torch.float32 and torch.allclose(out, want)
    assert torch.allclose(out.norm(dim=-1), torch.ones(3))
    raw = Pooler(normalize=False)(hidden, _extend_batch([9])).embeddings
    assert torch.equal(raw, hidden[[8]])


def test_pooler_refuses_a_decode_step():
    batch = _extend_batch([1])
    batch.forward_mode = ForwardMode.DECODE
    with pytest.raises(ValueError, match="prefill"):
        Pooler()(torch.randn(1, 4), batch)


@pytest.fixture
def headless_dir(tmp_path):
    """A Qwen3 checkpoint saved from the base model (no `model.` prefix, no lm_head), with
    config.json naming Qwen3ForCausalLM, as Qwen3-Embedding ships."""
    from transformers import AutoModel, Qwen3Config

    torch.manual_seed(0)
    base = AutoModel.from_config(Qwen3Config(**SMALL), dtype=torch.float32).eval()
    base.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path, base


def _worker(model_dir) -> TpModelWorker:
    with get_context().override_server_args(
        model_path=str(model_dir), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        return TpModelWorker(ModelConfig(str(model_dir)))


def test_headless_checkpoint_loads_for_embedding_only(headless_dir):
    model_dir, base = headless_dir
    worker = _worker(model_dir)
    model = worker.model_runner.model
    assert model.has_lm_head is False
    assert torch.equal(model.model.norm.weight, base.norm.weight)
    assert torch.equal(model.model.embed_tokens.weight, base.embed_tokens.weight)
    worker.check_can_embed()
    with pytest.raises(ValueError, match="--is-embedding"):
        worker.check_can_generate()
