"""ReasoningParser: reasoning_content vs content, whole and streamed."""

from __future__ import annotations

import random

import pytest

from sglang.srt.parser.reasoning_parser import REASONING_PARSER_NAMES, ReasoningParser

QWEN3_THINKING = (
    "<think>\nOkay, the user asks for 2 + 2. That is basic arithmetic: 4.\n\n"
    "Let me double-check < and > signs: 4 > 3.\n</think>\n\nThe answer is **4**."
)
R1_OUTPUT = (
    "Alright, 17 is prime because no number from 2 to 4 divides it.\n"
    "</think>\n\nYes, 17 is a prime number."
)
R1_0528_OUTPUT = "<think>\nLet me recall: Paris.\n</think>\n\nThe capital of France is Paris."

# (case id, parser, force_reasoning, output, expected (reasoning, content))
CASES = [
    (
        "qwen3-thinking",
        "qwen3",
        None,
        QWEN3_THINKING,
        (
            "Okay, the user asks for 2 + 2. That is basic arithmetic: 4.\n\n"
            "Let me double-check < and > signs: 4 > 3.",
            "The answer is **4**.",
        ),
    ),
    ("qwen3-content-only", "qwen3", None, "  The answer is 4.\n", (None, "  The answer is 4.\n")),
    ("qwen3-starts-with-tag-like", "qwen3", None, "<b>bold</b> text", (None, "<b>bold</b> text")),
    (
        "qwen3-truncated",
        "qwen3",
        None,
        "<think>\nStill thinking about 2 + ",
        ("Still thinking about 2 +", ""),
    ),
    (
        "qwen3-empty-think",
        "qwen3",
        None,
        "<think>\n\n</think>\n\nHello!",
        (None, "Hello!"),
    ),
    (
        "r1-forced",
        "deepseek-r1",
        None,
        R1_OUTPUT,
        (
            "Alright, 17 is prime because no number from 2 to 4 divides it.",
            "Yes, 17 is a prime number.",
        ),
    ),
    (
        "r1-0528-writes-start-tag",
        "deepseek-r1",
        None,
        R1_0528_OUTPUT,
        ("Let me recall: Paris.", "The capital of France is Paris."),
    ),
    (
        "r1-truncated",
        "deepseek-r1",
        None,
        "We need to find x such that x^2 = 2. So x ≈ 1.41</thi",
        ("We need to find x such that x^2 = 2. So x ≈ 1.41</thi", ""),
    ),
    (
        "r1-forcing-off",
        "deepseek-r1",
        False,
        "The capital of France is Paris.",
        (None, "The capital of France is Paris."),
    ),
    (
        "qwen3-forced-on",
        "qwen3",
        True,
        "thinking without a tag</think>answer",
        ("thinking without a tag", "answer"),
    ),
    (
        "kimi-tags",
        "kimi",
        None,
        "◁think▷Reason here.◁/think▷Final.",
        ("Reason here.", "Final."),
    ),
]


def _streamed(parser: ReasoningParser, text: str, rng: random.Random) -> tuple[str, str]:
    reasoning, content = [], []
    pos = 0
    while pos < len(text):
        size = rng.randint(1, 8)
        r, c = parser.parse_stream_chunk(text[pos : pos + size])
        reasoning.append(r)
        content.append(c)
        pos += size
    r, c = parser.finish()
    return "".join(reasoning) + r, "".join(content) + c


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_whole_output(case):
    _, name, force, text, expected = case
    assert ReasoningParser(name, force_reasoning=force).parse_non_stream(text) == expected


@pytest.mark.parametrize("stream_reasoning", [True, False])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_streaming_matches_whole_output(case, stream_reasoning):
    _, name, force, text, (reasoning, content) = case
    for seed in range(20):
        parser = ReasoningParser(name, stream_reasoning=stream_reasoning, force_reasoning=force)
        assert _streamed(parser, text, random.Random(seed)) == (reasoning or "", content)


def test_stream_holds_back_only_a_possible_tag():
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<thi") == ("", "")
    assert parser.parse_stream_chunk("nk>\nStep one") == ("Step one", "")
    parser = ReasoningParser("deepseek-r1")
    assert parser.parse_stream_chunk("Step one.") == ("Step one.", "")
    assert parser.parse_stream_chunk(" Two </th") == (" Two", "")
    assert parser.parse_stream_chunk("ink>\n\nDone") == ("", "Done")
    assert parser.parse_stream_chunk(" now.") == ("", " now.")


def test_content_streams_at_once_when_not_reasoning():
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("Hello") == ("", "Hello")
    assert parser.parse_stream_chunk(" <think>") == ("", " <think>")


def test_stream_reasoning_false_sends_reasoning_in_one_piece():
    parser = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert parser.parse_stream_chunk("Step one.") == ("", "")
    assert parser.parse_stream_chunk(" Two.</think>Answer") == ("Step one. Two.", "Answer")


def test_names_and_unknown_name():
    assert {"qwen3", "deepseek-r1"} <= set(REASONING_PARSER_NAMES)
    with pytest.raises(ValueError, match="'gpt-oss'.*deepseek-r1.*qwen3"):
        ReasoningParser("gpt-oss")
