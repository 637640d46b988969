"""Logprob shapes for tokens that hold part of a UTF-8 character (they decode to U+FFFD):
the chat API's `bytes` rebuild the text, and the completions API names them apart."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from sglang.demo_models import demo_target_path
from sglang.srt.entrypoints.openai.logprobs import (
    TextOffsets,
    chat_logprobs,
    completion_logprobs,
    raw_token_bytes,
)

TEXT = "🙂é 你好 ok"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(demo_target_path()))


def entries(tokenizer, ids, logprob=-1.0):
    return [(logprob, i, tokenizer.decode([i])) for i in ids]


def test_byte_tokens_are_named_by_their_bytes(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    texts = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in t for t in texts)  # the case under test: split characters
    assert b"".join(raw_token_bytes(tokenizer, i) for i in ids) == TEXT.encode()
    chat = chat_logprobs(entries(tokenizer, ids), None, tokenizer)
    assert b"".join(bytes(c.bytes) for c in chat.content) == TEXT.encode()
    tokens = completion_logprobs(entries(tokenizer, ids), None, tokenizer).tokens
    split = [t for t, text in zip(tokens, texts) if "\ufffd" in text]
    assert split and all(t.startswith("bytes:\\x") for t in split)
    assert [t for t, text in zip(tokens, texts) if "\ufffd" not in text] == [
        text for text in texts if "\ufffd" not in text
    ]


def test_top_logprobs_keep_every_token_best_first(tokenizer):
    """Five byte tokens, all decoding to U+FFFD: five entries, each with its own value."""
    ids = [i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]) == "\ufffd"][:5]
    assert len(ids) == 5
    top = [(-0.5 - k, i, "\ufffd") for k, i in enumerate(ids)]  # best first
    out = completion_logprobs([top[0]], [top], tokenizer)
    assert list(out.top_logprobs[0].values()) == [-0.5, -1.5, -2.5, -3.5, -4.5]
    assert out.tokens[0] in out.top_logprobs[0]
    assert out.top_logprobs[0][out.tokens[0]] == -0.5


def test_a_sampled_token_outside_the_top_k_is_added_to_top_logprobs():
    """OpenAI: "the API will always return the logprob of the sampled token, so there
    may be up to logprobs+1 elements"; vLLM too (and logprobs 0 gives it alone)."""
    top = [(-0.5, 1, "a"), (-1.0, 2, "b")]
    out = completion_logprobs([(-3.0, 3, "c"), top[1]], [top, top], None)
    assert out.top_logprobs == [{"a": -0.5, "b": -1.0, "c": -3.0}, {"a": -0.5, "b": -1.0}]


def test_a_shared_name_keeps_the_better_logprob():
    """Without a vocabulary to tell them apart, two tokens that decode alike keep the
    best value, not the last."""
    top = [(-0.5, 1, "a"), (-2.0, 2, "a")]
    out = completion_logprobs([top[0]], [top], None)
    assert out.top_logprobs[0] == {"a": -0.5}


@pytest.mark.parametrize("text", [TEXT, "日本語🎉 ok", "plain words only"])
def test_text_offsets_index_the_text_and_a_stream_gives_the_same(tokenizer, text):
    """text_offset of a token is where its text starts in the choice's text: the
    tokens holding parts of one character share the offset where it starts (they used
    to add one U+FFFD each); streamed in any chunks, the offsets are the same."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    whole = completion_logprobs(entries(tokenizer, ids), None, tokenizer, 7).text_offset
    assert whole == sorted(whole) and whole[0] == 7 and max(whole) < 7 + len(text)
    for i, offset in enumerate(whole):
        before = tokenizer.decode(ids[:i])
        assert offset - 7 == len(before.rstrip("\ufffd")), (i, before)
    for chunk in (1, 2, 3):
        offsets = TextOffsets(7)
        streamed = []
        for start in range(0, len(ids), chunk):
            part = entries(tokenizer, ids[start : start + chunk])
            streamed += completion_logprobs(part, None, tokenizer, offsets).text_offset
        assert streamed == whole


def test_logprobs_zero_gives_the_chosen_token_as_top(tokenizer):
    # as vLLM: top_logprobs is a dict per token (OpenAI's type), holding the chosen one
    ids = tokenizer.encode("ok then", add_special_tokens=False)
    out = completion_logprobs(entries(tokenizer, ids, -0.25), None, tokenizer)
    assert out.top_logprobs == [{token: -0.25} for token in out.tokens]
    prompt = [(None, ids[0], None), *entries(tokenizer, ids[1:])]  # an echoed first token
    assert completion_logprobs(prompt, None, tokenizer).top_logprobs[0] is None


def test_a_character_left_unfinished_keeps_its_replacement_to_itself(tokenizer):
    """A lone UTF-8 lead byte that the next token does not finish becomes U+FFFD in the
    text; the next token's text starts after it (it used to be charged the U+FFFD)."""
    lead = next(i for i in range(tokenizer.vocab_size) if raw_token_bytes(tokenizer, i) == b"\xce")
    ids = [*tokenizer.encode("mit", add_special_tokens=False), lead,
           *tokenizer.encode("compare", add_special_tokens=False)]  # fmt: skip
    text = tokenizer.decode(ids)
    assert text == "mit\ufffdcompare"
    for chunk in (1, 2, len(ids)):
        offsets = TextOffsets(0)
        found = []
        for start in range(0, len(ids), chunk):
            part = entries(tokenizer, ids[start : start + chunk])
            found += completion_logprobs(part, None, tokenizer, offsets).text_offset
        assert found[-len(tokenizer.encode("compare", add_special_tokens=False))] == 4, found
        assert found[: len(ids) - 1] == sorted(found[: len(ids) - 1])
