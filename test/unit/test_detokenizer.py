from __future__ import annotations

import pytest

from sglang.srt.managers.detokenizer_manager import (
    IncrementalDetokenizer,
    find_stop,
    partial_stop_len,
)
from sglang.srt.managers.io_struct import DecodeParams


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.test.corpus import save_tokenizer_files, train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    save_tokenizer_files(train_tokenizer(vocab_size=1024, max_bytes=300_000), out, 2048)
    return AutoTokenizer.from_pretrained(str(out))


def stream(detok, tokenizer, text, params, chunk=1, rid="r", finish=None):
    """The deltas for `text` streamed `chunk` tokens at a time; the last chunk carries
    `finish` (a length finish by default)."""
    ids = tokenizer.encode(text)
    deltas = []
    for i in range(0, len(ids), chunk):
        last = i + chunk >= len(ids)
        fin = (finish or {"type": "length", "matched": None}) if last else None
        first = params if i == 0 else None
        deltas.append(detok.step([rid], [ids[i : i + chunk]], [fin], [first])[0])
    return deltas


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_streaming_utf8_never_broken(tokenizer, chunk):
    detok = IncrementalDetokenizer(tokenizer)
    text = "héllo wörld 你好 — ünïcödé ok"
    deltas = stream(detok, tokenizer, text, DecodeParams(stream=True), chunk)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert detok.states == {}


