"""Tool calling and reasoning content on /v1/chat/completions (fake TokenizerManager),
the constrained-call stream reader, chat-template rendering of tool history, and
parser detection at the launcher stage."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from openai_fake_tm import FakeTokenizer, FakeTokenizerManager

from sglang.srt.entrypoints.engine import _record_detected_parsers
from sglang.srt.entrypoints.http_server import ServerStatus, create_app
from sglang.srt.parser.chat_template import (
    detected_parsers,
    render_chat,
    resolve_auto_parsers,
)
from sglang.srt.parser.function_call import (
    ConstrainedCallStream,
    parse_constrained_calls,
    tool_call_schema,
)
from sglang.srt.runtime_context import get_context
from sglang.srt.server_args import ServerArgs, prepare_server_args, resolution_result

MODEL = "fake-model"
EOS = {"type": "stop", "matched": 2}  # the model wrote its EOS token

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}
TOOLS = [WEATHER, TIME]


# --- a fake runtime that writes a script ------------------------------------------------------


class RecordingTokenizer(FakeTokenizer):
    """Renders like the fake, and remembers what the template was given."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append({"messages": messages, "on_loop": _on_event_loop(), **kwargs})
        return super().apply_chat_template(messages, **kwargs)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@dataclass
class ScriptedTokenizerManager(FakeTokenizerManager):
    """The model writes `script` one character per step, then its EOS token; a stop
    string of the request ends it there (trimmed from the text)."""

    script: str = ""

    async def _decode(self, obj, input_ids, params):
        max_new = params.get("max_new_tokens", 128)
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        text, ids = "", []
        for char in self.script[:max_new]:
            await asyncio.sleep(self.step_delay_s)
            text += char
            ids.append(ord(char) % 256)
            hit = next((stop for stop in stops if stop in text), None)
            if hit is not None:
                cut = text[: text.index(hit)]
                yield self._output(obj, input_ids, cut, ids, {"type": "stop", "matched": hit})
                return
            if len(ids) < min(len(self.script), max_new):
                yield self._output(obj, input_ids, text, ids, None)
        reason = EOS if len(self.script) <= max_new else {"type": "length", "matched": None}
        yield self._output(obj, input_ids, text, ids, reason)


def make_tm(script: str = "", **config) -> ScriptedTokenizerManager:
    tm = ScriptedTokenizerManager(script=script, tokenizer=RecordingTokenizer())
    tm.config.update(config)
    return tm


@pytest.fixture
def serve():
    clients = []

    def build(tm: ScriptedTokenizerManager) -> TestClient:
        with get_context().override_server_args():
            app = create_app(tm)
        app.state.server.status = ServerStatus.READY
        client = TestClient(app)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def chat(client: TestClient, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    return client.post("/v1/chat/completions", json=body)


def stream_events(client: TestClient, **extra) -> list[dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json={**body, **extra}) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def deltas(events: list[dict]) -> list[dict]:
    return [e["choices"][0]["delta"] for e in events if e["choices"]]


def joined(events: list[dict], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas(events))


def streamed_calls(events: list[dict]) -> list[dict]:
    """Rebuild the calls from OpenAI tool_calls deltas (as the openai client does)."""
    calls: dict[int, dict] = {}
    for delta in deltas(events):
        for piece in delta.get("tool_calls") or []:
            index = piece["index"]
            if index not in calls:
                assert piece["id"].startswith("call_") and piece["type"] == "function"
                assert piece["function"]["name"], "a call's first delta names the function"
                calls[index] = {"id": piece["id"], "name": piece["function"]["name"],
                                "arguments": piece["function"].get("arguments") or ""}  # fmt: skip
            else:
                assert "name" not in piece["function"] and "id" not in piece
                calls[index]["arguments"] += piece["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


def finish_of(events: list[dict]) -> str:
    return [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]


def check_arguments(tool: dict, arguments: str) -> dict:
    """The arguments parse to an object that the tool's parameter schema accepts
    (the subset of JSON schema these tools use)."""
    schema = tool["function"]["parameters"]
    args = json.loads(arguments)
    assert isinstance(args, dict)
    assert set(schema.get("required", [])) <= set(args)
    if schema.get("additionalProperties") is False:
        assert set(args) <= set(schema["properties"])
    for key, value in args.items():
        spec = schema["properties"].get(key, {})
        if spec.get("type") == "string":
            assert isinstance(value, str)
        if "enum" in spec:
            assert value in spec["enum"]
    return args


def tool_named(name: str) -> dict:
    return next(t for t in TOOLS if t["function"]["name"] == name)


# --- auto: the tool-call parser reads what the model wrote ----------------------------------

QWEN_CALL = (
    'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)


def test_auto_non_stream_parses_the_call(serve):
    client = serve(make_tm(QWEN_CALL, tool_call_parser="qwen25"))
    choice = chat(client, tools=TOOLS).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    message = choice["message"]
    assert message["content"].strip() == "Let me check."
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert check_arguments(WEATHER, call["function"]["arguments"]) == {"city": "Paris"}


def test_auto_stream_sends_content_then_name_then_arguments(serve):
    client = serve(make_tm(QWEN_CALL, tool_call_parser="qwen25"))
    events = stream_events(client, tools=TOOLS)
    assert joined(events, "content").strip() == "Let me check."
    (call,) = streamed_calls(events)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert finish_of(events) == "tool_calls"
    assert "<tool_call>" not in joined(events, "content")


@pytest.mark.parametrize(
    "script, extra",
    [
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "a\\ud83d"}}</tool_call>',
         {"tool_call_parser": "qwen25"}),
        ('[get_weather(city="a\\ud83d")]', {"tool_call_parser": "pythonic"}),
        ('[{"name": "get_weather", "parameters": {"city": "a\\ud83d"}}]', {}),
    ],
)  # fmt: skip
def test_a_lone_surrogate_escape_in_arguments_stays_escaped(serve, script, extra):
    # "\ud83d" alone is valid JSON but no UTF-8 text: the arguments keep it escaped
    # (it was a 500, and a stream cut without [DONE])
    client = serve(make_tm(script, **extra))
    forced = {} if extra else {"tool_choice": "required"}
    response = chat(client, tools=TOOLS, **forced)
    assert response.status_code == 200, response.text
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "a\\ud83d"}'
    (streamed,) = streamed_calls(stream_events(client, tools=TOOLS, **forced))
    assert streamed["arguments"] == call["function"]["arguments"]


