"""Acceptance: our runner vs HF transformers on the tiny Llama / Qwen2 / Qwen3 checkpoints.

Driven through TpModelWorker.forward_batch_generation with hand-built
ModelWorkerBatch objects (sglang.test.runner_utils.MiniScheduler).
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_greedy, hf_logits, hf_prompt_logprobs, load_hf_model
from sglang.test.runner_utils import MiniReq, MiniScheduler

ARCHS = ["llama", "qwen2", "qwen3"]
LOGPROB_TOL = 1e-3
GREEDY_TOKENS = 32

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path",
    "x",
    "Return a list of the words in the string, using sep as the delimiter string.",
    "for i in range(10):\n    print(i * i)",
    '{"name": "tiny", "layers": 4, "heads": [1, 2, 3]}',
    "Hello, world! " * 12,
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
        model_path=model_dir, device="cpu", max_total_tokens=8192, max_running_requests=16
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    yield worker, load_hf_model(model_dir), prompts
    worker.token_to_kv_pool_allocator.check_integrity()


def test_prompt_logprobs_match_hf(setup, monkeypatch):
    from sglang.srt.layers import logits_processor

    worker, hf, prompts = setup
    # logits for a few rows at a time, as a long prompt over a large vocab would get
    monkeypatch.setattr(logits_processor, "_LOGPROB_CHUNK_ELEMENTS", 5 * 8192)
    sched = MiniScheduler(worker)
    reqs = [MiniReq(p) for p in prompts]
    starts = [0] * len(reqs)
    batch = sched.build_extend(
        reqs, return_logprob=True, logprob_start_lens=starts, top_logprobs_num=2
    )
    result = sched.run(reqs, batch)
    for prompt, ours, tops in zip(prompts, result.input_token_logprobs, result.input_top_logprobs):
        assert ours[0] is None and len(ours) == len(prompt)
        ref = hf_prompt_logprobs(hf, prompt)
        torch.testing.assert_close(
            torch.tensor(ours[1:]), torch.tensor(ref), atol=LOGPROB_TOL, rtol=0
        )
        assert tops[0] == [] and all(len(t) == 2 for t in tops[1:])
        assert all(t[0][0] >= lp - 1e-6 for t, lp in zip(tops[1:], ours[1:]))
    assert len(result.next_token_logprobs) == len(prompts)
    sched.release(reqs)


def test_greedy_matches_hf_and_batch_matches_single(setup):
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    batched = sched.generate([MiniReq(p) for p in prompts], GREEDY_TOKENS)
    for prompt, ours in zip(prompts, batched):
        assert ours == hf_greedy(hf, prompt, GREEDY_TOKENS)
    for prompt, ours in list(zip(prompts, batched))[:3]:
        assert sched.generate([MiniReq(prompt)], GREEDY_TOKENS) == [ours]


def test_extend_with_prefix_equals_full_prefill(setup):
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    full_reqs = [MiniReq(p) for p in prompts]
    full = worker.forward_batch_logits(sched.build_extend(full_reqs)).next_token_logits
    # the same prompts in two chunks: the first step caches a prefix, the second extends it
    first = [len(p) // 2 for p in prompts]
    chunked = _two_chunk_logits(worker, sched, prompts, first)
    torch.testing.assert_close(chunked, full, atol=1e-4, rtol=0)
    last = hf_logits(hf, prompts[0])[-1]
    torch.testing.assert_close(full[0], last, atol=1e-3, rtol=0)
    sched.release(full_reqs)


def _two_chunk_logits(worker, sched, prompts, first_lens) -> torch.Tensor:
    reqs = [MiniReq(p) for p in prompts]
    pre = [(r, n) for r, n in zip(reqs, first_lens) if n > 0]
    worker.forward_batch_logits(sched.build_extend([r for r, _ in pre], [n for _, n in pre]))
    out = worker.forward_batch_logits(sched.build_extend(reqs)).next_token_logits
    sched.release(reqs)
    return out


def test_chunked_input_logprobs_match_full(setup):
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    prompt = prompts[2]
    ref = hf_prompt_logprobs(hf, prompt)  # ref[i] is the logprob of prompt[i + 1]
    k = len(prompt) // 2
    # a radix-style prefix (no logprobs asked for it): chunk position 0 is unknown
    req = MiniReq(prompt)
    sched.run([req], sched.build_extend([req], [k]))
    req.output_ids.clear()
    res = sched.run([req], sched.build_extend([req], return_logprob=True, logprob_start_lens=[0]))
    ours = res.input_token_logprobs[0]
    assert ours[0] is None and len(ours) == len(prompt) - k
    torch.testing.assert_close(
        torch.tensor(ours[1:]), torch.tensor(ref[k:]), atol=LOGPROB_TOL, rtol=0
    )
    sched.release([req])
    # chunked prefill asking for logprobs in both chunks: the boundary is filled in
    req = MiniReq(prompt)
    first = sched.run(
        [req], sched.build_extend([req], [k], return_logprob=True, logprob_start_lens=[0])
    )
    req.output_ids.clear()
    second = sched.run(
        [req], sched.build_extend([req], return_logprob=True, logprob_start_lens=[0])
    )
    joined = first.input_token_logprobs[0] + second.input_token_logprobs[0]
    assert joined[0] is None and len(joined) == len(prompt)
    torch.testing.assert_close(
        torch.tensor(joined[1:]), torch.tensor(ref), atol=LOGPROB_TOL, rtol=0
    )
    sched.release([req])


def test_paged_kv_cache_and_idle_batch(tiny_llama_dir):
    """page_size 4 gives the same greedy tokens as HF; an IDLE batch returns nothing."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch

    model_dir = str(tiny_llama_dir)
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=1024, page_size=4
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    hf = load_hf_model(model_dir)
    prompts = [list(range(10, 31)), [7, 8, 9]]
    outputs = MiniScheduler(worker).generate([MiniReq(p) for p in prompts], 12)
    assert outputs == [hf_greedy(hf, p, 12) for p in prompts]
    worker.token_to_kv_pool_allocator.check_integrity()
    empty = torch.empty(0, dtype=torch.int64)
    idle = ModelWorkerBatch(ForwardMode.IDLE, empty, empty, empty, empty)
    assert worker.forward_batch_generation(idle).next_token_ids == []


