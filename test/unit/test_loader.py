"""Checkpoint loading: sharded safetensors, tied embeddings, Mistral configs, dummy
weights, and the errors a bad checkpoint or model path gives."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_loader.loader import get_model
from sglang.srt.model_loader.weight_utils import resolve_model_path
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_logits
from sglang.test.runner_utils import MiniReq, MiniScheduler

SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
PROMPT = [5, 17, 300, 42, 42, 7, 99, 100, 1, 2]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _save_hf(tmp_path, config, **save_kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path, **save_kw)
    return model


def _our_last_logits(model_dir, load_format=None) -> torch.Tensor:
    with get_context().override_server_args(
        model_path=str(model_dir), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(model_dir)), load_format=load_format)
    sched = MiniScheduler(worker)
    req = MiniReq(PROMPT)
    return worker.forward_batch_logits(sched.build_extend([req])).next_token_logits[0]


def _config(kind: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    if kind == "mistral":
        return MistralConfig(**SMALL, sliding_window=None)
    if kind == "qwen2_tied":
        return Qwen2Config(**SMALL, tie_word_embeddings=True)
    return LlamaConfig(**SMALL, tie_word_embeddings=kind == "llama_tied")


@pytest.mark.parametrize("kind", ["mistral", "llama_tied", "qwen2_tied"])
def test_config_variants_match_hf(tmp_path, kind):
    hf = _save_hf(tmp_path, _config(kind))
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    hf = _save_hf(tmp_path, _config("llama"), max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_dummy_load_format_needs_only_config(tmp_path):
    _config("llama").save_pretrained(tmp_path)
    logits = _our_last_logits(tmp_path, load_format="dummy")
    assert logits.shape == (512,) and torch.isfinite(logits).all()


def test_unsupported_architecture_lists_supported(tmp_path):
    config = _config("llama")
    config.architectures = ["FooForCausalLM"]
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"FooForCausalLM.*supported: .*LlamaForCausalLM"):
        get_model(ModelConfig(str(tmp_path)), "cpu", "dummy")


def test_missing_and_corrupt_weights_name_the_file(tmp_path):
    _config("llama").save_pretrained(tmp_path)
    cfg = ModelConfig(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        get_model(cfg, "cpu", "safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RuntimeError, match="model.safetensors"):
        get_model(cfg, "cpu", "auto")


def test_hub_id_offline_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model_path("no-such-org/no-such-model")


def test_update_weights_from_disk(tmp_path):
    from transformers import LlamaConfig

    a, b, bad = tmp_path / "a", tmp_path / "b", tmp_path / "bad"
    _save_hf(a, _config("llama"))
    torch.manual_seed(1)
    from transformers import AutoModelForCausalLM

    hf_b = AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float32).eval()
    hf_b.save_pretrained(b)
    _save_hf(bad, LlamaConfig(**{**SMALL, "hidden_size": 32}))
    with get_context().override_server_args(
        model_path=str(a), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(a)))
    sched = MiniScheduler(worker)

    def last_logits():
        req = MiniReq(PROMPT)
        out = worker.forward_batch_logits(sched.build_extend([req])).next_token_logits[0]
        sched.release([req])
        return out

    before = last_logits()
    ok, message = worker.update_weights_from_disk(str(bad))
    assert not ok and "hidden_size" in message
    torch.testing.assert_close(last_logits(), before)
    ok, _ = worker.update_weights_from_disk(str(b))
    assert ok
    torch.testing.assert_close(last_logits(), hf_logits(hf_b, PROMPT)[-1], atol=1e-4, rtol=0)