TWO_QWEN_CALLS = QWEN_CALL + (
    '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_one_call(serve, stream):
    client = serve(make_tm(TWO_QWEN_CALLS, tool_call_parser="qwen25"))
    if stream:
        names = [c["name"] for c in streamed_calls(stream_events(client, tools=TOOLS))]
        single = [c["name"] for c in streamed_calls(
            stream_events(client, tools=TOOLS, parallel_tool_calls=False))]  # fmt: skip
    else:
        names = [c["function"]["name"] for c in
                 chat(client, tools=TOOLS).json()["choices"][0]["message"]["tool_calls"]]
        single = [c["function"]["name"] for c in chat(client, tools=TOOLS,
                  parallel_tool_calls=False).json()["choices"][0]["message"]["tool_calls"]]  # fmt: skip
    assert names == ["get_weather", "get_time"] and single == ["get_weather"]


def test_parallel_tool_calls_false_caps_forced_calls_at_one(serve):
    tm = make_tm(REQUIRED_OUT)
    client = serve(tm)
    chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(tm.requests[-1].sampling_params["json_schema"])
    assert schema == {**tool_call_schema(TOOLS, "required"), "maxItems": 1}


def test_auto_without_a_call_is_plain_content(serve):
    client = serve(make_tm("Just text.", tool_call_parser="qwen25"))
    choice = chat(client, tools=TOOLS).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Just text."}
    assert choice["finish_reason"] == "stop"


def test_auto_without_a_parser_leaves_the_text_alone(serve):
    client = serve(make_tm(QWEN_CALL))
    message = chat(client, tools=TOOLS).json()["choices"][0]["message"]
    assert message["content"] == QWEN_CALL and "tool_calls" not in message


def test_tool_choice_none_neither_shows_tools_nor_parses(serve):
    tm = make_tm(QWEN_CALL, tool_call_parser="qwen25")
    client = serve(tm)
    message = chat(client, tools=TOOLS, tool_choice="none").json()["choices"][0]["message"]
    assert message["content"] == QWEN_CALL and "tool_calls" not in message
    assert tm.tokenizer.calls[-1].get("tools") is None


def test_tools_reach_the_template(serve):
    tm = make_tm("ok", tool_call_parser="qwen25")
    client = serve(tm)
    chat(client, tools=TOOLS)
    assert [t["function"]["name"] for t in tm.tokenizer.calls[-1]["tools"]] == [
        "get_weather",
        "get_time",
    ]


# --- required / named: the grammar's JSON array ---------------------------------------------

REQUIRED_OUT = (
    '[{"name": "get_time", "parameters": {"tz": "UTC"}}, '
    '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}]'
)


def test_required_puts_the_call_schema_into_the_sampling_params(serve):
    tm = make_tm(REQUIRED_OUT)
    client = serve(tm)
    assert chat(client, tools=TOOLS, tool_choice="required").status_code == 200
    params = tm.requests[-1].sampling_params
    assert json.loads(params["json_schema"]) == tool_call_schema(TOOLS, "required")


def test_strict_tools_under_auto_hold_calls_to_their_schemas(serve):
    # OpenAI's strict mode: a call the model starts follows its tool's schema; the
    # parser's call format is fixed around the arguments (SGLang and vLLM do the same)
    tm = make_tm("no call", tool_call_parser="qwen25")
    client = serve(tm)
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    assert chat(client, tools=[strict, TIME], tool_choice="auto").status_code == 200
    tag = json.loads(tm.requests[-1].sampling_params["structural_tag"])
    assert tag["triggers"] == ["<tool_call>"]
    assert [s["schema"] for s in tag["structures"]] == [WEATHER["function"]["parameters"],
                                                       {"type": "object"}]  # fmt: skip
    assert tag["structures"][0]["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    for request in ({"tools": TOOLS}, {"tools": [strict], "tool_choice": "none"},
                    {"tools": [strict], "response_format": {"type": "json_object"}}):  # fmt: skip
        assert chat(client, **request).status_code == 200
        assert "structural_tag" not in tm.requests[-1].sampling_params, request


def test_required_non_stream_returns_valid_calls(serve):
    client = serve(make_tm(REQUIRED_OUT))
    choice = chat(client, tools=TOOLS, tool_choice="required").json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert [c["index"] for c in calls] == [0, 1]
    assert len({c["id"] for c in calls}) == 2
    for call in calls:
        check_arguments(tool_named(call["function"]["name"]), call["function"]["arguments"])


def test_required_stream_returns_the_same_calls(serve):
    client = serve(make_tm(REQUIRED_OUT))
    events = stream_events(client, tools=TOOLS, tool_choice="required")
    calls = streamed_calls(events)
    assert [c["name"] for c in calls] == ["get_time", "get_weather"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"tz": "UTC"},
        {"city": "Oslo", "unit": "celsius"},
    ]
    for call in calls:
        check_arguments(tool_named(call["name"]), call["arguments"])
    assert joined(events, "content") == "" and finish_of(events) == "tool_calls"


