"""Issue 9, part 2: stop strings that span many tokens end generation (scheduler)
and are trimmed from the text (detokenizer), the two agreeing token for token."""

from __future__ import annotations

import pytest

from sglang.srt.managers.detokenizer_manager import (
    IncrementalDetokenizer,
    byte_fallback_ids,
    silent_token_ids,
    stop_window_tokens,
    trim_incomplete_utf8,
)
from sglang.srt.managers.io_struct import DecodeParams
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler_parts.results import SchedulerResultsMixin
from sglang.srt.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.test.corpus import save_tokenizer_files, train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    save_tokenizer_files(train_tokenizer(vocab_size=1024, max_bytes=300_000), out, 2048)
    return AutoTokenizer.from_pretrained(str(out))


class StopChecker(SchedulerResultsMixin):
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.silent_token_ids = silent_token_ids(tokenizer)
        self.byte_fallback_ids = byte_fallback_ids(tokenizer)
        self.context_len = 10**6
        self.eos_token_ids = set()


def generate(
    tokenizer, text: str | list[int], stop: list[str], no_stop_trim: bool = False,
    **limits: int,
):  # fmt: skip
    """Feed `text`'s tokens (or these ids) one at a time through the scheduler's stop
    check; returns (tokens generated, finish reason). `limits`: max/min_new_tokens."""
    limits.setdefault("max_new_tokens", 1000)
    params = SamplingParams(stop=stop, no_stop_trim=no_stop_trim, **limits)
    params.normalize()
    req = Req("r", [1, 2, 3], params)
    checker = StopChecker(tokenizer)
    ids = text if isinstance(text, list) else tokenizer.encode(text, add_special_tokens=False)
    for token in ids:
        req.output_ids.append(token)
        checker.check_finished(req)
        if req.finished:
            break
    return req.output_ids, req.finished_reason


def detokenize(tokenizer, ids, finish, stop, stream, no_stop_trim=False) -> str:
    params = DecodeParams(stop_strs=tuple(stop), stream=stream, no_stop_trim=no_stop_trim)
    detok = IncrementalDetokenizer(tokenizer)
    out = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        out.append(detok.step(["r"], [[token]], [finish if last else None], [params])[0])
    return "".join(out)


CASES = [
    ("prefix 你好世界 and more text", "你好"),  # 6 byte tokens for 2 characters
    ("x = 1 日本語 y = 2", "本語"),
    ("def f(x):\n    return x + 1\n\nprint(f(2))", "return x + 1"),
    ("alpha beta gamma delta", " gamma"),  # a stop that starts with a space
]


@pytest.mark.parametrize("text,stop", CASES)
@pytest.mark.parametrize("stream", [False, True])
def test_multi_token_stop_ends_generation_and_is_trimmed(tokenizer, text, stop, stream):
    stop_tokens = tokenizer.encode(stop, add_special_tokens=False)
    assert len(stop_tokens) > 1 or len(stop.encode()) > len(stop)
    ids, finish = generate(tokenizer, text, [stop, "@"])  # "@" never produced
    assert finish == {"type": "stop", "matched": stop}
    full = tokenizer.decode(ids)
    assert full.endswith(stop) or stop in full[-len(stop) - 8 :]
    assert stop not in tokenizer.decode(ids[:-1])  # stopped at the completing token
    expected = text[: text.index(stop)]
    assert detokenize(tokenizer, ids, finish, [stop], stream) == expected
    kept = detokenize(tokenizer, ids, finish, [stop], stream, no_stop_trim=True)
    assert kept == expected + stop


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("run", [1, 6, 40])
def test_a_stop_across_skipped_special_tokens_is_found(tokenizer, run, stream):
    # special tokens decode to nothing under skip_special_tokens: the stop "gamma d"
    # lies in the text although a run of them sits between its characters
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start in silent_token_ids(tokenizer)
    ids = (tokenizer.encode("alpha beta gamm", add_special_tokens=False) + [im_start] * run
           + tokenizer.encode("a delta epsilon", add_special_tokens=False))  # fmt: skip
    out, finish = generate(tokenizer, ids, ["gamma d"])
    assert finish == {"type": "stop", "matched": "gamma d"}
    assert "gamma d" not in tokenizer.decode(out[:-1], skip_special_tokens=True)
    assert detokenize(tokenizer, out, finish, ["gamma d"], stream) == "alpha beta "


def test_earliest_stop_wins(tokenizer):
    ids, finish = generate(tokenizer, "one two three four", ["four", "two"])
    assert finish["matched"] == "two"


def test_window_covers_the_stop_bytes():
    assert stop_window_tokens(["ab", "你好世界"]) >= len("你好世界".encode())
    assert trim_incomplete_utf8("ab\ufffd\ufffd") == "ab"


