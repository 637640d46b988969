"""Incremental detokenization and stop windows with SentencePiece-style tokenizers (byte
fallback, Metaspace spaces, a clean-up pass): the streamed text is exactly
`tokenizer.decode(ids)`, whatever the chunking."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from sglang.srt.managers.detokenizer_manager import (
    IncrementalDetokenizer,
    byte_fallback_ids,
    cleaned_tail,
    cleanup_cut,
    stop_window,
)
from sglang.srt.managers.io_struct import DecodeParams
from sglang.test.sentencepiece_tokenizer import save_sentencepiece_tokenizer


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizer(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"sp-{request.param}")
    save_sentencepiece_tokenizer(out, request.param)
    return AutoTokenizer.from_pretrained(str(out))


def streamed(tokenizer, ids: list[int], chunk: int) -> str:
    detok, text = IncrementalDetokenizer(tokenizer), ""
    for start in range(0, len(ids), chunk):
        done = start + chunk >= len(ids)
        finish = {"type": "length", "matched": None} if done else None
        params = [DecodeParams(stream=True)] if start == 0 else [None]
        text += detok.step(["r"], [ids[start : start + chunk]], [finish], params)[0]
    return text


def byte_ids(tokenizer, *values: int) -> list[int]:
    vocab = tokenizer.get_vocab()
    return [vocab[f"<0x{b:02X}>"] for b in values]


def test_a_byte_run_that_turns_invalid_streams_as_it_decodes(tokenizer):
    # "你好" then a stray continuation byte: the whole run decodes to U+FFFD per byte,
    # the characters completed before it too (they were streamed, then sent again)
    word = tokenizer.encode(" wo", add_special_tokens=False)
    cases = [byte_ids(tokenizer, 0xE4, 0xBD, 0xA0, 0xE5, 0xA5, 0xBD, 0x80) + word,
             byte_ids(tokenizer, 0xC3, 0xA9, 0xA9) + word + byte_ids(tokenizer, 0xC3, 0xA9)]  # fmt: skip
    for ids in cases:
        for chunk in (1, 2, 3):
            assert streamed(tokenizer, ids, chunk) == tokenizer.decode(ids), (ids, chunk)


def test_random_outputs_stream_as_they_decode(tokenizer):
    # random ids (what a random-weight model writes): every chunking gives decode(ids)
    rng = random.Random(0)
    vocab = len(tokenizer)
    for _ in range(300):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 12))]
        for chunk in (1, 3):
            expected = tokenizer.decode(ids, skip_special_tokens=True)  # DecodeParams' default
            assert streamed(tokenizer, ids, chunk) == expected, ids


def test_a_stop_window_never_starts_inside_a_byte_run(tmp_path):
    # decoded from the middle of a run, C3 A9 reads as "é" while the whole text has ����
    save_sentencepiece_tokenizer(tmp_path, "bpe")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    run = byte_ids(tokenizer, 0xC3, 0xA9, 0xA9, 0xC3, 0xA9, 0xA9, 0xC3, 0xA9, 0xA9, 0xC3, 0xA9)
    ids = tokenizer.encode("o o o", add_special_tokens=False) + run
    assert "é" not in tokenizer.decode(ids)
    window = stop_window(ids, ["é"], (), byte_fallback_ids(tokenizer))  # 6 tokens, widened
    assert window == run and "é" not in tokenizer.decode(window)


def test_logprob_token_texts_keep_their_spaces_and_offsets_index_the_text(tokenizer):
    # "▁w" read as "w" alone (tokens joined lost every space), and a skipped special
    # token moved text_offset by its name's length past the text
    from sglang.srt.entrypoints.openai.logprobs import TextOffsets
    from sglang.srt.managers.detokenizer_manager import (
        drops_first_space,
        silent_token_ids,
        token_piece_text,
    )

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode("the quick brown fox", add_special_tokens=False), end,
           *tokenizer.encode(" jumps over", add_special_tokens=False)]  # fmt: skip
    text = tokenizer.decode(ids, skip_special_tokens=True)
    silent = silent_token_ids(tokenizer)
    offsets = TextOffsets(0, silent, drops_first_space(tokenizer))
    pieces = [(i, token_piece_text(tokenizer, i)) for i in ids]
    found = [(offsets.take((-1.0, i, piece), tokenizer), piece) for i, piece in pieces]
    spoken = [(offset, piece) for (offset, piece), i in zip(found, ids) if i not in silent]
    assert sum(piece.startswith(" ") for _, piece in spoken) >= 3  # spaces are the tokens'
    for offset, piece in spoken[1:]:
        assert text[offset : offset + len(piece)] == piece, (text, offset, piece)
    joined = "".join(piece for _, piece in spoken)
    assert joined.removeprefix(" ") == text.removeprefix(" ")


def test_text_a_clean_up_pass_rewrites_streams_as_it_decodes(tokenizer):
    # " ' " -> "'" and " ," -> "," span token boundaries: the stream sent "dog ' s" and
    # lost characters at the end ("andore"); ordinary text keeps streaming token by token
    text = "the dog ' s name , and the cat ' s toy . and more : list ( value ) !"
    ids = tokenizer.encode(text, add_special_tokens=False)
    for chunk in (1, 2):
        assert streamed(tokenizer, ids, chunk) == tokenizer.decode(ids, skip_special_tokens=True)
    detok = IncrementalDetokenizer(tokenizer)
    words = tokenizer.encode("one two three four five six", add_special_tokens=False)
    sent = [detok.step(["r"], [[i]], [None], [DecodeParams(stream=True)])[0] for i in words]
    assert "".join(sent) == "one two three four five six"  # streamed with no finish


def _punctuated_text(rng: random.Random, words: int) -> str:
    pieces = ["the", "dog", "is", "n't", "'s", "'re", "'", ",", ".", "?", "!", "a", "x y",
              "it", "cat", "  ", "name", "'m", "'ve", "toy"]  # fmt: skip
    return " ".join(rng.choice(pieces) for _ in range(words))


def test_long_clean_up_streams_decode_each_token_a_bounded_number_of_times(tokenizer):
    # the pass runs from a split point it cannot cross: the text is decode's at every
    # chunking, and a 600-token stream decodes ~2 windows a token, not its whole output
    rng = random.Random(1)
    for _ in range(20):
        ids = tokenizer.encode(_punctuated_text(rng, 60), add_special_tokens=False)
        for chunk in (1, 2, 5):
            assert streamed(tokenizer, ids, chunk) == tokenizer.decode(ids, skip_special_tokens=True)
    ids = tokenizer.encode(_punctuated_text(rng, 600), add_special_tokens=False)
    detok, decoded_tokens = IncrementalDetokenizer(tokenizer), []
    if detok._rust_raw is not None:
        rust = detok._rust_raw

        class Counting:
            def decode(self, seq, **kw):
                decoded_tokens.append(len(seq))
                return rust.decode(seq, **kw)

        detok._rust_raw = Counting()
    params, text = DecodeParams(stream=True), ""
    for i, token in enumerate(ids):
        finish = {"type": "length", "matched": None} if i == len(ids) - 1 else None
        text += detok.step(["r"], [[token]], [finish], [params])[0]
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    if decoded_tokens:  # the BPE layout's decode runs no pass: no raw decoding then
        assert sum(decoded_tokens) < 16 * len(ids), (sum(decoded_tokens), len(ids))


def test_the_clean_up_pass_splits_and_holds_where_no_later_text_changes_it(tokenizer):
    # the pure rule behind streaming a clean-up pass: what is sent at any point is a
    # prefix of the pass over the whole text ("x ' " reads "x'", but "x ' ?" is "x '?")
    clean = tokenizer.clean_up_tokenization
    rng = random.Random(2)
    alphabet = [" ", "'", ".", "?", ",", "!", "n", "t", "s", "m", "v", "e", "r", "a", " '"]
    for _ in range(20000):
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 16)))
        pos, done, end = 0, "", 0
        while end < len(raw):
            end = min(len(raw), end + rng.randrange(1, 4))
            cut = cleanup_cut(raw[:end], pos)
            done, pos = done + clean(raw[pos:cut]), cut
            sent = done + cleaned_tail(raw[pos:end], clean)
            assert clean(raw).startswith(sent), (raw, raw[:end], sent)
        assert done + clean(raw[pos:]) == clean(raw), raw


def test_a_stop_token_after_a_stray_byte_leaves_the_bytes_text(tokenizer):
    # the stop token's text is left out, not the U+FFFD of the byte before it ('ok')
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode("ok", add_special_tokens=False), *byte_ids(tokenizer, 0x80), end]
    detok = IncrementalDetokenizer(tokenizer)
    finish = {"type": "stop", "matched": end}
    text = detok.step(["r"], [ids], [finish], [DecodeParams(skip_special_tokens=False)])[0]
    assert text == tokenizer.decode(ids[:-1])  # "ok\ufffd" with byte fallback


def test_a_stop_token_the_clean_up_pass_merges_leaves_the_text_before_it(tokenizer):
    # "ok ." finishing on "." read "ok." (the pass moved the token's text onto "ok ")
    ids = [*tokenizer.encode("ok", add_special_tokens=False),
           *tokenizer.encode(" .", add_special_tokens=False)]  # fmt: skip
    for chunk in (len(ids), 1):
        detok, text = IncrementalDetokenizer(tokenizer), ""
        for start in range(0, len(ids), chunk):
            done = start + chunk >= len(ids)
            finish = {"type": "stop", "matched": ids[-1]} if done else None
            params = [DecodeParams(stream=True)] if start == 0 else [None]
            text += detok.step(["r"], [ids[start : start + chunk]], [finish], params)[0]
        assert text == tokenizer.decode(ids[:-1], skip_special_tokens=True), (ids, chunk)
