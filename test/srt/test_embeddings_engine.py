"""Engine.encode on an `--is-embedding` Engine, against HF's last hidden state at the last
token, L2-normalised. The Engine serves the tiny Qwen3 saved headless, as Qwen3-Embedding
ships (the base model's tensors without `model.`, no lm_head), with the radix cache off
and chunks of 8 tokens; HF runs the original checkpoint."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer

from sglang.srt.sampling.param_types import InvalidParamError
from sglang.test.pool_checks import idle_pool_problems

pytestmark = pytest.mark.slow

TOL = 1e-4
PROMPTS = ["import os", "def add(a, b):\n    return a + b\n", "while True:\n    pass\n" * 3]


@pytest.fixture(scope="module")
def headless_dir(tiny_qwen3_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3-headless") / "model"
    shutil.copytree(tiny_qwen3_dir, path, ignore=shutil.ignore_patterns("*.safetensors*"))
    tensors = load_file(tiny_qwen3_dir / "model.safetensors")
    assert "lm_head.weight" in tensors  # untied: the headless copy really lacks a head
    base = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    save_file(base, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def engine(headless_dir):
    import sglang as sgl

    llm = sgl.Engine(
        model_path=str(headless_dir),
        is_embedding=True,
        disable_radix_cache=True,
        chunked_prefill_size=8,
        num_threads=1,
        log_level="warning",
        max_total_tokens=2048,
        context_length=256,
    )
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return AutoTokenizer.from_pretrained(tiny_qwen3_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_dir):
    return AutoModel.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()


@pytest.fixture(autouse=True)
def no_leaks(engine):
    yield
    state = engine.get_server_info()["internal_states"][0]
    assert not idle_pool_problems(state), (idle_pool_problems(state), state)


def hf_embedding(hf_model, input_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        hidden = hf_model(torch.tensor([input_ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def assert_close(out: dict, want: np.ndarray) -> None:
    got = np.array(out["embedding"])
    assert got.shape == want.shape and np.abs(got - want).max() < TOL


def test_one_prompt_and_a_list(engine, tokenizer, hf_model):
    one = engine.encode(PROMPTS[1])
    assert set(one) == {"embedding", "meta_info"}
    ids = tokenizer.encode(PROMPTS[1])
    assert one["meta_info"]["prompt_tokens"] == len(ids)
    assert one["meta_info"]["finish_reason"]["type"] == "length"
    assert_close(one, hf_embedding(hf_model, ids))
    many = engine.encode(PROMPTS)
    assert len(many) == len(PROMPTS)
    for out, prompt in zip(many, PROMPTS):
        assert_close(out, hf_embedding(hf_model, tokenizer.encode(prompt)))


def test_token_ids_and_async(engine, tokenizer, hf_model):
    ids = [tokenizer.encode(p) for p in PROMPTS]
    assert len(ids[2]) > 16  # several chunks of 8
    for out, one in zip(engine.encode(input_ids=ids), ids):
        assert_close(out, hf_embedding(hf_model, one))
    out = asyncio.run(engine.async_encode(input_ids=ids[0]))
    assert_close(out, hf_embedding(hf_model, ids[0]))


def test_refusals(engine):
    with pytest.raises(InvalidParamError, match="--is-embedding"):
        engine.generate("x", {"max_new_tokens": 2})
    with pytest.raises(InvalidParamError, match="does not support `dimensions`"):
        engine.encode("x", dimensions=8)
    with pytest.raises(InvalidParamError, match="empty"):
        engine.encode(input_ids=[])