def test_a_stop_completed_by_the_last_allowed_token_is_a_stop(tokenizer):
    text = "alpha beta gamma delta"
    through = generate(tokenizer, text, ["gamma"])[0]
    ids, finish = generate(tokenizer, text, ["gamma"], max_new_tokens=len(through))
    assert finish == {"type": "stop", "matched": "gamma"}
    assert detokenize(tokenizer, ids, finish, ["gamma"], stream=True) == "alpha beta "
    ids, finish = generate(tokenizer, text, ["gamma"], max_new_tokens=len(through) - 1)
    assert finish["type"] == "length"
    cut = detokenize(tokenizer, ids, finish, ["gamma"], stream=True)  # a length finish: all
    assert cut.startswith("alpha beta g") and "alpha beta gamma".startswith(cut)


@pytest.mark.parametrize("stream", [False, True])
def test_stops_inside_min_new_tokens_are_text(tokenizer, stream):
    """As vLLM: no stop before min_new_tokens; the first one completed after ends it,
    and the text is trimmed there, not at the earlier one."""
    text = "x STOP y z w STOP tail and more words"
    first = len(generate(tokenizer, text, ["STOP"])[0])
    ids, finish = generate(tokenizer, text, ["STOP"], min_new_tokens=first + 1)
    assert finish == {"type": "stop", "matched": "STOP"}
    assert detokenize(tokenizer, ids, finish, ["STOP"], stream) == "x STOP y z w "
    # No second stop: it runs to max_new_tokens and the text keeps the first one.
    ids, finish = generate(
        tokenizer, "x STOP y z w", ["STOP"], min_new_tokens=first + 1, max_new_tokens=first + 3
    )
    assert finish["type"] == "length"
    assert detokenize(tokenizer, ids, finish, ["STOP"], stream).startswith("x STOP y")


def test_eos_as_the_last_allowed_token_is_a_stop(tokenizer):
    params = SamplingParams(max_new_tokens=2)
    params.normalize()
    req = Req("r", [1, 2, 3], params)
    checker = StopChecker(tokenizer)
    checker.eos_token_ids = {2}
    for token in (5, 2):
        req.output_ids.append(token)
        checker.check_finished(req)
    assert req.finished_reason == {"type": "stop", "matched": 2}


@pytest.mark.parametrize("text", ["x = 1 日本語", "alpha beta gamma", "def f(x):\n    return"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_token_is_left_out_of_the_text(tokenizer, text, stream):
    """As SGLang and vLLM: a request finished by a stop token (EOS, stop_token_ids)
    leaves that token's text out, unless no_stop_trim; the token ids keep it. A byte
    token that completes a character takes the character's earlier bytes with it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    finish = {"type": "stop", "matched": ids[-1]}
    expected = trim_incomplete_utf8(tokenizer.decode(ids[:-1]))
    assert detokenize(tokenizer, ids, finish, [], stream) == expected
    assert detokenize(tokenizer, ids, finish, [], stream, no_stop_trim=True) == text


def byte_token(tokenizer, byte: int) -> int:
    """The byte-level BPE token of one raw byte: GPT-2's byte-to-character alphabet
    writes bytes 161-172 and 174-255 as the character of that code point."""
    assert 161 <= byte <= 255 and byte != 173
    return tokenizer.convert_tokens_to_ids(chr(byte))


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_written_over_more_than_1024_tokens_is_found(tokenizer, stream):
    # 520 x "é" as two byte tokens each: 1,040 tokens, within the 1,024-character limit
    # of a stop string; the window reached 1,024 tokens back at most, so the request ran
    # on and the whole stop stayed in its text
    stop = "é" * 520
    head = tokenizer.encode("head ", add_special_tokens=False)
    ids = head + [byte_token(tokenizer, 0xC3), byte_token(tokenizer, 0xA9)] * 520
    tail = tokenizer.encode(" tail", add_special_tokens=False)
    out, finish = generate(tokenizer, ids + tail, [stop], max_new_tokens=2000)
    assert finish == {"type": "stop", "matched": stop}
    assert out == ids
    assert detokenize(tokenizer, out, finish, [stop], stream) == "head "


@pytest.mark.parametrize("stream", [False, True])
def test_a_replacement_character_stop_cuts_at_its_first_occurrence(tokenizer, stream):
    # two stray bytes decode to two U+FFFD; the scheduler matches the first once the next
    # token shows they are no unfinished character: the text was cut at the last one
    stray = [byte_token(tokenizer, 0xFF)] * 2
    ids = tokenizer.encode("alpha", add_special_tokens=False) + stray
    ids += tokenizer.encode(" beta gamma", add_special_tokens=False)
    out, finish = generate(tokenizer, ids, ["\ufffd"])
    assert finish == {"type": "stop", "matched": "\ufffd"}
    assert detokenize(tokenizer, out, finish, ["\ufffd"], stream) == "alpha"
