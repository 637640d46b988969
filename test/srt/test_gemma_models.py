"""Sliding-window models vs HF transformers: Gemma 2, Gemma 3 (text), a Qwen2 config with
`use_sliding_window` and a Mistral config, on tiny checkpoints whose window (16 tokens) the prompts exceed.

Covers interleaved sliding / global layers, attention and final logit soft-capping
(gemma2), the (1 + weight) norms, embedding and query scaling, and windowed attention
in every backend path: padded and ragged extend, extend over a cached prefix, chunked
prefill with chunks shorter than the window, and decode past the window.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_greedy, hf_logits, hf_prompt_logprobs, load_hf_model
from sglang.test.make_tiny_model import SLIDING_WINDOW
from sglang.test.runner_utils import MiniReq, MiniScheduler

pytestmark = pytest.mark.slow

ARCHS = ["gemma2", "gemma3", "qwen2_swa", "mistral_swa"]
LOGPROB_TOL = 1e-3
GREEDY_TOKENS = 32
LAYOUTS = {"ragged": 0.0, "padded": 1e9}  # torch_native_backend._MAX_PAD_WASTE

PROMPTS = [
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = "
    "path\n        self.items = []\n\n    def load(self):\n        with open(self.path) as f:",
    "Return a list of the words in the string, using sep as the delimiter string. If maxsplit "
    "is given, at most maxsplit splits are done.",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox",
]


@pytest.fixture(autouse=True)
def _few_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tiny_model_dir):
    """(worker, HF model, tokenized prompts) for one arch."""
    model_dir = str(tiny_model_dir(request.param))
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, max_running_requests=8
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    assert len(prompts[0]) > 2 * SLIDING_WINDOW and len(prompts[-1]) < SLIDING_WINDOW
    yield worker, load_hf_model(model_dir), prompts
    worker.token_to_kv_pool_allocator.check_integrity()


def test_config_windows(setup):
    worker, _, _ = setup
    config = worker.model_config
    windows = config.layer_windows
    sliding_only = config.model_type == "mistral"  # else sliding and full layers interleave
    assert set(windows) == ({SLIDING_WINDOW} if sliding_only else {None, SLIDING_WINDOW})
    assert config.context_len > SLIDING_WINDOW  # no longer capped to the window
    layers = worker.model_runner.model.model.layers
    assert [layer.self_attn.attn.sliding_window_size for layer in layers] == windows


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prompt_logprobs_match_hf(setup, monkeypatch, layout):
    from sglang.srt.layers.attention import torch_native_backend

    worker, hf, prompts = setup
    monkeypatch.setattr(torch_native_backend, "_MAX_PAD_WASTE", LAYOUTS[layout])
    sched = MiniScheduler(worker)
    reqs = [MiniReq(p) for p in prompts]
    batch = sched.build_extend(reqs, return_logprob=True, logprob_start_lens=[0] * len(reqs))
    result = sched.run(reqs, batch)
    for prompt, ours in zip(prompts, result.input_token_logprobs):
        torch.testing.assert_close(
            torch.tensor(ours[1:]),
            torch.tensor(hf_prompt_logprobs(hf, prompt)),
            atol=LOGPROB_TOL,
            rtol=0,
        )
    sched.release(reqs)


def test_greedy_matches_hf(setup, monkeypatch):
    """Batched decode past the window (requests of different lengths, one decode chunk each
    too) gives HF's greedy tokens."""
    from sglang.srt.layers.attention import torch_native_backend

    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    expected = [hf_greedy(hf, p, GREEDY_TOKENS) for p in prompts]
    assert sched.generate([MiniReq(p) for p in prompts], GREEDY_TOKENS) == expected
    monkeypatch.setattr(torch_native_backend, "_DECODE_CHUNK_BYTES", 1)
    assert sched.generate([MiniReq(p) for p in prompts[:2]], GREEDY_TOKENS) == expected[:2]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_extend_over_cached_prefix(setup, monkeypatch, layout):
    """A cached prefix longer than the window, then the rest: the same logits as one
    prefill, and HF's."""
    from sglang.srt.layers.attention import torch_native_backend

    worker, hf, prompts = setup
    monkeypatch.setattr(torch_native_backend, "_MAX_PAD_WASTE", LAYOUTS[layout])
    sched = MiniScheduler(worker)
    full_reqs = [MiniReq(p) for p in prompts]
    full = worker.forward_batch_logits(sched.build_extend(full_reqs)).next_token_logits
    sched.release(full_reqs)
    reqs = [MiniReq(p) for p in prompts]
    first = [max(1, len(p) - 5) if i % 2 else len(p) // 2 for i, p in enumerate(prompts)]
    worker.forward_batch_logits(sched.build_extend(reqs, first))
    chunked = worker.forward_batch_logits(sched.build_extend(reqs)).next_token_logits
    sched.release(reqs)
    torch.testing.assert_close(chunked, full, atol=1e-4, rtol=0)
    for prompt, row in zip(prompts, full):
        torch.testing.assert_close(row, hf_logits(hf, prompt)[-1], atol=1e-3, rtol=0)


def test_chunked_prefill_logprobs_match_hf(setup):
    """Chunks shorter than the window: each chunk's windowed layers read keys cached by
    the chunks before it."""
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    prompt = prompts[0]
    req, chunk, joined = MiniReq(prompt), SLIDING_WINDOW // 2 - 1, []
    while req.kv_len < len(prompt):
        n = min(chunk, len(prompt) - req.kv_len)
        res = sched.run(
            [req], sched.build_extend([req], [n], return_logprob=True, logprob_start_lens=[0])
        )
        joined += res.input_token_logprobs[0]
        req.output_ids.clear()
    assert joined[0] is None and len(joined) == len(prompt)
    ref = hf_prompt_logprobs(hf, prompt)
    torch.testing.assert_close(
        torch.tensor(joined[1:]), torch.tensor(ref), atol=LOGPROB_TOL, rtol=0
    )
    sched.release([req])
