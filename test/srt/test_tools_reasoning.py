"""End to end: tool calling and reasoning content on a real server, parsers detected
from the chat template.

The tiny random-weight checkpoint gets a Qwen3-style chat template (`<tool_call>`,
`<think>` markup); the server starts with --tool-call-parser and --reasoning-parser
unset, so it must detect qwen25 / qwen3. A random model only writes well-formed
calls when the grammar makes it: `tool_choice` "required" is the test of that.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
import requests
from http_server_fixture import start_server
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "For each function call, return a json object within <tool_call></tool_call> tags."
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 400  # enough for a few grammar-shaped calls of a random model


def write_template(model_dir, template: str) -> None:
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2))
    (model_dir / "chat_template.jinja").write_text(template)


@pytest.fixture(scope="module")
def tools_model_dir(tmp_path_factory):
    from sglang.test.make_tiny_model import make_tiny_model

    model_dir = make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3-tools"))
    write_template(model_dir, TEMPLATE)
    return model_dir


@pytest.fixture(scope="module")
def server(tools_model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("tools-server") / "server.log"
    # A random model given JSON's free whitespace writes whitespace until max_tokens.
    flags = ["--constrained-json-disable-any-whitespace", "--random-seed", "0"]
    srv = start_server(tools_model_dir, log_path, "--served-model-name", "tiny", *flags)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def create(client, **kw):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, **kw)


def check_arguments(tool: dict, arguments: str) -> None:
    """The arguments are a JSON object the tool's parameter schema accepts."""
    schema = tool["function"]["parameters"]
    args = json.loads(arguments)
    assert isinstance(args, dict) and set(args) == set(schema["required"])
    for key, value in args.items():
        assert value in schema["properties"][key]["enum"]


def tool_named(name: str) -> dict:
    return next(t for t in TOOLS if t["function"]["name"] == name)


