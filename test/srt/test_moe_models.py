"""MoE models (Qwen3-MoE, Mixtral) against HF transformers, and the grouped-expert layer alone.

Tiny random checkpoints: 8 experts, top-2, 2 layers. The Qwen3-MoE checkpoint keeps
HF's default norm_topk_prob=False; a variant turns it on and makes layer 1 dense
(`mlp_only_layers`); Mixtral always renormalises its top-k weights.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe import GroupedExperts, select_experts
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_greedy, hf_prompt_logprobs, load_hf_model
from sglang.test.runner_utils import MiniReq, MiniScheduler

LOGPROB_TOL = 1e-3
GREEDY_TOKENS = 32
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox",
    "x",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path",
    '{"name": "tiny", "layers": 4, "heads": [1, 2, 3]}',
]


@pytest.fixture(autouse=True)
def _few_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def qwen3_moe_variant_dir(tiny_model_dir, tmp_path_factory):
    """Qwen3-MoE with norm_topk_prob on and layer 1 dense (the tokenizer of the tiny one)."""
    from transformers import AutoModelForCausalLM

    from sglang.test.corpus import EOS_TOKEN, PAD_TOKEN
    from sglang.test.make_tiny_model import cached_tokenizer, make_config

    base = tiny_model_dir("qwen3_moe")
    tok = cached_tokenizer()
    eos_id, pad_id = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
    config = make_config("qwen3_moe", tok.get_vocab_size(), eos_id, pad_id)
    config.norm_topk_prob, config.mlp_only_layers = True, [1]
    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("tiny-qwen3_moe-variant")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    for path in base.iterdir():  # tokenizer and generation config
        if path.is_file() and path.name not in ("config.json", "model.safetensors"):
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "qwen3_moe_variant"])
def setup(request, tiny_model_dir):
    """(worker, HF model, tokenized prompts) for one checkpoint."""
    if request.param == "qwen3_moe_variant":
        model_dir = str(request.getfixturevalue("qwen3_moe_variant_dir"))
    else:
        model_dir = str(tiny_model_dir(request.param))
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, max_running_requests=8
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    yield worker, load_hf_model(model_dir), prompts
    worker.token_to_kv_pool_allocator.check_integrity()


@pytest.mark.slow
def test_prompt_logprobs_match_hf(setup):
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    reqs = [MiniReq(p) for p in prompts]
    batch = sched.build_extend(reqs, return_logprob=True, logprob_start_lens=[0] * len(reqs))
    result = sched.run(reqs, batch)
    for prompt, ours in zip(prompts, result.input_token_logprobs):
        assert ours[0] is None and len(ours) == len(prompt)
        ref = hf_prompt_logprobs(hf, prompt)
        torch.testing.assert_close(
            torch.tensor(ours[1:]), torch.tensor(ref), atol=LOGPROB_TOL, rtol=0
        )
    sched.release(reqs)


@pytest.mark.slow
def test_greedy_matches_hf(setup):
    worker, hf, prompts = setup
    outputs = MiniScheduler(worker).generate([MiniReq(p) for p in prompts], GREEDY_TOKENS)
    for prompt, ours in zip(prompts, outputs):
        assert ours == hf_greedy(hf, prompt, GREEDY_TOKENS)


@pytest.mark.slow
def test_variant_layout(qwen3_moe_variant_dir, tiny_model_dir):
    """The variant really has a dense layer 1; the plain checkpoints are sparse throughout."""
    from sglang.srt.models.qwen3_moe import is_sparse_layer

    variant = ModelConfig(str(qwen3_moe_variant_dir))
    assert variant.norm_topk_prob and variant.num_experts == 8
    assert [is_sparse_layer(variant, i) for i in range(2)] == [True, False]
    mixtral = ModelConfig(str(tiny_model_dir("mixtral")))
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.norm_topk_prob) == (
        8,
        2,
        True,
    )


def _naive_moe(x, w_gate_up, w_down, ids, weights):
    """Per token, per choice: the definition the grouped computation must equal."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t]):
            gate, up = (w_gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (w_down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def _experts(num_experts, hidden, inter, tp_rank=0, tp_size=1, seed=0, ep_size=1):
    """GroupedExperts loaded from per-expert tensors (gate [I, H], up [I, H], down [H, I])."""
    gen = torch.Generator().manual_seed(seed)
    gate = torch.randn(num_experts, inter, hidden, generator=gen)
    up = torch.randn(num_experts, inter, hidden, generator=gen)
    down = torch.randn(num_experts, hidden, inter, generator=gen)
    layer = GroupedExperts(
        num_experts, hidden, inter, tp_rank=tp_rank, tp_size=tp_size, ep_size=ep_size
    )
    for e in range(num_experts):
        layer.gate_up_proj.weight_loader(layer.gate_up_proj, gate[e], (e, 0))
        layer.gate_up_proj.weight_loader(layer.gate_up_proj, up[e], (e, 1))
        layer.down_proj.weight_loader(layer.down_proj, down[e], (e, None))
    return layer, torch.cat([gate, up], dim=1), down


@pytest.mark.parametrize("renormalize", [False, True])
def test_grouped_experts_equal_per_token_definition(renormalize):
    torch.manual_seed(0)
    x, logits = torch.randn(37, 16), torch.randn(37, 8)
    weights, ids = select_experts(logits, 3, renormalize)
    probs = torch.softmax(logits, dim=-1)
    expected_w = probs.topk(3).values
    if renormalize:
        expected_w = expected_w / expected_w.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected_w)
    layer, w_gate_up, w_down = _experts(8, 16, 12)
    ref = _naive_moe(x, w_gate_up, w_down, ids, weights)
    torch.testing.assert_close(layer(x, ids, weights), ref, atol=1e-4, rtol=1e-5)
    # the fused HF layout ([E, 2I, H], [E, H, I]) loads to the same parameters
    fused = GroupedExperts(8, 16, 12)
    fused.gate_up_proj.weight_loader(fused.gate_up_proj, w_gate_up)
    fused.down_proj.weight_loader(fused.down_proj, w_down)
    assert torch.equal(fused.gate_up_proj, layer.gate_up_proj)
    assert torch.equal(fused.down_proj, layer.down_proj)


def test_tp_shards_sum_to_full_and_empty_batch():
    torch.manual_seed(0)
    x = torch.randn(9, 16)
    weights, ids = select_experts(torch.randn(9, 4), 2, True)
    full = _experts(4, 16, 12)[0](x, ids, weights)
    shards = [_experts(4, 16, 12, tp_rank=r, tp_size=2)[0] for r in range(2)]
    assert shards[0].gate_up_proj.shape == (4, 12, 16) and shards[0].down_proj.shape == (4, 16, 6)
    torch.testing.assert_close(sum(s(x, ids, weights) for s in shards), full, atol=1e-4, rtol=0)
    empty = full.new_empty(0, 16)
    assert shards[0](empty, ids[:0], weights[:0]).shape == (0, 16)


def test_ep_ranks_hold_whole_experts_and_sum_to_full():
    """ep = tp = 2: each rank holds half the experts whole; their partial sums add up to the
    unsharded block (tokens routed only to the other rank's experts contribute zero here)."""
    torch.manual_seed(0)
    x = torch.randn(11, 16)
    weights, ids = select_experts(torch.randn(11, 4), 2, False)
    full = _experts(4, 16, 12)[0](x, ids, weights)
    ranks = [_experts(4, 16, 12, tp_rank=r, tp_size=2, ep_size=2)[0] for r in range(2)]
    assert ranks[1].gate_up_proj.shape == (2, 24, 16) and ranks[1].first_expert == 2
    torch.testing.assert_close(sum(r(x, ids, weights) for r in ranks), full, atol=1e-4, rtol=0)
    only_rank0 = torch.zeros_like(ids)  # every choice on expert 0: rank 1 adds nothing
    assert torch.count_nonzero(ranks[1](x, only_rank0, weights)) == 0
    with pytest.raises(ValueError, match="ep_size=2 must divide num_experts=3"):
        GroupedExperts(3, 16, 12, tp_rank=0, tp_size=2, ep_size=2)


@pytest.mark.slow
def test_ep2_greedy_matches_hf_and_dense_models_refuse_ep(tiny_model_dir, tiny_llama_dir):
    """tp = ep = 2 (gloo): HF's greedy tokens; ep > 1 on a dense model is a clear error."""
    import sglang as sgl

    model_dir = str(tiny_model_dir("mixtral"))
    hf = load_hf_model(model_dir)
    prompts = [[100, 200, 300, 400, 500], list(range(40, 90))]
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    common = dict(tp_size=2, ep_size=2, num_threads=1, log_level="warning", max_total_tokens=2048)
    with sgl.Engine(model_path=model_dir, **common) as llm:
        outs = llm.generate(input_ids=prompts, sampling_params=params)
        assert llm.get_server_info()["internal_states"][0]["ep_size"] == 2
    assert [o["output_ids"] for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]
    with pytest.raises(Exception, match="ep_size=2 needs a mixture-of-experts model"):
        sgl.Engine(model_path=str(tiny_llama_dir), **common)


@pytest.mark.slow
def test_tp2_greedy_matches_hf(tiny_model_dir):
    """Two ranks (gloo), each holding half of every expert's width: HF's greedy tokens."""
    import sglang as sgl

    model_dir = str(tiny_model_dir("qwen3_moe"))
    hf = load_hf_model(model_dir)
    prompts = [[100, 200, 300, 400, 500], [7, 8, 9], list(range(40, 90))]
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    with sgl.Engine(
        model_path=model_dir, tp_size=2, num_threads=1, log_level="warning", max_total_tokens=2048
    ) as llm:
        outs = llm.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_a_checkpoint_missing_a_whole_expert_is_refused(tiny_model_dir, tmp_path, arch):
    # every tensor of one expert gone: its slice of the stacked experts stayed
    # uninitialized memory, and outputs changed silently
    from safetensors.torch import load_file, save_file

    from sglang.srt.model_loader.loader import get_model

    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir(arch), cut)
    weights = load_file(cut / "model.safetensors")
    last = max(int(k.split(".experts.")[1].split(".")[0]) for k in weights if ".experts." in k)
    gone = [k for k in weights if f".experts.{last}." in k and ".layers.0." in k]
    assert gone
    save_file({k: v for k, v in weights.items() if k not in gone}, cut / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    with pytest.raises(ValueError, match=f"missing weights for: .*expert {last}"):
        get_model(ModelConfig(str(cut)), "cpu", "auto")