def test_named_choice_schema_and_template_carry_that_function_only(serve):
    tm = make_tm('[{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    client = serve(tm)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = chat(client, tools=TOOLS, tool_choice=choice).json()
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    schema = json.loads(tm.requests[-1].sampling_params["json_schema"])
    assert schema == {**tool_call_schema(TOOLS, choice), "maxItems": 1}
    assert [t["function"]["name"] for t in tm.tokenizer.calls[-1]["tools"]] == ["get_weather"]


def test_required_cut_short_is_text_with_finish_length(serve):
    client = serve(make_tm(REQUIRED_OUT))
    choice = chat(client, tools=TOOLS, tool_choice="required", max_tokens=20).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == REQUIRED_OUT[:20]
    assert "tool_calls" not in choice["message"]


@pytest.mark.parametrize("cut", [REQUIRED_OUT.index("}}") + 2, REQUIRED_OUT.index("Oslo") + 2])
def test_required_cut_after_a_call_gives_the_streamed_calls(serve, cut):
    """Cut off (max_tokens) after a first call: the answer holds the calls as a stream
    sent them, the last one's arguments cut as OpenAI's are; stream and not agree."""
    client = serve(make_tm(REQUIRED_OUT))
    choice = chat(client, tools=TOOLS, tool_choice="required", max_tokens=cut).json()["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in choice["message"]["tool_calls"]]  # fmt: skip
    assert choice["finish_reason"] == "length" and not choice["message"]["content"]
    assert calls[0] == ("get_time", '{"tz": "UTC"}')
    events = stream_events(client, tools=TOOLS, tool_choice="required", max_tokens=cut)
    assert [(c["name"], c["arguments"]) for c in streamed_calls(events)] == calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_inside_a_forced_call_is_a_stop_not_finished_calls(serve, stream):
    """A stop string of the request cut the forced call's arguments (`{"city": "`): it
    was reported `"tool_calls"`, a finished call, with matched_stop dropped."""
    client = serve(make_tm(REQUIRED_OUT))
    request = {"tools": TOOLS, "tool_choice": "required", "stop": ["Oslo"]}
    if stream:
        events = stream_events(client, **request)
        final = [e["choices"][0] for e in events if e["choices"]][-1]
        assert final["finish_reason"] == "stop" and final["matched_stop"] == "Oslo"
        return
    choice = chat(client, **request).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == "Oslo"
    calls = choice["message"]["tool_calls"]
    assert calls[0]["function"]["arguments"] == '{"tz": "UTC"}'  # the finished call kept
    # a stop string the forced output never meets: the calls finish as before
    choice = chat(client, **{**request, "stop": ["@@"]}).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None


def test_required_stream_cut_before_a_call_is_text(serve):
    """Cut off before a first call could be sent: the stream gives the text as content,
    as the non-stream answer does (nothing is lost)."""
    client = serve(make_tm(REQUIRED_OUT))
    events = stream_events(client, tools=TOOLS, tool_choice="required", max_tokens=8)
    assert joined(events, "content") == REQUIRED_OUT[:8]
    assert streamed_calls(events) == [] and finish_of(events) == "length"


# --- bad tools / tool_choice: 400 naming the field, and the server keeps serving --------------


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools.0.function.name"),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tools_are_400_naming_the_field(serve, extra, param):
    client = serve(make_tm("fine", tool_call_parser="qwen25"))
    response = chat(client, **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert chat(client).json()["choices"][0]["message"]["content"] == "fine"


def _with_parameters(parameters: dict) -> list[dict]:
    return [WEATHER, {"type": "function", "function": {"name": "f", "parameters": parameters}}]


NOT_OBJECT = [
    {"type": "array"},
    {"type": "string"},
    {"type": "null"},
    {"type": "integer", "minimum": 0},
    {"type": ["object", "null"]},
    {"anyOf": [{"type": "object"}, {"type": "string"}]},
    {"$defs": {"L": {"type": "array"}}, "$ref": "#/$defs/L"},
    {"const": 3},
]
OBJECT_LIKE = [
    {},
    {"properties": {"a": {"type": "integer"}}},  # no "type": held to an object
    {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"properties": {"b": {}}}]},
    {"$defs": {"L": {"type": "object"}}, "$ref": "#/$defs/L"},
    {"type": ["object"]},
]


@pytest.mark.parametrize("parameters", NOT_OBJECT)
@pytest.mark.parametrize("tool_choice", [None, "none", "required", {"type": "function", "function": {"name": "f"}}])  # fmt: skip
def test_parameters_that_are_no_object_schema_are_400(serve, parameters, tool_choice):
    # as OpenAI: every request, whatever the choice (forced, the grammar made the model
    # write a call whose arguments are no object: no tool_calls, the JSON as content)
    client = serve(make_tm("fine", tool_call_parser="qwen25"))
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    response = chat(client, tools=_with_parameters(parameters), **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools.1.function.parameters"
    assert "'f'" in error["message"] and 'type "object"' in error["message"]


@pytest.mark.parametrize("parameters", OBJECT_LIKE)
def test_object_parameter_schemas_are_accepted_and_forced_calls_write_an_object(serve, parameters):
    tm = make_tm('[{"name": "f", "parameters": {"a": 1}}]')
    client = serve(tm)
    body = chat(client, tools=_with_parameters(parameters), tool_choice="required").json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    schema = json.loads(tm.requests[-1].sampling_params["json_schema"])
    assert schema["items"]["anyOf"][1]["properties"]["parameters"]["type"] in ("object", ["object"])
    no_parameters = [{"type": "function", "function": {"name": "f"}}]
    assert chat(client, tools=no_parameters).status_code == 200


@pytest.mark.parametrize("arguments", ['{"a": 1, "a": 2}', '{"x": 1e400}', '{"x": [-1E+999]}'])
def test_forced_calls_read_the_same_streamed_or_not(serve, arguments):
    """Valid JSON that json.loads reads otherwise (a repeated key keeps the last value,
    1e400 is inf): both answers give the arguments as the model wrote them."""
    client = serve(make_tm('[{"name": "f", "parameters": ' + arguments + "}]"))
    tools = _with_parameters({"type": "object"})
    choice = chat(client, tools=tools, tool_choice="required").json()["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in choice["message"]["tool_calls"]]  # fmt: skip
    assert calls == [("f", arguments)] and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    events = stream_events(client, tools=tools, tool_choice="required")
    assert [(c["name"], c["arguments"]) for c in streamed_calls(events)] == calls
    assert joined(events, "content") == "" and finish_of(events) == "tool_calls"


# --- reasoning ---------------------------------------------------------------------------------


def test_reasoning_split_non_stream_and_stream(serve):
    client = serve(make_tm("<think>Two and two.</think>Four.", reasoning_parser="qwen3"))
    message = chat(client).json()["choices"][0]["message"]
    assert message["reasoning_content"].strip() == "Two and two."
    assert message["content"].strip() == "Four."
    events = stream_events(client)
    assert joined(events, "reasoning_content").strip() == "Two and two."
    assert joined(events, "content").strip() == "Four."
    assert all("<think>" not in (d.get("content") or "") for d in deltas(events))


def test_reasoning_streams_before_the_end_tag(serve):
    tm = make_tm("<think>" + "a" * 40 + "</think>done", reasoning_parser="qwen3")
    tm.step_delay_s = 0.002  # a step at a time: a reader that keeps up gets each output
    client = serve(tm)
    events = stream_events(client)
    pieces = [d["reasoning_content"] for d in deltas(events) if d.get("reasoning_content")]
    assert len(pieces) > 1  # sent as it came, not in one piece at the end
    one_piece = stream_events(client, stream_reasoning=False)
    pieces = [d["reasoning_content"] for d in deltas(one_piece) if d.get("reasoning_content")]
    assert len(pieces) == 1 and pieces[0].strip() == "a" * 40


@pytest.mark.parametrize("parser", ["qwen3", "deepseek-r1"])
@pytest.mark.parametrize(
    "extra",
    [{"response_format": {"type": "json_object"}}, {"regex": "[{].*"},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}],
)  # fmt: skip
def test_a_grammar_starts_after_the_reasoning(serve, parser, extra):
    # as SGLang: the model thinks free, and the grammar shapes what follows its think
    # block (the scheduler's gate opens at "</think>"); thinking off, it shapes the
    # output from the first token, and the JSON is the answer
    opened = "" if parser == "deepseek-r1" else "<think>"  # r1's prompt opened it
    tm = make_tm(opened + 'plan</think>{"a": 1}', reasoning_parser=parser)
    client = serve(tm)
    message = chat(client, **extra).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("plan", '{"a": 1}')
    assert tm.requests[-1].require_reasoning is True
    events = stream_events(client, **extra)
    assert joined(events, "reasoning_content") == "plan"
    assert joined(events, "content") == '{"a": 1}'
    if parser == "qwen3":
        tm.script = '{"a": 1}'
        off = {**extra, "chat_template_kwargs": {"enable_thinking": False}}
        message = chat(client, **off).json()["choices"][0]["message"]
        assert message["content"] == '{"a": 1}' and not message.get("reasoning_content")
        assert tm.requests[-1].require_reasoning is False
        # not splitting the think block out does not stop the model thinking (as SGLang)
        tm.script = opened + 'plan</think>{"a": 1}'
        whole = chat(client, **extra, separate_reasoning=False).json()["choices"][0]["message"]
        assert whole["content"] == opened + 'plan</think>{"a": 1}'
        assert tm.requests[-1].require_reasoning is True


def test_a_grammar_is_shaped_from_the_first_token_when_the_end_tag_is_no_token(serve):
    tm = make_tm('{"a": 1}', reasoning_parser="qwen3")
    tm.reasoning_end_token_id = lambda parser: None
    message = chat(serve(tm), response_format={"type": "json_object"}).json()
    assert message["choices"][0]["message"]["content"] == '{"a": 1}'
    assert tm.requests[-1].require_reasoning is False


@pytest.mark.parametrize("value, thinks", [(None, True), (1, True), (False, False), (0, False)])
def test_the_thinking_switch_reads_as_the_template_does(serve, value, thinks):
    # a null is the default (thinking on); any other value its truth (it read `is True`)
    tm = make_tm("plan</think>ok", reasoning_parser="qwen3")  # on: reasoning up to </think>
    body = {"chat_template_kwargs": {"enable_thinking": value}}
    message = chat(serve(tm), **body).json()["choices"][0]["message"]
    assert (message.get("reasoning_content") == "plan") is thinks


@pytest.mark.parametrize(
    "prefill, script, reasoning, content",
    [("<think>x</think> The", " answer.", None, " answer."),  # closed: content follows
     ("<think>Let me", " see.</think>Done.", "see.", "Done."),  # open: reasoning goes on
     ("Sure", " thing.", None, " thing.")],  # answer text, no tag: the answer goes on
)  # fmt: skip
def test_a_continued_assistant_message_sets_where_reasoning_stands(
    serve, prefill, script, reasoning, content
):
    client = serve(make_tm(script, reasoning_parser="qwen3"))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": prefill}]
    body = {"messages": messages, "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": True}}  # fmt: skip
    message = chat(client, **body).json()["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == (reasoning, content)
    events = stream_events(client, **body)
    assert joined(events, "reasoning_content") == (reasoning or "")
    assert joined(events, "content") == content


# Qwen3's template renders a last assistant turn with its think block written and closed
CLOSES_THINK = ("{% for m in messages %}{% if m.role == 'assistant' %}<think>\n\n</think>\n\n"
                "{{ m.content }}{% else %}{{ m.content }}\n{% endif %}{% endfor %}")  # fmt: skip


@pytest.mark.parametrize("prefill", ["", "  "])
def test_an_empty_prefill_continues_where_the_template_left_the_turn(serve, prefill):
    tm = make_tm("Hello.", reasoning_parser="qwen3")
    tm.tokenizer.chat_template = CLOSES_THINK
    client = serve(tm)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": prefill}]
    body = {"messages": messages, "continue_final_message": True}
    message = chat(client, **body).json()["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == (None, "Hello.")
    events = stream_events(client, **body)
    assert (joined(events, "reasoning_content"), joined(events, "content")) == ("", "Hello.")


@pytest.mark.parametrize(
    "prefill, script, reasoning, content",
    [("Sure,", " thing.", None, " thing."),
     ("<think>Let me", " see.</think>Done.", "see.", "Done.")],
)  # fmt: skip
def test_a_prefill_sent_as_text_parts_sets_reasoning_as_its_text_does(
    serve, prefill, script, reasoning, content
):
    # the parts render as the same prompt as the string, so the output splits the same
    client = serve(make_tm(script, reasoning_parser="qwen3"))
    parts = [{"type": "text", "text": prefill}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": parts}]
    body = {"messages": messages, "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": True}}  # fmt: skip
    message = chat(client, **body).json()["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == (reasoning, content)


def test_long_messages_render_off_the_event_loop(serve):
    # rendering and tokenizing ~380K characters took the loop for seconds: every other
    # request's stream stalled; past 16,384 characters it runs in a worker thread
    tm = make_tm("ok")
    tm.context_len = 20_000
    client = serve(tm)
    chat(client)
    chat(client, messages=[{"role": "user", "content": "x" * 17_000}], max_tokens=1)
    assert [call["on_loop"] for call in tm.tokenizer.calls] == [True, False]


def test_separate_reasoning_false_keeps_the_text_whole(serve):
    script = "<think>hm</think>ok"
    client = serve(make_tm(script, reasoning_parser="qwen3"))
    message = chat(client, separate_reasoning=False).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": script}


def test_qwen3_thinks_by_default_unless_enable_thinking_is_false(serve):
    client = serve(make_tm("no tags here", reasoning_parser="qwen3"))
    message = chat(client).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "no tags here" and not message["content"]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, **off).json()["choices"][0]["message"]
    assert message["content"] == "no tags here" and "reasoning_content" not in message


def test_chat_template_kwargs_reach_the_template(serve):
    tm = make_tm("x", reasoning_parser="qwen3")
    client = serve(tm)
    chat(client, chat_template_kwargs={"enable_thinking": False})
    assert tm.tokenizer.calls[-1]["enable_thinking"] is False


def test_add_generation_prompt_reaches_the_template(serve):
    # vLLM's field: the default opens the assistant's turn unless continuing one
    tm = make_tm("x")
    client = serve(tm)
    chat(client)
    assert tm.tokenizer.calls[-1]["add_generation_prompt"] is True
    chat(client, add_generation_prompt=False)
    assert tm.tokenizer.calls[-1]["add_generation_prompt"] is False
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    chat(client, messages=messages, continue_final_message=True)
    assert tm.tokenizer.calls[-1]["add_generation_prompt"] is False
    both = chat(client, messages=messages, continue_final_message=True, add_generation_prompt=True)
    assert both.status_code == 400 and "cannot both be true" in both.json()["error"]["message"]


def test_reasoning_then_tool_call(serve):
    script = "<think>Need the weather.</think>" + QWEN_CALL
    client = serve(make_tm(script, reasoning_parser="qwen3", tool_call_parser="qwen25"))
    message = chat(client, tools=TOOLS).json()["choices"][0]["message"]
    assert message["reasoning_content"].strip() == "Need the weather."
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    events = stream_events(client, tools=TOOLS)
    assert joined(events, "reasoning_content").strip() == "Need the weather."
    assert [c["name"] for c in streamed_calls(events)] == ["get_weather"]
    assert finish_of(events) == "tool_calls"


def test_each_server_reads_its_own_tokenizer_managers_parsers(serve):
    """Two engines in one process: the route follows its TokenizerManager, not the
    process-wide config bags."""
    with_parser = serve(make_tm("<think>a</think>b", reasoning_parser="qwen3"))
    without = serve(make_tm("<think>a</think>b"))
    assert chat(with_parser).json()["choices"][0]["message"]["content"] == "b"
    assert chat(without).json()["choices"][0]["message"]["content"] == "<think>a</think>b"


# --- the constrained-call stream reader ---------------------------------------------------------


def feed_all(text: str, step: int, tools=None) -> list:
    reader = ConstrainedCallStream(tools or [fn("f"), fn("g")])
    items = []
    for start in range(0, len(text), step):
        items += reader.feed(text[start : start + step])
    return items


def fn(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def calls_of(items: list) -> list[tuple[str, str]]:
    calls: dict[int, list] = {}
    for item in items:
        if item.name is not None:
            assert item.tool_index not in calls and item.parameters == ""
            calls[item.tool_index] = [item.name, ""]
        else:
            calls[item.tool_index][1] += item.parameters
    return [tuple(calls[i]) for i in sorted(calls)]


ARRAY = (
    '[ {"name": "f", "parameters": {"a": "}{\\" ",  "b": [1, {"c": 2}]}} ,\n'
    '{"name":"g","parameters":{}}]'
)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_constrained_reader_matches_the_whole_text_parse(step):
    calls = calls_of(feed_all(ARRAY, step))
    whole = parse_constrained_calls(ARRAY, [fn("f"), fn("g")])
    assert calls == [(item.name, item.parameters) for item in whole]
    assert [json.loads(args) for _, args in calls] == [{"a": '}{" ', "b": [1, {"c": 2}]}, {}]


def test_constrained_reader_streams_arguments_before_the_call_closes():
    reader = ConstrainedCallStream([fn("f")])
    first = calls_of(reader.feed('[{"name": "f", "parameters": {"a": "x'))
    assert first[0][0] == "f" and first[0][1].startswith('{"a": "x')
    rest = reader.feed('y"}}]')
    assert first[0][1] + "".join(i.parameters for i in rest) == '{"a": "xy"}'


def test_constrained_reader_parameters_before_name():
    calls = calls_of(feed_all('[{"parameters": {"k": 1}, "name": "f"}]', 2))
    assert calls == [("f", '{"k": 1}')]


# --- the chat template: tool history ------------------------------------------------------------

HISTORY_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}{% endif %}"
    "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{{ m.content }}\n{% endfor %}"
    "{% if tools %}tools: {{ tools | map(attribute='function.name') | join(',') }}{% endif %}"
)


def test_tool_history_goes_through_the_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]  # fmt: skip
    text = render_chat(tokenizer, messages, HISTORY_TEMPLATE, tools=[WEATHER])
    assert '[assistant]call get_weather {"city": "Paris"}' in text  # an object, not a string
    assert "[tool](call_1)18C" in text
    assert text.endswith("tools: get_weather")


@pytest.mark.parametrize("arguments", ['{"city": "Oslo"}', {"city": "Oslo"}])
def test_tool_history_through_the_route(serve, arguments):
    """Earlier calls' arguments reach the template as an object, whether the client sent
    the JSON text (OpenAI) or the object (as HF's apply_chat_template takes it)."""
    tm = make_tm("ok")
    client = serve(tm)
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function",
         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "-3C"},
    ]  # fmt: skip
    body = {"model": MODEL, "messages": history, "tools": TOOLS}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    rendered = tm.tokenizer.calls[-1]["messages"]
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert rendered[2]["tool_call_id"] == "call_9"