@pytest.mark.parametrize("pad_waste", [0.0, 1e9], ids=["ragged", "padded"])
def test_extend_attention_layouts_agree(tiny_llama_dir, monkeypatch, pad_waste):
    """Per-request / per-length-group (ragged) and padded attention give the same results."""
    from sglang.srt.layers.attention import torch_native_backend

    model_dir = str(tiny_llama_dir)
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=2048
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    sched = MiniScheduler(worker)
    prompts = [list(range(10, 60)), [7, 8, 9], list(range(100, 120))]
    full = worker.forward_batch_logits(
        sched.build_extend([MiniReq(p) for p in prompts])
    ).next_token_logits
    monkeypatch.setattr(torch_native_backend, "_MAX_PAD_WASTE", pad_waste)
    # ragged: also one request per decode chunk
    monkeypatch.setattr(
        torch_native_backend, "_DECODE_CHUNK_BYTES", 1 if pad_waste == 0 else 1 << 30
    )
    chunked = _two_chunk_logits(worker, sched, prompts, [len(p) // 2 for p in prompts])
    torch.testing.assert_close(chunked, full, atol=1e-4, rtol=0)
    fresh = worker.forward_batch_logits(
        sched.build_extend([MiniReq(p) for p in prompts])
    ).next_token_logits
    torch.testing.assert_close(fresh, full, atol=1e-4, rtol=0)
    hf = load_hf_model(model_dir)
    outputs = sched.generate([MiniReq(p) for p in prompts], 8)  # decode in length groups
    assert outputs == [hf_greedy(hf, p, 8) for p in prompts]


@pytest.mark.parametrize(
    "scaling",
    [{"rope_type": "dynamic", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}],
    ids=["dynamic", "yarn-without-original"],
)
def test_scaled_rope_served_past_the_models_context_stays_hf(tiny_llama_dir, tmp_path, scaling):
    """A --context-length past max_position_embeddings (allowed by the operator) sizes
    the rope tables only: scaling stays relative to the model's own length (dynamic
    NTK's threshold, yarn's original length), so outputs are HF's."""
    import json
    import shutil

    model_dir = tmp_path / "scaled"
    shutil.copytree(tiny_llama_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(max_position_embeddings=64, rope_scaling=scaling)
    config.pop("rope_parameters", None)
    (model_dir / "config.json").write_text(json.dumps(config))
    with get_context().override_server_args(
        model_path=str(model_dir), device="cpu", max_total_tokens=4096, max_running_requests=4
    ):
        cfg = ModelConfig(str(model_dir), context_length=256, longer_context_ok=True)
        worker = TpModelWorker(cfg)
    hf = load_hf_model(str(model_dir))
    prompt = [(7 * i) % 500 + 3 for i in range(40)]
    # decoded one token at a time past position 64: HF's generate rescales there too
    assert MiniScheduler(worker).generate([MiniReq(prompt)], 40) == [hf_greedy(hf, prompt, 40)]