def test_non_streaming_decodes_at_finish(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    deltas = stream(detok, tokenizer, "def f(x): return x", DecodeParams(stream=False))
    assert deltas[:-1] == [""] * (len(deltas) - 1)
    assert deltas[-1] == "def f(x): return x"


def test_skip_special_tokens(tokenizer):
    text = "a<|im_end|>b"
    keep = "".join(
        stream(
            IncrementalDetokenizer(tokenizer),
            tokenizer,
            text,
            DecodeParams(skip_special_tokens=False, stream=True),
        )
    )
    skip = "".join(
        stream(
            IncrementalDetokenizer(tokenizer),
            tokenizer,
            text,
            DecodeParams(skip_special_tokens=True, stream=True),
        )
    )
    assert keep == text and skip == "ab"


def _through_stop(tokenizer, text, stop):
    """`text` up to the token that completes the last occurrence of `stop` (where the
    scheduler, checking every token, finishes a request that stops on it)."""
    ids = tokenizer.encode(text)
    count = text.count(stop)
    end = next(n for n in range(1, len(ids) + 1) if tokenizer.decode(ids[:n]).count(stop) == count)
    return tokenizer.decode(ids[:end])


@pytest.mark.parametrize("stream_output", [False, True])
@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_stop_string_trimmed_and_held_back(tokenizer, no_stop_trim, stream_output):
    params = DecodeParams(stream=stream_output, stop_strs=("STOP",), no_stop_trim=no_stop_trim)
    text = _through_stop(tokenizer, "abc ST xyz STOP tail", "STOP")
    stop = {"type": "stop", "matched": "STOP"}
    deltas = stream(IncrementalDetokenizer(tokenizer), tokenizer, text, params, finish=stop)
    assert "".join(deltas) == ("abc ST xyz STOP" if no_stop_trim else "abc ST xyz ")
    if stream_output:  # "ST" went out only once it could no longer become "STOP"
        assert any(d.endswith("ST") or "ST " in d for d in deltas[:-1])


def test_a_stop_the_scheduler_let_pass_is_text(tokenizer):
    """A stop string inside min_new_tokens does not end the request: a length finish
    keeps it, and a later stop finish trims at the later occurrence only."""
    params = DecodeParams(stream=True, stop_strs=("STOP",))
    text = "a STOP b STOP c"
    kept = stream(IncrementalDetokenizer(tokenizer), tokenizer, text, params)
    assert "".join(kept) == text
    head = _through_stop(tokenizer, "a STOP b STOP", "STOP")
    assert head.count("STOP") == 2
    stop = {"type": "stop", "matched": "STOP"}
    for stream_output in (False, True):
        params = DecodeParams(stream=stream_output, stop_strs=("STOP",))
        out = stream(IncrementalDetokenizer(tokenizer), tokenizer, head, params, finish=stop)
        assert "".join(out) == "a STOP b "


def test_stop_helpers():
    assert find_stop("a b c", ["c", "b"]) == (2, "b")
    assert find_stop("ab ab", ["ab"], ends_after=3) == (3, "ab")
    assert find_stop("ab ab", ["ab"], ends_after=2) == (3, "ab")  # [0, 2) ends at 2
    assert find_stop("ab ab", ["ab"], ends_after=1) == (0, "ab")
    assert find_stop("xaaa", ["aa"], ends_after=2) == (1, "aa")  # overlapping: the first
    assert find_stop("xaaa", ["aa"], ends_after=3) == (2, "aa")
    assert partial_stop_len("hello wor", ["world"]) == 3
    assert partial_stop_len("hello", ["xyz"]) == 0


def test_batch_of_requests_independent(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    a, b = tokenizer.encode("alpha beta"), tokenizer.encode("gamma")
    p = DecodeParams(stream=True)
    d1 = detok.step(["a", "b"], [a[:2], b[:1]], [None, None], [p, p])
    d2 = detok.step(["a", "b"], [a[2:], b[1:]], [{"type": "stop"}, {"type": "stop"}], [None, None])
    assert d1[0] + d2[0] == "alpha beta" and d1[1] + d2[1] == "gamma"


class _PoisonTokenizer:
    """Wraps a tokenizer; decoding any sequence holding POISON raises."""

    POISON = 7

    def __init__(self, inner) -> None:
        self.inner = inner

    def batch_decode(self, seqs, **kw):
        if any(self.POISON in seq for seq in seqs):
            raise RuntimeError("cannot decode token 7")
        return self.inner.batch_decode(seqs, **kw)


def _token_batch(rids, new_ids, finished, params):
    from sglang.srt.managers.io_struct import BatchTokenIDOutput

    n = len(rids)
    return BatchTokenIDOutput(
        rids=rids,
        new_output_ids=new_ids,
        finished_reasons=finished,
        prompt_tokens=[1] * n,
        completion_tokens=[len(x) for x in new_ids],
        cached_tokens=[0] * n,
        queue_times=[None] * n,
        decode_params=params,
    )


def test_one_undecodable_request_fails_alone(tokenizer):
    """The faulty request ends with a 500 abort from the detokenizer; the others in
    the same batch get exactly the text they would have got alone."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    manager = DetokenizerManager(_PoisonTokenizer(tokenizer), None, None)
    good = tokenizer.encode("hello world, again")
    params = DecodeParams(stream=True)
    first = _token_batch(
        ["a", "bad", "b"], [good[:3], [5, _PoisonTokenizer.POISON], good[:2]],
        [None, None, None], [params, params, params],
    )  # fmt: skip
    out = manager.handle(first)
    assert out.finished_reasons[1]["type"] == "abort"
    assert out.finished_reasons[1]["status_code"] == 500
    assert out.finished_reasons[1]["origin"] == "detokenizer"
    assert out.finished_reasons[0] is None and out.finished_reasons[2] is None
    done = {"type": "length", "matched": None}
    last = _token_batch(
        ["a", "bad", "b"], [good[3:], [9], good[2:]], [done, done, done], [None] * 3
    )
    out2 = manager.handle(last)
    assert out.new_texts[0] + out2.new_texts[0] == tokenizer.decode(good)
    assert out.new_texts[2] + out2.new_texts[2] == tokenizer.decode(good)
    assert out2.new_texts[1] == "" and not manager.failed_rids and not manager.detok.states


@pytest.mark.parametrize("skip", [True, False])
def test_rust_decoder_gives_batch_decode_text(tokenizer, skip):
    """The streaming path decodes through the tokenizers.Tokenizer directly; it must
    return what transformers' batch_decode returns, special tokens and split UTF-8
    included."""
    from sglang.srt.managers.detokenizer_manager import rust_decoder

    rust = rust_decoder(tokenizer)
    assert rust is not None
    gen = __import__("random").Random(0)
    specials = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    for n in (1, 2, 5, 40):
        ids = [gen.randrange(len(tokenizer)) for _ in range(n)] + specials[: n % 3]
        assert rust.decode(ids, skip_special_tokens=skip) == tokenizer.batch_decode(
            [ids], skip_special_tokens=skip
        )[0]
    detok = IncrementalDetokenizer(tokenizer)
    text = "a<|im_end|>héllo 你好"
    got = "".join(stream(detok, tokenizer, text, DecodeParams(skip_special_tokens=skip, stream=True)))
    assert got == tokenizer.batch_decode([tokenizer.encode(text)], skip_special_tokens=skip)[0]


def test_rust_path_only_where_decode_runs_no_clean_up_pass(tokenizer, monkeypatch):
    """The flag alone does not pick the transformers path: transformers 5 ignores it for
    BPE models (Llama 3 sets it), and then the rust decode gives decode's text."""
    from sglang.srt.managers.detokenizer_manager import rust_decoder

    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    ids = tokenizer.encode("a , b . it ' s", add_special_tokens=False)
    cleans = tokenizer.decode(ids) != tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    assert (rust_decoder(tokenizer) is None) == cleans
    forced = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    monkeypatch.setattr(tokenizer, forced, True, raising=False)
    assert tokenizer.decode(ids) != tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    assert rust_decoder(tokenizer) is None  # decode cleans up now
    assert rust_decoder(_PoisonTokenizer(tokenizer)) is None