def test_arguments_escaping_a_lone_surrogate_stay_text():
    """This server's own calls keep a lone surrogate escaped (`\\ud83d`); sent back as
    history, the arguments stay that text (as an object the template would write the
    raw half, which no tokenizer encodes: a 500 before)."""
    from sglang.srt.parser.chat_template import normalize_messages

    arguments = '{"emoji": "\\ud83d"}'
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    [message] = normalize_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert message["tool_calls"][0]["function"]["arguments"] == arguments
    call["function"]["arguments"] = '{"emoji": "\\ud83d\\ude00"}'  # a whole pair: an object
    [message] = normalize_messages([{"role": "assistant", "tool_calls": [call]}])
    assert message["tool_calls"][0]["function"]["arguments"] == {"emoji": "\U0001f600"}


# --- detection at the launcher stage ------------------------------------------------------------

QWEN3_LIKE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools> answer in <tool_call></tool_call>{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"


def model_dir(tmp_path, template: str, name: str):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (directory / "config.json").write_text(json.dumps(config))  # a checkpoint dir
    return directory


def test_resolve_auto_parsers_detects_from_the_template(tmp_path):
    sa = ServerArgs(model_path=str(model_dir(tmp_path, QWEN3_LIKE, "m")), device="cpu")
    sa.resolve_once()
    launch = resolve_auto_parsers(sa)
    assert launch is not sa
    assert resolution_result(launch, "tool_call_parser") == "qwen25"
    assert resolution_result(launch, "reasoning_parser") == "qwen3"
    assert detected_parsers(launch) == {"tool_call_parser": "qwen25", "reasoning_parser": "qwen3"}
    # the caller's config is untouched
    assert resolution_result(sa, "tool_call_parser") is None and detected_parsers(sa) == {}


def test_a_flag_wins_over_detection(tmp_path):
    path = str(model_dir(tmp_path, QWEN3_LIKE, "m"))
    sa = ServerArgs(model_path=path, device="cpu", reasoning_parser="deepseek-r1").resolve_once()
    launch = resolve_auto_parsers(sa)
    assert resolution_result(launch, "reasoning_parser") == "deepseek-r1"
    assert detected_parsers(launch) == {"tool_call_parser": "qwen25"}


def test_chat_template_override_is_what_detection_reads(tmp_path):
    override = tmp_path / "t.jinja"
    override.write_text(QWEN3_LIKE)
    path = str(model_dir(tmp_path, PLAIN, "m"))
    sa = ServerArgs(model_path=path, device="cpu", chat_template=str(override)).resolve_once()
    assert detected_parsers(resolve_auto_parsers(sa))["reasoning_parser"] == "qwen3"


def test_nothing_detected_launches_the_same_config(tmp_path):
    sa = ServerArgs(model_path=str(model_dir(tmp_path, PLAIN, "m")), device="cpu").resolve_once()
    assert resolve_auto_parsers(sa) is sa


def test_chat_template_jinja_file_wins_like_transformers(tmp_path):
    directory = model_dir(tmp_path, PLAIN, "m")
    (directory / "chat_template.jinja").write_text(QWEN3_LIKE)
    sa = ServerArgs(model_path=str(directory), device="cpu").resolve_once()
    assert detected_parsers(resolve_auto_parsers(sa))["tool_call_parser"] == "qwen25"


def test_named_templates_detect_tools_from_tool_use(tmp_path):
    # Hermes-2-Pro ships {default, tool_use}: a request with tools renders with tool_use,
    # so that is where the tool-call format is found; reasoning from the default
    named = [{"name": "default", "template": PLAIN + "<think>"},
             {"name": "tool_use", "template": QWEN3_LIKE}]  # fmt: skip
    sa = ServerArgs(model_path=str(model_dir(tmp_path, named, "m")), device="cpu").resolve_once()
    assert detected_parsers(resolve_auto_parsers(sa)) == {
        "tool_call_parser": "qwen25", "reasoning_parser": "qwen3"}  # fmt: skip


def test_detection_is_recorded_per_tokenizer_manager(tmp_path):
    first = ServerArgs(model_path=str(model_dir(tmp_path, QWEN3_LIKE, "a")), device="cpu")
    second = ServerArgs(model_path=str(model_dir(tmp_path, PLAIN, "b")), device="cpu")
    tm_a, tm_b = make_tm(tool_call_parser=None), make_tm(tool_call_parser=None)
    _record_detected_parsers(tm_a, resolve_auto_parsers(first.resolve_once()))
    _record_detected_parsers(tm_b, resolve_auto_parsers(second.resolve_once()))
    assert tm_a.config_value("tool_call_parser") == "qwen25"
    assert tm_a.resolved_config_dict()["reasoning_parser"] == "qwen3"
    assert tm_b.config_value("tool_call_parser") is None


# --- the flags -----------------------------------------------------------------------------------


def test_unknown_parser_names_are_refused_at_startup():
    with pytest.raises(ValueError, match=r"tool_call_parser='bogus' is not accepted; choose one"):
        ServerArgs(model_path="org/m", device="cpu", tool_call_parser="bogus").resolve_once()
    with pytest.raises(ValueError, match=r"reasoning_parser='bogus' is not accepted"):
        ServerArgs(model_path="org/m", device="cpu", reasoning_parser="bogus").resolve_once()


def test_cli_refuses_unknown_parser_names(capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--model-path", "org/m", "--tool-call-parser", "bogus"])
    assert exc.value.code == 2
    assert "--tool-call-parser: invalid choice: 'bogus'" in capsys.readouterr().err


def test_cli_accepts_sglang_parser_names():
    sa = prepare_server_args(["--model-path", "org/m", "--tool-call-parser", "qwen25",
                              "--reasoning-parser", "deepseek-r1"])  # fmt: skip
    assert sa.tool_call_parser == "qwen25" and sa.reasoning_parser == "deepseek-r1"


def _nested(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(
    "extra, param",
    [({"response_format": {"type": "json_schema",
                           "json_schema": {"name": "a", "schema": _nested(140)}}}, "response_format"),
     ({"response_format": {"type": "structural_tag", "triggers": ["<a"],
                           "structures": [{"begin": "<a>", "schema": _nested(140), "end": "</a>"}]}},
      "response_format"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(140)}}],
       "tool_choice": "required"}, "tools")],
)  # fmt: skip
def test_a_too_deep_schema_names_the_field_the_request_sent(serve, extra, param):
    # the 400 named json_schema / structural_tag, fields an OpenAI request never sends
    error = chat(serve(make_tm("ok")), **extra).json()["error"]
    assert error["param"] == param
    assert error["message"] == f"{param} nests more than 128 levels deep"