def streamed_calls(stream) -> tuple[list[dict], str | None, str]:
    """(calls rebuilt from the deltas, the finish reason, the streamed content)."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            if piece.index not in calls:
                assert piece.id and piece.type == "function" and piece.function.name
                calls[piece.index] = {"name": piece.function.name, "arguments": ""}
            else:
                assert piece.function.name is None
            calls[piece.index]["arguments"] += piece.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish, content


# --- detection ---------------------------------------------------------------------------------


def test_server_info_shows_the_detected_parsers(server):
    info = requests.get(server.base_url + "/server_info").json()
    assert info["tool_call_parser"] == "qwen25"
    assert info["reasoning_parser"] == "qwen3"


# --- tool_choice "required" / named: grammar-enforced calls -----------------------------------


def test_required_non_stream_gives_valid_calls(client):
    response = create(client, tools=TOOLS, tool_choice="required", max_tokens=MAX_TOKENS,
                      temperature=0.8, seed=3)  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = choice.message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function"
        check_arguments(tool_named(call.function.name), call.function.arguments)


def test_required_stream_gives_valid_calls(client):
    stream = create(client, tools=TOOLS, tool_choice="required", max_tokens=MAX_TOKENS,
                    temperature=0.8, seed=4, stream=True)  # fmt: skip
    calls, finish, content = streamed_calls(stream)
    assert finish == "tool_calls" and content == ""
    assert calls
    for call in calls:
        check_arguments(tool_named(call["name"]), call["arguments"])


def test_named_choice_calls_that_function(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    response = create(client, tools=TOOLS, tool_choice=choice, max_tokens=MAX_TOKENS,
                      temperature=0)  # fmt: skip
    calls = response.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    check_arguments(CLOCK, calls[0].function.arguments)


def test_bad_tool_choice_is_400_and_the_server_keeps_serving(client):
    choice = {"type": "function", "function": {"name": "no_such_tool"}}
    with pytest.raises(openai.BadRequestError) as info:
        create(client, tools=TOOLS, tool_choice=choice, max_tokens=4)
    assert info.value.body["param"] == "tool_choice"
    assert create(client, max_tokens=2).choices[0].finish_reason == "length"


# --- tool history through the template ----------------------------------------------------------


def test_tool_results_go_through_the_chat_template(client, tools_model_dir):
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]  # fmt: skip
    response = client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, max_tokens=1
    )
    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    as_template_sees_it = [*history[:1], {**history[1], "tool_calls": [{**history[1]["tool_calls"][0],
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        history[2]]  # fmt: skip
    text = tokenizer.apply_chat_template(
        as_template_sees_it, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert '"arguments": {"city": "Paris"' in text and "<tool_response>\n18 degrees" in text
    expected = len(tokenizer.encode(text, add_special_tokens=False))
    assert response.usage.prompt_tokens == expected


# --- reasoning ----------------------------------------------------------------------------------

THINK_REGEX = "<think>[a-z]{2,8}</think>[a-z]{2,8}"


def test_reasoning_content_split(client):
    response = create(client, max_tokens=64, temperature=0, extra_body={"regex": THINK_REGEX})
    message = response.choices[0].message
    assert re.fullmatch("[a-z]{2,8}", message.reasoning_content.strip())
    assert re.fullmatch("[a-z]{2,8}", message.content.strip())


def test_reasoning_content_streamed(client):
    whole = create(client, max_tokens=64, temperature=0, extra_body={"regex": THINK_REGEX})
    stream = create(client, max_tokens=64, temperature=0, stream=True,
                    extra_body={"regex": THINK_REGEX})  # fmt: skip
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert reasoning == whole.choices[0].message.reasoning_content
    assert content == whole.choices[0].message.content


def test_separate_reasoning_off_and_enable_thinking_false(client):
    whole = create(client, max_tokens=64, temperature=0,
                   extra_body={"regex": THINK_REGEX, "separate_reasoning": False})  # fmt: skip
    assert re.fullmatch(THINK_REGEX, whole.choices[0].message.content)
    assert getattr(whole.choices[0].message, "reasoning_content", None) is None
    plain = create(client, max_tokens=64, temperature=0,
                   extra_body={"regex": "[a-z]{2,8}",
                               "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert re.fullmatch("[a-z]{2,8}", plain.choices[0].message.content)
    assert getattr(plain.choices[0].message, "reasoning_content", None) is None


def test_qwen3_grammar_shaped_text_without_tags_is_content(client):
    """qwen3 reads untagged text as thinking by default (unless enable_thinking is false:
    test/unit/test_openai_tools.py), but a grammar shapes the output from its first
    token: untagged, it is the answer (a JSON response_format went to reasoning_content)."""
    message = create(client, max_tokens=64, temperature=0,
                     extra_body={"regex": "[a-z]{2,8}"}).choices[0].message  # fmt: skip
    assert re.fullmatch("[a-z]{2,8}", message.content)
    assert not getattr(message, "reasoning_content", None)


# --- two Engines in one process keep their own detection ----------------------------------------


def test_two_engines_keep_their_own_detection(tools_model_dir, tiny_llama_dir):
    import sglang as sgl
    from sglang.srt.server_args import resolution_result

    light = dict(num_threads=1, log_level="warning", max_total_tokens=2048,
                 max_running_requests=4)  # fmt: skip
    detected = sgl.Engine(model_path=str(tools_model_dir), **light)
    try:
        plain = sgl.Engine(model_path=str(tiny_llama_dir), **light)
        try:
            first, second = detected.get_server_info(), plain.get_server_info()
            assert (first["tool_call_parser"], first["reasoning_parser"]) == ("qwen25", "qwen3")
            assert (second["tool_call_parser"], second["reasoning_parser"]) == (None, None)
            assert detected.tokenizer_manager.config_value("reasoning_parser") == "qwen3"
            assert plain.tokenizer_manager.config_value("reasoning_parser") is None
            # the caller's config is not where detection lives
            assert resolution_result(detected.server_args, "tool_call_parser") is None
        finally:
            plain.shutdown()
    finally:
        detected.shutdown()
