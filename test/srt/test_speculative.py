"""Speculative decoding end to end on the bundled demo pair (target 6.5M, draft 1.4M).

Greedy speculation must be invisible: STANDALONE and NGRAM outputs equal the
outputs without speculation token for token, with the radix cache on and off,
chunked prefill of 16 tokens, and a KV pool small enough to force retraction,
32 prompts at 8 running requests. After every test neither pool holds a slot.

Both sides run float32: the demo checkpoint is bf16, which dtype auto keeps on CPUs with
fast bf16 matmuls, and in bf16 a verify forward (several tokens per request, other matmul
shapes) rounds differently from one-token decode steps, so a near-tie may break the other
way (as on GPUs); token-for-token equality is float32's promise.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time

import pytest

import sglang as sgl
from sglang.demo_models import demo_target_path
from sglang.srt.environ import envs
from sglang.test.pool_checks import idle_pool_problems, stop_id_never_generated

pytestmark = pytest.mark.slow

MAX_NEW = 64
COMMON = dict(
    num_threads=1, log_level="warning", random_seed=0, max_running_requests=8, dtype="float32"
)
CONFIGS = {
    "ngram_radix": dict(speculative_algorithm="NGRAM", max_total_tokens=8192),
    "ngram_no_radix_chunked": dict(
        speculative_algorithm="NGRAM", disable_radix_cache=True, chunked_prefill_size=16
    ),
    "standalone_radix": dict(speculative_algorithm="STANDALONE", max_total_tokens=8192),
    "standalone_no_radix": dict(speculative_algorithm="STANDALONE", disable_radix_cache=True),
    "standalone_chunked": dict(speculative_algorithm="STANDALONE", chunked_prefill_size=16),
    "standalone_small_pool": dict(
        speculative_algorithm="STANDALONE", max_total_tokens=600, chunked_prefill_size=64
    ),
    "ngram_small_pool": dict(
        speculative_algorithm="NGRAM", max_total_tokens=600, chunked_prefill_size=64
    ),
}
FAULTY = "verify-fault"
VOCAB = json.loads((demo_target_path() / "config.json").read_text())["vocab_size"]
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
FUNCTION = "\n".join(f"    total_{i} = values[{i}] * {i} + offset" for i in range(8))


def prompts() -> list[str]:
    """Mixed: repetitive (code to rewrite, repeated phrases) and free text."""
    rng = random.Random(3)
    words = "the a little fox ran over hill and then found some bread in old house".split()
    out = []
    for i in range(32):
        if i % 3 == 0:
            out.append(f"Rewrite with type hints:\ndef f{i}(values, offset):\n{FUNCTION}\n")
        elif i % 3 == 1:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randrange(5, 40))))
        else:
            out.append(f"Once upon a time, story {i}. Once upon a time, story")
    return out


REGEX = r"(def|class) [a-z_]{1,12}\((self|x|values)(, [a-z]{1,8}){0,3}\):"
SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, '
    '"legs": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "legs"]}'
)
CONSTRAINED = [
    {"max_new_tokens": 40, "temperature": 0, "regex": REGEX},
    {"max_new_tokens": 60, "temperature": 0, "json_schema": SCHEMA},
]


def constrained_outputs(llm) -> list[list[int]]:
    texts = prompts()[:6]
    return [o["output_ids"] for p in CONSTRAINED for o in llm.generate(texts, p)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    with sgl.Engine(model_path=str(demo_target_path()), **COMMON) as llm:
        outputs = [o["output_ids"] for o in llm.generate(prompts(), GREEDY)]
        return outputs + constrained_outputs(llm)


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, reference):
    # Verify forwards of requests whose rid holds the marker fail (test hook).
    with envs.SGLANG_FAULT_INJECT.override(f"verify:{FAULTY}"):
        llm = sgl.Engine(model_path=str(demo_target_path()), **COMMON, **CONFIGS[request.param])
    llm.config_name = request.param
    yield llm
    llm.shutdown()


def idle_state(llm, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = llm.get_server_info()["internal_states"][0]
        if state["num_running_reqs"] == 0 and state["num_queued_reqs"] == 0:
            return state
        if time.monotonic() > deadline:
            return state
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leaks(request):
    yield
    if "engine" in request.fixturenames:
        state = idle_state(request.getfixturevalue("engine"))
        assert not idle_pool_problems(state), (idle_pool_problems(state), state)


def test_greedy_outputs_equal_plain_decoding(engine, reference):
    params = GREEDY
    if "small_pool" in engine.config_name:
        # ignore_eos alone: each output is reserved in full and nothing retracts
        params = {**GREEDY, "stop_token_ids": [stop_id_never_generated(reference, VOCAB)]}
    outs = engine.generate(prompts(), params)
    assert [o["output_ids"] for o in outs] == reference[:32]
    state = engine.get_server_info()["internal_states"][0]
    # speculation did run: some rounds kept more than one token
    assert state["spec_verify_rounds"] > 0 and state["avg_spec_accept_length"] > 1.0
    verify_ct = [o["meta_info"]["spec_verify_ct"] for o in outs]
    assert all(0 < ct <= MAX_NEW for ct in verify_ct)
    assert sum(MAX_NEW for _ in outs) / sum(verify_ct) > 1.0  # tokens per decode round
    if "small_pool" in engine.config_name:
        assert state["num_retracted_reqs"] > 0, "the small pool should force retraction"
    if engine.config_name.startswith("standalone"):
        assert state["draft_max_total_num_tokens"] == state["max_total_num_tokens"]


def test_stops_logprobs_and_n_with_speculation(engine, reference):
    text = prompts()[0]
    full = engine.generate(text, GREEDY)
    # max_new_tokens cuts inside an accepted run; the output is the plain prefix
    short = engine.generate(text, {**GREEDY, "max_new_tokens": 7})
    assert short["output_ids"] == full["output_ids"][:7]
    # a stop token in the middle of a run ends the request there
    stop_at = full["output_ids"][10]
    stopped = engine.generate(text, {**GREEDY, "ignore_eos": False, "stop_token_ids": [stop_at]})
    first = full["output_ids"].index(stop_at)
    assert stopped["output_ids"] == full["output_ids"][: first + 1]
    # logprobs of every kept token, matching a plain run's
    asked = sorted(set(full["output_ids"][:16]))
    with_lp = engine.generate(text, {**GREEDY, "max_new_tokens": 16}, return_logprob=True,
                              top_logprobs_num=2, token_ids_logprob=asked)  # fmt: skip
    lps = with_lp["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == full["output_ids"][:16]
    assert all(lp <= 0.0 for lp, _, _ in lps)
    assert len(with_lp["meta_info"]["output_top_logprobs"]) == 16
    # the asked ids' logprobs at every kept position, drafted or not: the chosen token's
    # entry is its logprob
    by_position = with_lp["meta_info"]["output_token_ids_logprobs"]
    assert len(by_position) == 16
    for (chosen_lp, chosen, _), entries in zip(lps, by_position):
        assert [t for _, t, _ in entries] == asked
        assert dict((t, v) for v, t, _ in entries)[chosen] == pytest.approx(chosen_lp, abs=1e-5)
    # n > 1 with sampling: each sample well formed, reproducible across runs is not
    # required (drafting changes the random stream), the count and lengths are
    samples = engine.generate(text, {"max_new_tokens": 12, "temperature": 0.8, "n": 3,
                                     "ignore_eos": True})  # fmt: skip
    assert [len(s["output_ids"]) for s in samples] == [12, 12, 12]


def test_abort_mid_generation_leaves_both_pools_intact(engine):
    stream = engine.generate(prompts()[3], {**GREEDY, "max_new_tokens": 300}, stream=True)
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    state = idle_state(engine)
    assert not idle_pool_problems(state), idle_pool_problems(state)


def test_failed_verify_falls_back_to_plain_decoding(engine, reference):
    """A verify forward that raises frees its slots; its requests are decoded one at a
    time instead, and every output still equals plain decoding."""
    texts = prompts()[:8]
    rids = [f"{FAULTY}-0"] + [f"ok-{i}" for i in range(1, 8)]
    outs = engine.generate(texts, GREEDY, rid=rids)
    assert [o["output_ids"] for o in outs] == reference[:8]


def test_constrained_requests_draft_within_their_grammar(engine, reference):
    """Regex and JSON-schema requests keep drafts only where the grammar allows them, and
    greedy outputs equal plain constrained decoding."""
    before = engine.get_server_info()["internal_states"][0]["spec_verify_rounds"]
    assert constrained_outputs(engine) == reference[32:]
    after = engine.get_server_info()["internal_states"][0]["spec_verify_rounds"]
    assert after > before  # constrained requests did draft


def test_sampled_constrained_requests_do_not_draft_from_a_draft_model(engine):
    """A grammar cuts a drafted token it refuses before verification; for a draw from the
    draft model's q the cut depends on the draw and would bias the output, so a sampled
    constrained request decodes without drafts there (a deterministic NGRAM draft keeps
    them: its cut does not bias)."""
    sampled = {**CONSTRAINED[0], "temperature": 1.0, "max_new_tokens": 40}
    before = engine.get_server_info()["internal_states"][0]["spec_verify_rounds"]
    outs = engine.generate(prompts()[:2], sampled)
    assert all(re.fullmatch(REGEX, o["text"]) for o in outs), [o["text"] for o in outs]
    rounds = engine.get_server_info()["internal_states"][0]["spec_verify_rounds"] - before
    if engine.config_name.startswith("standalone"):
        assert rounds == 0


def test_a_draft_with_a_smaller_vocabulary_drafts_for_sampled_requests(tmp_path):
    """A draft whose vocabulary is a prefix of the target's (Qwen2.5-0.5B has 151,936
    tokens, 7B 152,064): its q rows are padded with zeros to the target's width, so
    sampled requests verify their drafts (every such verify used to raise)."""
    from safetensors.torch import load_file, save_file

    from sglang.demo_models import demo_draft_path

    draft = tmp_path / "draft-small-vocab"
    shutil.copytree(demo_draft_path(), draft)
    small = VOCAB - 192
    weights = load_file(draft / "model.safetensors")
    cut = {k: (v[:small].clone() if v.shape[0] == VOCAB else v) for k, v in weights.items()}
    save_file(cut, draft / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "vocab_size": small}))
    sampled = {"max_new_tokens": 32, "temperature": 1.0, "ignore_eos": True}  # no seed: drafts
    with sgl.Engine(
        model_path=str(demo_target_path()), speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft), **COMMON,
    ) as llm:  # fmt: skip
        outs = llm.generate(prompts()[:6], sampled)
        state = idle_state(llm)
    assert all(len(o["output_ids"]) == 32 for o in outs)
    # drafts were verified: rounds that each kept more than one token on average
    assert state["spec_verify_rounds"] > 0 and state["avg_spec_accept_length"] > 1.0, state
    assert not idle_pool_problems(state), idle_pool_problems(state)
