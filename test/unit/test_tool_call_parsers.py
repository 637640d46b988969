"""Tool-call parsers on recorded-style outputs of each model family.

Whole-text parses are checked against expected text and calls; streaming is
checked against the whole-text parse over many random chunkings.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sglang.srt.parser.function_call import (
    TOOL_CALL_PARSER_NAMES,
    FunctionCallParser,
    check_tool_choice,
    parse_constrained_calls,
    tool_call_schema,
)
from sglang.srt.parser.function_call.json_reader import JsonObjectReader


def _tool(name: str, parameters: dict | None) -> dict:
    function = {"name": name, "description": f"{name} tool"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [
    _tool(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    ),
    _tool(
        "get_time",
        {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    ),
    _tool("search", {"type": "object", "properties": {"query": {"type": "string"}}}),
    _tool("list_alarms", None),
]
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}

NESTED_ARGS = {
    "query": "hotels",
    "filters": {"date_range": {"from": "2024-06-01", "to": None}, "tags": ["pool", "spa"]},
    "limit": 10,
    "exact": True,
    "min_score": 0.75,
}
NESTED_JSON = (
    '{"query": "hotels", "filters": {"date_range": {"from": "2024-06-01", "to": null},'
    ' "tags": ["pool", "spa"]}, "limit": 10, "exact": true, "min_score": 0.75}'
)
UNICODE_ARGS = {"city": "São Paulo, 東京 🌧 café", "unit": "celsius"}
# The same text as the model writes it: some characters raw, some escaped
# (\u00e9 is é; \ud83c\udf27 is the surrogate pair of 🌧).
UNICODE_JSON = '{"city": "S\u00e3o Paulo, 東京 \\ud83c\\udf27 caf\\u00e9", "unit": "celsius"}'

# (case id, parser, output, expected normal text, expected [(name, args)])
CASES = [
    # --- Hermes / Qwen2.5 / Qwen3 ---
    (
        "hermes-one",
        "qwen25",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (
        "hermes-text-around-calls",
        "qwen25",
        'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n'
        "</tool_call>\n  \nDone.\n",
        "Sure.\n\n  \nDone.",  # spacing after a call goes out with the text that follows
        [("get_time", {"timezone": "UTC"})],
    ),
    (
        "hermes-two",
        "qwen3",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n'
        "</tool_call>",
        "",  # the newline between calls is not content (as vLLM's and SGLang's parsers)
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})],
    ),
    (
        "hermes-text-before",
        "hermes",
        "I'll check the current weather in Paris for you.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "I'll check the current weather in Paris for you.\n",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "hermes-nested",
        "qwen25",
        f'<tool_call>\n{{"name": "search", "arguments": {NESTED_JSON}}}\n</tool_call>',
        "",
        [("search", NESTED_ARGS)],
    ),
    (
        "hermes-unicode",
        "qwen25",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {UNICODE_JSON}}}\n</tool_call>',
        "",
        [("get_weather", UNICODE_ARGS)],
    ),
    (
        "hermes-compact-and-text-after",
        "qwen25",
        '<tool_call>{"name":"search","arguments":{"query":"a </tool_call> \\"quoted\\"\\n"}}'
        "</tool_call>\nDone.",
        "\nDone.",
        [("search", {"query": 'a </tool_call> "quoted"\n'})],
    ),
    (
        "hermes-no-arguments",
        "qwen25",
        '<tool_call>\n{"name": "list_alarms"}\n</tool_call>',
        "",
        [("list_alarms", {})],
    ),
    (
        "hermes-unknown-function",
        "qwen25",
        'Checking.\n<tool_call>\n{"name": "get_stock", "arguments": {"ticker": "AAPL"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n'
        "</tool_call>",
        'Checking.\n<tool_call>\n{"name": "get_stock", "arguments": {"ticker": "AAPL"}}\n'
        "</tool_call>\n",
        [("get_time", {"timezone": "UTC"})],
    ),
    (
        "hermes-arguments-first-and-as-string",
        "qwen25",
        '<tool_call>\n{"arguments": {"timezone": "UTC"}, "name": "get_time"}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
        "</tool_call>",
        "",
        [("get_time", {"timezone": "UTC"}), ("get_weather", {"city": "Paris"})],
    ),
    (
        "hermes-numbers-escapes-raw-newline",
        "qwen25",
        '<tool_call>\n{"name": "search", "arguments": {"query": "a\\tb\\/c\nd", '
        '"limit": 1E2, "offset": -0.50, "page": 0}}\n</tool_call>',
        "",
        [("search", {"query": "a\tb/c\nd", "limit": 100.0, "offset": -0.5, "page": 0})],
    ),
    ("hermes-plain", "qwen25", "The capital of France is Paris. 1 < 2 <b>", None, []),
    # --- Llama 3.x JSON ---
    (
        "llama-python-tag",
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "llama-bare",
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (
        "llama-two",
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})],
    ),
    (
        "llama-text-after",
        "llama3",
        '<|python_tag|>{"name": "search", "parameters": {"query": "x"}}\n\nDone.\n',
        "\n\nDone.",  # the spacing before the text is the text's own, as with hermes
        [("search", {"query": "x"})],
    ),
    (
        "llama-text-before",
        "llama3",
        'Let me look that up.<|python_tag|>{"name": "search", "parameters": {"query": "x"}}',
        "Let me look that up.",
        [("search", {"query": "x"})],
    ),
    (
        "llama-nested",
        "llama3",
        f'<|python_tag|>{{"name": "search", "parameters": {NESTED_JSON}}}',
        "",
        [("search", NESTED_ARGS)],
    ),
    (
        "llama-unicode",
        "llama3",
        f'{{"name": "get_weather", "parameters": {UNICODE_JSON}}}',
        "",
        [("get_weather", UNICODE_ARGS)],
    ),
    (
        "llama-unknown-function",
        "llama3",
        '{"name": "get_stock", "parameters": {"ticker": "AAPL"}}',
        None,
        [],
    ),
    ("llama-json-answer", "llama3", '  {"answer": 42, "unit": "km"}', None, []),
    ("llama-plain", "llama3", "It is sunny in Paris today.", None, []),
    # --- Mistral ---
    (
        "mistral-one",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "mistral-two",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})],
    ),
    (
        "mistral-text-before",
        "mistral",
        'Sure, one moment. [TOOL_CALLS] [{"name": "search", "arguments": {"query": "x"}}]',
        "Sure, one moment. ",
        [("search", {"query": "x"})],
    ),
    (
        "mistral-nested",
        "mistral",
        f'[TOOL_CALLS] [{{"name": "search", "arguments": {NESTED_JSON}}}]',
        "",
        [("search", NESTED_ARGS)],
    ),
    (
        "mistral-unicode",
        "mistral",
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {UNICODE_JSON}}}]',
        "",
        [("get_weather", UNICODE_ARGS)],
    ),
    (
        "mistral-unknown-then-known",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_stock", "arguments": {"ticker": "AAPL"}}, '
        '{"name": "get_time", "arguments": {"timezone": "UTC"}}]',
        '[TOOL_CALLS] [{"name": "get_stock", "arguments": {"ticker": "AAPL"}}',
        [("get_time", {"timezone": "UTC"})],
    ),
    (
        "llama-arguments-key",
        "llama3",
        '<|python_tag|>{"type": "function", "name": "get_time", "arguments": {"timezone": "UTC"}}',
        "",
        [("get_time", {"timezone": "UTC"})],
    ),
    (
        "mistral-unknown-function",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_stock", "arguments": {"ticker": "AAPL"}}]',
        None,
        [],
    ),
    ("mistral-plain", "mistral", "Paris is [probably] sunny.", None, []),
    # --- pythonic ---
    (
        "pythonic-one",
        "pythonic",
        '[get_weather(city="Paris")]',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "pythonic-two",
        "pythonic",
        "[get_weather(city='Paris', unit='celsius'), get_time(timezone=\"Europe/Paris\")]",
        "",
        [
            ("get_weather", {"city": "Paris", "unit": "celsius"}),
            ("get_time", {"timezone": "Europe/Paris"}),
        ],
    ),
    (
        "pythonic-text-before",
        "pythonic",
        'Let me check [1] first.\n[search(query="a) ] \\"b\\"")]',
        "Let me check [1] first.\n",
        [("search", {"query": 'a) ] "b"'})],
    ),
    (
        "pythonic-nested",
        "pythonic",
        '[search(query="hotels", filters={"date_range": {"from": "2024-06-01", "to": None}, '
        '"tags": ["pool", "spa"]}, limit=10, exact=True, min_score=0.75)]',
        "",
        [("search", NESTED_ARGS)],
    ),
    (
        "pythonic-unicode",
        "pythonic",
        "[get_weather(city='''São Paulo, 東京 🌧 café''', unit=\"celsius\")]",
        "",
        [("get_weather", UNICODE_ARGS)],
    ),
    ("pythonic-unknown-function", "pythonic", '[get_stock(ticker="AAPL")]', None, []),
    ("pythonic-plain", "pythonic", "See [the docs](https://x.org) and [1, 2].", None, []),
]

# (case id, parser, output): not calls; the whole-text parse keeps the text.
MALFORMED = [
    (
        "hermes-bad-json",
        "qwen25",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",}}\n</tool_call>',
    ),
    (
        "hermes-truncated",
        "qwen25",
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    ),
    ("hermes-not-json", "qwen3", "<tool_call>\n<function=get_weather>\n</tool_call>"),
    ("hermes-name-not-string", "qwen25", '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>'),
    (
        "llama-bad-json",
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": Paris}}',
    ),
    ("llama-truncated", "llama3", '{"name": "get_weather", "parameters": {"city": "Pa'),
    ("llama-nan", "llama3", '{"name": "search", "parameters": {"limit": NaN}}'),
    (
        "mistral-bad-json",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}]',
    ),
    ("mistral-truncated", "mistral", '[TOOL_CALLS] [{"name": "get_weather", "argu'),
    ("pythonic-bad-value", "pythonic", "[get_weather(city=Paris)]"),
    ("pythonic-positional", "pythonic", '[get_weather("Paris")]'),
    ("pythonic-truncated", "pythonic", '[get_weather(city="Par'),
    ("pythonic-set", "pythonic", "[search(query={1, 2})]"),
    # a repeated key: which value was meant? (the repeated name raised inside the parser)
    ("hermes-repeated-name", "qwen25",
     '<tool_call>\n{"name": "get_weather", "arguments": {}, "name": "search"}\n</tool_call>'),
    ("hermes-repeated-arguments", "qwen25",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}, '
     '"arguments": {"city": "Rome"}}\n</tool_call>'),
    ("hermes-repeated-inner-key", "qwen25",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "city": "Rome"}}\n</tool_call>'),
    ("llama-repeated-name", "llama3", '{"name": "get_weather", "parameters": {}, "name": "search"}'),
    ("mistral-repeated-name", "mistral",
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {}, "name": "search"}]'),
]  # fmt: skip


def _whole(parser_name: str, text: str):
    return FunctionCallParser(TOOLS, parser_name).parse_non_stream(text)


def _streamed(parser_name: str, text: str, rng: random.Random):
    """Feed random chunks of 1..8 characters; check the item contract; join the results."""
    parser = FunctionCallParser(TOOLS, parser_name)
    normal, calls = [], {}
    pos = 0
    results = []
    while pos < len(text):
        size = rng.randint(1, 8)
        results.append(parser.parse_stream_chunk(text[pos : pos + size]))
        pos += size
    results.append(parser.finish_stream())
    for result in results:
        normal.append(result.normal_text)
        for item in result.calls:
            if item.name is not None:
                assert item.tool_index not in calls, "a call's name went out twice"
                assert item.parameters == ""
                calls[item.tool_index] = [item.name, ""]
            else:
                calls[item.tool_index][1] += item.parameters
    return "".join(normal), [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_whole_output(case):
    _, parser_name, text, expected_normal, expected_calls = case
    normal, calls = _whole(parser_name, text)
    assert normal == (text if expected_normal is None else expected_normal)
    assert [c.tool_index for c in calls] == list(range(len(expected_calls)))
    assert [(c.name, json.loads(c.parameters)) for c in calls] == expected_calls
    for call, (_, args) in zip(calls, expected_calls, strict=True):
        assert call.parameters == json.dumps(args, ensure_ascii=False)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_streaming_matches_whole_output(case):
    _, parser_name, text, _, _ = case
    normal, calls = _whole(parser_name, text)
    expected = (normal, [(c.name, c.parameters) for c in calls])
    for seed in range(20):
        assert _streamed(parser_name, text, random.Random(seed)) == expected, f"seed {seed}"


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_call_is_text(case):
    _, parser_name, text = case
    assert _whole(parser_name, text) == (text, [])
    for seed in range(20):
        normal, calls = _streamed(parser_name, text, random.Random(seed))
        # A name may have gone out before the call broke, but never a broken one.
        assert all(name in TOOL_NAMES for name, _ in calls)
        if not calls:
            assert normal == text


# A call that fails after its name went out: a stream cannot take the name back, and
# sends none of the rest of its region as content either (no stray "}}\n</tool_call>");
# the whole-text parse shows the region as written. (normal text of the stream, calls
# the stream sends with their argument text: for a broken one, what may have gone out.)
SENT_THEN_FAILED = [
    ("hermes-number-past-float", "qwen25",
     'Hi <tool_call>\n{"name": "search", "arguments": {"q": 1e400}}\n</tool_call> bye',
     "Hi  bye", [("search", '{"q": 1e400}')]),
    ("hermes-repeated-inner-key", "qwen25",
     'Hi <tool_call>\n{"name": "search", "arguments": {"q": 1, "q": 2}}\n</tool_call> bye',
     "Hi  bye", [("search", '{"q": 1, "q": 2}')]),
    ("hermes-bad-literal", "qwen25",
     'Hi <tool_call>\n{"name": "search", "arguments": {"q": tru}}\n</tool_call> bye',
     "Hi  bye", [("search", '{"q": ')]),
    ("hermes-bad-literal-unclosed", "qwen25",
     'Hi <tool_call>\n{"name": "search", "arguments": {"q": tru}} and so on',
     "Hi ", [("search", '{"q": ')]),
    ("mistral-repeated-inner-key", "mistral",
     '[TOOL_CALLS] [{"name": "search", "arguments": {"q": 1, "q": 2}}] bye',
     " bye", [("search", '{"q": 1, "q": 2}')]),
]  # fmt: skip


@pytest.mark.parametrize("case", SENT_THEN_FAILED, ids=[c[0] for c in SENT_THEN_FAILED])
def test_a_call_failing_after_its_name_leaves_no_markup_in_the_stream(case):
    _, parser_name, text, streamed_normal, streamed_calls = case
    assert _whole(parser_name, text) == (text, [])
    for seed in range(20):
        normal, calls = _streamed(parser_name, text, random.Random(seed))
        assert normal == streamed_normal, f"seed {seed}"
        _assert_sent(calls, streamed_calls)


def _assert_sent(calls: list[tuple], expected: list[tuple]) -> None:
    """The same calls with the same arguments, up to where they broke, whatever the
    chunking (the piece read in the chunk that showed the break was lost: the streamed
    arguments depended on where the chunks fell)."""
    assert calls == expected


def test_a_broken_call_ends_where_the_next_call_opens():
    text = ('Hi <tool_call>{"name": "search", "arguments": {"q": tru}'
            '<tool_call>{"name": "get_time", "arguments": {"timezone": "UTC"}}</tool_call>')  # fmt: skip
    normal, calls = _whole("qwen25", text)
    assert normal == text[: text.index('<tool_call>{"name": "get_time')]
    assert [(c.name, c.parameters) for c in calls] == [("get_time", '{"timezone": "UTC"}')]
    for seed in range(20):
        normal, calls = _streamed("qwen25", text, random.Random(seed))
        assert normal == "Hi "
        _assert_sent(calls, [("search", '{"q": '), ("get_time", '{"timezone": "UTC"}')])
        assert calls[1][1] == '{"timezone": "UTC"}'


@pytest.mark.parametrize(
    "number, streamed", [("1e400", "1e400"), ("-1E+999", "-1E+999"), ("9" * 5000, "9" * 5000),
                         ("1.50", "1.5"), ("1e-400", "0.0")])  # fmt: skip
def test_the_reader_keeps_a_json_number_python_cannot_hold_as_written(number, streamed):
    reader = JsonObjectReader()
    events, used = reader.feed('{"a": ' + number + "}")
    assert reader.done and reader.error is None and used == len(number) + 7
    assert ("frag", streamed) in events


@pytest.mark.parametrize("number", ["01", "1.", "-", "1e", "1.e5", "+1", "1-2"])
def test_the_reader_refuses_what_is_no_json_number(number):
    reader = JsonObjectReader()
    reader.feed('{"a": ' + number + "}")
    assert reader.error is not None


def test_text_is_released_at_once_except_a_possible_marker():
    parser = FunctionCallParser(TOOLS, "qwen25")
    assert parser.parse_stream_chunk("Let me check").normal_text == "Let me check"
    assert parser.parse_stream_chunk(" <tool_").normal_text == " "
    assert parser.parse_stream_chunk("tip> ok").normal_text == "<tool_tip> ok"
    assert parser.parse_stream_chunk("<tool_").normal_text == ""
    assert parser.finish_stream().normal_text == "<tool_"


def test_arguments_stream_before_the_call_ends():
    parser = FunctionCallParser(TOOLS, "qwen25")
    head = '<tool_call>\n{"name": "search", "arguments": {"query": "long que'
    result = parser.parse_stream_chunk(head)
    assert [(c.name, c.parameters) for c in result.calls] == [
        ("search", ""),
        (None, '{"query": "long que'),
    ]
    tail = parser.parse_stream_chunk('ry"}}\n</tool_call>')
    assert [(c.name, c.parameters) for c in tail.calls] == [(None, 'ry"}')]


def test_no_tools_means_no_calls():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    assert FunctionCallParser([], "qwen25").parse_non_stream(text) == (text, [])


def test_has_tool_call():
    assert FunctionCallParser(TOOLS, "qwen25").has_tool_call("x <tool_call>")
    assert not FunctionCallParser(TOOLS, "qwen25").has_tool_call("plain")
    assert FunctionCallParser(TOOLS, "llama3").has_tool_call(' {"name": "x"}')
    assert FunctionCallParser(TOOLS, "llama3").has_tool_call("a<|python_tag|>")
    assert FunctionCallParser(TOOLS, "mistral").has_tool_call("[TOOL_CALLS] [")
    assert FunctionCallParser(TOOLS, "pythonic").has_tool_call("[ get_time(timezone='UTC')]")
    assert not FunctionCallParser(TOOLS, "pythonic").has_tool_call("[1, 2]")


def test_parser_names():
    assert set(TOOL_CALL_PARSER_NAMES) >= {
        "qwen25",
        "qwen3",
        "hermes",
        "llama3",
        "mistral",
        "pythonic",
    }
    with pytest.raises(ValueError, match="'qwen3_coder'.*qwen25.*pythonic"):
        FunctionCallParser(TOOLS, "qwen3_coder")


# --- constrained tool_choice ---


def test_required_schema_pairs_each_name_with_its_parameters():
    schema = tool_call_schema(TOOLS, "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_time", "parameters": {"timezone": "UTC"}},
        {"name": "list_alarms", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    bad = [
        [],
        [{"name": "get_time", "parameters": {"city": "Paris"}}],
        [{"name": "get_stock", "parameters": {}}],
        [{"name": "get_weather"}],
        {"name": "get_weather", "parameters": {"city": "Paris"}},
    ]
    for instance in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(instance, schema)


def test_named_schema_allows_only_that_function():
    choice = {"type": "function", "function": {"name": "get_time"}}
    schema = tool_call_schema(TOOLS, choice)
    jsonschema.validate([{"name": "get_time", "parameters": {"timezone": "UTC"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Paris"}}], schema)
    assert len(schema["items"]["anyOf"]) == 1


def test_function_without_parameters_takes_an_object():
    schema = tool_call_schema(TOOLS, {"type": "function", "function": {"name": "list_alarms"}})
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == {"type": "object"}


@pytest.mark.parametrize("choice", ["auto", "none", None])
def test_unconstrained_choices_have_no_schema(choice):
    assert tool_call_schema(TOOLS, choice) is None


def test_check_tool_choice():
    check_tool_choice(TOOLS, "required")
    check_tool_choice([], "auto")
    check_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    with pytest.raises(ValueError, match="required.*at least one tool"):
        check_tool_choice([], "required")
    with pytest.raises(ValueError, match="'get_stock'.*not in"):
        check_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_stock"}})
    with pytest.raises(ValueError, match="'sometimes'"):
        check_tool_choice(TOOLS, "sometimes")
    with pytest.raises(ValueError, match="tool_choice must be"):
        check_tool_choice(TOOLS, {"type": "function"})


def test_parse_constrained_calls():
    text = (
        '[{"name": "get_weather", "parameters": {"city": "São Paulo"}},'
        ' {"name": "get_time", "parameters": {"timezone":"UTC"}}]'
    )
    calls = parse_constrained_calls(text, TOOLS)
    assert [(c.tool_index, c.name, c.parameters) for c in calls] == [
        (0, "get_weather", '{"city": "São Paulo"}'),
        (1, "get_time", '{"timezone": "UTC"}'),
    ]
    # cut short (max_tokens): the calls as a stream sent them, the last one's arguments cut
    cut = parse_constrained_calls('[{"name": "get_weather", "parameters": {"ci', TOOLS)
    assert [(c.name, c.parameters) for c in cut] == [("get_weather", '{"ci')]
    assert parse_constrained_calls('[{"name": "get_weath', TOOLS) == []


@pytest.mark.parametrize("as_string", [True, False])
def test_arguments_nested_past_json_recursion_are_text(as_string):
    # json.loads/dumps raise RecursionError near depth 1000: such a call is no call,
    # as any malformed one, and neither the whole nor the streamed parse may raise
    deep = "[" * 3000 + "]" * 3000
    arguments = json.dumps('{"a": ' + deep + "}") if as_string else '{"a": ' + deep + "}"
    text = '<tool_call>{"name": "get_time", "arguments": ' + arguments + "}</tool_call>"
    assert _whole("hermes", text) == (text, [])
    normal, calls = _streamed("hermes", text, random.Random(0))
    # as for any malformed call: a stream may have sent the call before it broke
    assert all(name == "get_time" for name, _ in calls)
    if not calls:
        assert normal == text


def test_constrained_calls_nested_past_json_recursion_keep_their_text():
    # the grammar held them to the schema: read as a stream reads them, without recursion
    deep = "[" * 3000 + "]" * 3000
    text = '[{"name": "get_time", "parameters": {"a": ' + deep + "}}]"
    calls = parse_constrained_calls(text, TOOLS)
    assert [(c.name, c.parameters) for c in calls] == [("get_time", '{"a": ' + deep + "}")]


@pytest.mark.parametrize("cut", ["\n</tool_c", "\n<", "\n</tool_call"])
def test_a_close_cut_by_max_tokens_is_not_content(cut):
    # the region's close, cut short: "pre </tool_c" was the content, streamed or not
    text = 'pre <tool_call>\n{"name": "search", "arguments": {"query": "x"}}' + cut
    normal, calls = _whole("qwen25", text)
    assert normal.strip() == "pre" and [c.name for c in calls] == ["search"]
    parser = FunctionCallParser(TOOLS, "qwen25")
    pieces = [parser.parse_stream_chunk(text), parser.finish_stream()]
    assert "".join(p.normal_text for p in pieces).strip() == "pre"