def test_a_choice_with_only_reasoning_has_a_null_content(serve):
    # cut inside the think block: no answer text, a null content as SGLang sends
    tm = make_tm("<think>still thinking", reasoning_parser="qwen3")
    message = chat(serve(tm)).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "still thinking" and message["content"] is None


def test_a_structural_tag_starts_after_the_reasoning_too(serve):
    # as every grammar (SGLang gates them all): a strict tool's trigger written while
    # the model thinks does not constrain the thinking
    tm = make_tm("<think>plan</think>ok", tool_call_parser="qwen25", reasoning_parser="qwen3")
    client = serve(tm)
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    assert chat(client, tools=[strict], tool_choice="auto").status_code == 200
    assert tm.requests[-1].require_reasoning is True
    tag = {"type": "structural_tag", "triggers": ["<a"],
           "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}]}  # fmt: skip
    assert chat(client, response_format=tag).status_code == 200
    assert tm.requests[-1].require_reasoning is True
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert chat(client, tools=[strict], tool_choice="auto", **off).status_code == 200
    assert tm.requests[-1].require_reasoning is False


@pytest.mark.parametrize(
    "extra, skips",
    [({"tools": TOOLS}, False),  # the parser reads the call markers, special or not
     ({"tools": TOOLS, "tool_choice": "none"}, True),
     ({"tools": TOOLS, "skip_special_tokens": True}, True),  # the request's own choice
     ({}, True)],
)  # fmt: skip
def test_a_chat_with_tools_keeps_special_tokens_for_the_parser(serve, extra, skips):
    """Mistral's [TOOL_CALLS] is a special token: decoded with skip_special_tokens, the
    marker was gone before the parser looked and the call came back as content."""
    tm = make_tm("ok", tool_call_parser="mistral")
    chat(serve(tm), **extra)
    assert tm.requests[0].sampling_params["skip_special_tokens"] is skips


def test_reasoning_effort_reaches_the_template_as_a_variable(serve):
    # OpenAI's reasoning_effort was ignored; templates with an effort setting read it
    tm = make_tm("ok")
    client = serve(tm)
    assert chat(client, reasoning_effort="low").status_code == 200
    assert tm.tokenizer.calls[-1]["reasoning_effort"] == "low"
    kwargs = {"reasoning_effort": "high"}  # the explicit template kwarg wins
    assert chat(client, reasoning_effort="low", chat_template_kwargs=kwargs).status_code == 200
    assert tm.tokenizer.calls[-1]["reasoning_effort"] == "high"
    assert chat(client).status_code == 200
    assert "reasoning_effort" not in tm.tokenizer.calls[-1]
    assert chat(client, reasoning_effort="extreme").status_code == 400
