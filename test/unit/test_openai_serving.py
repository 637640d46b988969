"""The HTTP serving layer over a fake TokenizerManager: shapes, SSE, usage, errors."""

from __future__ import annotations

import asyncio
import json
import warnings

import openai
import pytest
from fastapi.testclient import TestClient
from openai_fake_tm import OUTPUT_ALPHABET, FakeTokenizer, FakeTokenizerManager

from sglang.srt.entrypoints.http_server import ServerStatus, create_app
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import check_request_fields
from sglang.srt.runtime_context import get_context
from sglang.test.prometheus import metric_value

MODEL = "fake-model"


def make_client(tm: FakeTokenizerManager, **fields) -> TestClient:
    with get_context().override_server_args(**fields):
        app = create_app(tm)
    app.state.server.status = ServerStatus.READY
    return TestClient(app)


@pytest.fixture
def tm() -> FakeTokenizerManager:
    return FakeTokenizerManager()


@pytest.fixture
def client(tm) -> TestClient:
    with make_client(tm, enable_metrics=True) as test_client:
        yield test_client


def chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def sse_events(response) -> list:
    lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def assert_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param
    return error


# --- chat ------------------------------------------------------------------------------------


def test_chat_non_stream_shape_and_usage(client, tm):
    body = client.post("/v1/chat/completions", json=chat_body(max_tokens=5, temperature=0)).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"]) == 5
    assert choice["finish_reason"] == "length"
    prompt_len = len(tm.requests[0].input_ids)
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 5,
        "total_tokens": prompt_len + 5,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_chat_template_applied_without_special_tokens_twice(client, tm):
    client.post("/v1/chat/completions", json=chat_body(max_tokens=1))
    text = tm.tokenizer.decode(tm.requests[0].input_ids)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_stream_matches_non_stream(client):
    body = chat_body(max_tokens=6, temperature=0)
    full = client.post("/v1/chat/completions", json=body).json()
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True,
                       "stream_options": {"include_usage": True}}) as response:  # fmt: skip
        events = sse_events(response)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == full["choices"][0]["message"]["content"]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == full["usage"]


def test_chat_n3_seeded_reproducible_and_distinct(client):
    body = chat_body(max_tokens=4, n=3, seed=7, temperature=1.0)
    first = client.post("/v1/chat/completions", json=body).json()
    second = client.post("/v1/chat/completions", json=body).json()
    texts = [c["message"]["content"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert texts == [c["message"]["content"] for c in second["choices"]]
    assert len(set(texts)) == 3
    assert first["usage"]["completion_tokens"] == 12


def test_n_samples_of_the_top_seed_wrap_into_the_range(client):
    # sample j samples with seed + j; past the top of the seed range it wraps to the bottom
    body = chat_body(max_tokens=4, n=2, seed=(1 << 64) - 1, temperature=1.0)
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"]) == 2


@pytest.mark.parametrize("field, value, says", [
    ("stop", ["x"] * 65, "at most 64 items"),  # not the str member's "a valid string"
    ("prompt", [5, -1], "greater than or equal to 0"),
    ("prompt", [5, 10**6], "prompt token ids must be in [0, "),
])  # fmt: skip
def test_a_field_error_names_what_is_wrong(client, field, value, says):
    body = {"model": "default", "prompt": "hi", "max_tokens": 2, field: value}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 400
    assert says in reply.json()["error"]["message"], reply.json()
    assert reply.json()["error"]["param"].split(".")[0] == field
    assert reply.json()["error"]["code"] == "invalid_value"


def test_chat_stop_string(client):
    start = client.post("/v1/chat/completions", json=chat_body(max_tokens=40, temperature=0))
    text = start.json()["choices"][0]["message"]["content"]
    stop = text[3:5]
    body = client.post("/v1/chat/completions", json=chat_body(max_tokens=40, temperature=0,
                       stop=[stop])).json()  # fmt: skip
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert choice["message"]["content"] == text[: text.index(stop)]


def test_chat_logprobs(client, tm):
    body = client.post("/v1/chat/completions", json=chat_body(max_tokens=3, logprobs=True,
                       top_logprobs=2)).json()  # fmt: skip
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    assert "".join(item["token"] for item in content) == body["choices"][0]["message"]["content"]
    assert all(len(item["top_logprobs"]) == 2 for item in content)
    assert tm.requests[0].top_logprobs_num == 2


def test_chat_default_max_tokens_fills_context(client, tm):
    client.post("/v1/chat/completions", json=chat_body(ignore_eos=True, max_completion_tokens=3))
    assert tm.requests[0].sampling_params["max_new_tokens"] == 3
    client.post("/v1/chat/completions", json=chat_body())
    prompt_len = len(tm.requests[1].input_ids)
    assert tm.requests[1].sampling_params["max_new_tokens"] == tm.context_len - prompt_len


def test_chat_extras_reach_sampling_params(client, tm):
    client.post("/v1/chat/completions", json=chat_body(max_tokens=2, top_k=5, min_p=0.1,
                repetition_penalty=1.1, min_tokens=1, ignore_eos=True,
                logit_bias={"65": 2.0}, presence_penalty=0.5))  # fmt: skip
    params = tm.requests[0].sampling_params
    assert params["top_k"] == 5 and params["min_p"] == 0.1 and params["ignore_eos"] is True
    assert params["min_new_tokens"] == 1 and params["logit_bias"] == {"65": 2.0}


# --- completions -----------------------------------------------------------------------------


def test_completions_prompt_list_with_n(client):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": ["ab", "abcd"], "n": 2,
                       "max_tokens": 3, "seed": 1}).json()  # fmt: skip
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == 2 + 4
    assert body["usage"]["completion_tokens"] == 12


def test_completions_token_id_prompts(client, tm):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": [[104, 105], [106]],
                       "max_tokens": 2, "temperature": 0}).json()  # fmt: skip
    assert len(body["choices"]) == 2
    assert tm.requests[0].input_ids == [104, 105] and tm.requests[1].input_ids == [106]


def test_completions_echo_logprobs_max_tokens_zero(client):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "echo": True,
                       "logprobs": 1, "max_tokens": 0}).json()  # fmt: skip
    choice = body["choices"][0]
    assert choice["text"] == "abc"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["a", "b", "c"]
    assert logprobs["token_logprobs"] == [None, -2.0, -2.0]
    assert logprobs["top_logprobs"][0] is None and len(logprobs["top_logprobs"][1]) == 1
    assert logprobs["text_offset"] == [0, 1, 2]


def test_completions_echo_logprobs_with_output(client):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "echo": True,
                       "logprobs": 0, "max_tokens": 2}).json()  # fmt: skip
    choice = body["choices"][0]
    assert choice["text"].startswith("abc") and len(choice["text"]) == 5
    assert len(choice["logprobs"]["tokens"]) == 5
    assert choice["logprobs"]["text_offset"] == [0, 1, 2, 3, 4]


class BosTokenizer(FakeTokenizer):
    """Puts a BOS (id 1) before a text's tokens, as Llama 3's tokenizer does."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * add_special_tokens + super().encode(text)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_offsets_of_a_text_prompt_leave_out_the_bos_it_was_given(stream):
    """A text prompt is echoed as sent, without the BOS the tokenizer added: the BOS
    takes no room (offsets ran its text's length ahead, then went back for the output)."""
    tm = FakeTokenizerManager(tokenizer=BosTokenizer())
    body = {"model": MODEL, "prompt": "abc", "echo": True, "logprobs": 0, "max_tokens": 2,
            "temperature": 0, "stream": stream}  # fmt: skip
    with make_client(tm) as bos_client:
        response = bos_client.post("/v1/completions", json=body)
        if stream:
            events = sse_events(response)
            offsets = [o for e in events if e["choices"][0]["logprobs"]
                       for o in e["choices"][0]["logprobs"]["text_offset"]]  # fmt: skip
        else:
            offsets = response.json()["choices"][0]["logprobs"]["text_offset"]
        ids = bos_client.post("/v1/completions", json={**body, "prompt": [1, 97, 98, 99]})
    assert offsets == [0, 0, 1, 2, 3, 4]  # BOS, a, b, c, then the two output tokens
    if not stream:  # token ids are echoed decoded, the BOS's text included
        assert ids.json()["choices"][0]["logprobs"]["text_offset"] == [0, 1, 2, 3, 4, 5]


def test_completions_stream_with_echo(client):
    body = {"model": MODEL, "prompt": "xy", "echo": True, "max_tokens": 4, "stream": True,
            "temperature": 0}  # fmt: skip
    with client.stream("POST", "/v1/completions", json=body) as response:
        events = sse_events(response)
    full = client.post("/v1/completions", json={**body, "stream": False}).json()
    assert "".join(e["choices"][0]["text"] for e in events) == full["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("echo", [False, True])
def test_completions_stream_logprobs_match_non_stream(client, echo):
    """text_offset counts from the start of the choice's text in every chunk."""
    body = {"model": MODEL, "prompt": "xy", "echo": echo, "logprobs": 1, "max_tokens": 5,
            "stream": True, "temperature": 0}  # fmt: skip
    with client.stream("POST", "/v1/completions", json=body) as response:
        events = sse_events(response)
    full = client.post("/v1/completions", json={**body, "stream": False}).json()
    expected = full["choices"][0]["logprobs"]
    chunks = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    assert len(chunks) > 1
    for key in ("tokens", "text_offset", "token_logprobs"):
        assert [v for chunk in chunks for v in chunk[key]] == expected[key]
    assert expected["text_offset"][-1] == len(full["choices"][0]["text"]) - 1


def test_completions_default_max_tokens_is_16(client, tm):
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": "a"})
    # the route's default, which the TokenizerManager cuts to the room the context leaves
    assert "max_new_tokens" not in tm.requests[0].sampling_params
    assert tm.requests[0].default_max_new_tokens == 16
    assert response.json()["usage"]["completion_tokens"] == 16


# --- errors ----------------------------------------------------------------------------------


def test_error_bodies(client):
    post = client.post
    assert_error(post("/v1/completions", json={"model": MODEL, "prompt": "a", "suffix": "z"}),
                 400, "suffix")  # fmt: skip
    both = chat_body(regex="a+", response_format={"type": "json_object"})
    assert_error(post("/v1/chat/completions", json=both), 400, "response_format")
    no_spec = chat_body(response_format={"type": "json_schema"})
    assert_error(post("/v1/chat/completions", json=no_spec), 400, "response_format.json_schema")
    bad_schema = chat_body(response_format={"type": "json_schema", "json_schema": {"schema": 1}})
    assert_error(post("/v1/chat/completions", json=bad_schema), 400,
                 "response_format.json_schema.schema")  # fmt: skip
    no_structures = chat_body(response_format={"type": "structural_tag"})
    assert_error(post("/v1/chat/completions", json=no_structures), 400, "response_format")
    assert_error(post("/v1/completions", json={"model": MODEL, "prompt": "a",
                                               "json_schema": "{x"}), 400, "json_schema")  # fmt: skip
    assert_error(post("/v1/completions", json={"model": MODEL, "prompt": "a", "regex": "a",
                                               "ebnf": "root ::= \"a\""}), 400)  # fmt: skip
    assert_error(post("/v1/chat/completions", json={**chat_body(), "model": "nope"}), 404, "model")
    assert_error(post("/v1/chat/completions", json=chat_body(temperature=-1)), 400, "temperature")
    assert_error(post("/v1/chat/completions", json=chat_body(n="x")), 400, "n")
    assert_error(post("/v1/chat/completions", json=chat_body(top_logprobs=2)), 400, "top_logprobs")
    assert_error(post("/v1/chat/completions", json={"model": MODEL}), 400, "messages")
    assert_error(post("/v1/completions", json={"model": MODEL, "prompt": [[]]}), 400, "prompt")
    assert_error(post("/v1/completions", json={"model": MODEL, "prompt": [999999]}), 400)
    assert_error(post("/v1/chat/completions", json=chat_body(logit_bias={"x": 1})), 400)
    assert_error(
        post("/v1/chat/completions", json=chat_body(max_tokens=2, min_tokens=5)), 400, "min_tokens"
    )


def test_malformed_json_is_400(client):
    response = client.post("/v1/chat/completions", content=b"{not json",
                           headers={"content-type": "application/json"})  # fmt: skip
    assert assert_error(response, 400)["code"] == "invalid_json"
    assert client.post("/v1/chat/completions", json=chat_body(max_tokens=1)).status_code == 200


def test_body_over_the_limit_is_413_and_the_server_keeps_serving(tm):
    mib = 1 << 20
    filler = {"role": "user", "content": "x" * (mib + 10)}
    big = json.dumps(chat_body(messages=[filler])).encode()

    def chunked(data: bytes):  # no Content-Length: the limit is counted while reading
        for start in range(0, len(data), 64 * 1024):
            yield data[start : start + 64 * 1024]

    with make_client(tm, max_request_body_mb=1) as client:
        sized = client.post("/v1/chat/completions", content=big,
                            headers={"content-type": "application/json"})  # fmt: skip
        error = assert_error(sized, 413)
        assert error["code"] == "request_too_large" and "1 MiB" in error["message"]
        streamed = client.post("/generate", content=chunked(big))
        assert assert_error(streamed, 413)["code"] == "request_too_large"
        assert client.post("/v1/chat/completions", json=chat_body(max_tokens=1)).status_code == 200
    with make_client(tm, max_request_body_mb=2) as client:  # the same body under a larger limit
        error = assert_error(client.post("/v1/chat/completions", content=big), 400, "messages")
        assert error["code"] == "context_length_exceeded"  # read and parsed whole


def test_too_long_prompt_is_400(client, tm):
    long_text = "x" * (tm.context_len + 5)
    chat = client.post("/v1/chat/completions", json=chat_body(messages=[{"role": "user",
                       "content": long_text}]))  # fmt: skip
    error = assert_error(chat, 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert "longer than the model's context length" in error["message"]  # the documented wording
    short = [{"role": "user", "content": "hi"}]
    too_much = client.post("/v1/chat/completions", json=chat_body(messages=short, max_tokens=10**6))
    error = assert_error(too_much, 400, "messages")
    assert error["message"].startswith("Requested token count exceeds the model's maximum context")
    assert "plus 1000000 max_tokens" in error["message"]
    too_much = client.post("/v1/chat/completions",
                           json=chat_body(messages=short, max_completion_tokens=10**6))  # fmt: skip
    assert "plus 1000000 max_completion_tokens" in too_much.json()["error"]["message"]
    body = {"model": MODEL, "prompt": long_text, "max_tokens": 2}
    assert assert_error(client.post("/v1/completions", json=body), 400, "prompt")["code"] == (
        "context_length_exceeded"
    )
    tokens = {**body, "prompt": [104] * (tm.context_len + 1)}
    assert_error(client.post("/v1/completions", json=tokens), 400, "prompt")
    huge = {**body, "prompt": "x" * (tm.context_len * 5)}  # refused before tokenizing
    assert_error(client.post("/v1/completions", json=huge), 400, "prompt")
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 400


def test_a_forced_calls_schema_error_names_tools():
    """Under tool_choice "required" / named, the runtime compiles a json_schema built
    from `tools`: its errors name `tools`, not a field the client never sent."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.sampling import openai_param

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice, param in (("required", "tools"), ("auto", "json_schema"), (None, "json_schema")):
        request = ChatCompletionRequest(**chat_body(tools=tools, tool_choice=choice))
        assert openai_param(request, "sampling_params.json_schema") == param, choice


def test_context_overflow_names_max_tokens(client, tm):
    """The runtime's native names (max_new_tokens) become the route's (max_tokens)."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": tm.context_len}
    error = assert_error(client.post("/v1/completions", json=body), 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    assert "max_tokens" in error["message"] and "max_new_tokens" not in error["message"]


def test_unknown_route_is_openai_error(client):
    assert_error(client.get("/v1/nothing"), 404)


# --- native /generate -------------------------------------------------------------------------


def test_generate_single_and_batch(client):
    single = client.post("/generate", json={"text": "ab", "sampling_params":
                         {"max_new_tokens": 3, "temperature": 0}}).json()  # fmt: skip
    assert set(single) >= {"text", "output_ids", "meta_info"} and len(single["output_ids"]) == 3
    batch = client.post("/generate", json={"input_ids": [[97], [98]], "sampling_params":
                        {"max_new_tokens": 2, "n": 2}}).json()  # fmt: skip
    assert isinstance(batch, list) and len(batch) == 4


def test_generate_batch_with_one_sampling_params_per_prompt(client):
    # as SGLang's /generate: a list of sampling_params, one per prompt
    body = {"text": ["ab", "cd"], "sampling_params": [{"max_new_tokens": 2, "temperature": 0},
                                                      {"max_new_tokens": 5, "temperature": 0}]}  # fmt: skip
    batch = client.post("/generate", json=body).json()
    assert [len(out["output_ids"]) for out in batch] == [2, 5]
    body["sampling_params"] = body["sampling_params"][:1]
    assert assert_error(client.post("/generate", json=body), 400)["param"] == "sampling_params"
    body["sampling_params"] = [{"n": 2}, {"n": 1}]
    assert "n must be the same" in assert_error(client.post("/generate", json=body), 400)["message"]
    body["sampling_params"] = [{"n": 2, "max_new_tokens": 1}, {"n": 2, "max_new_tokens": 3}]
    outs = client.post("/generate", json=body).json()
    assert [len(out["output_ids"]) for out in outs] == [1, 1, 3, 3]


def test_generate_batch_with_rids_and_logprob_options_per_prompt(client, tm):
    # as SGLang's GenerateReqInput: rid, return_logprob, top_logprobs_num and
    # logprob_start_len each one value or one per prompt (a list was a 400)
    body = {"text": ["ab", "cd"], "sampling_params": {"max_new_tokens": 2},
            "rid": ["first", "second"], "return_logprob": [True, False],
            "top_logprobs_num": [2, 0], "logprob_start_len": [0, -1]}  # fmt: skip
    outs = client.post("/generate", json=body).json()
    assert [out["meta_info"]["id"] for out in outs] == ["first", "second"]
    sent = tm.requests[-2:]
    assert [(r.rid, r.return_logprob, r.top_logprobs_num, r.logprob_start_len) for r in sent] == [
        ("first", True, 2, 0), ("second", False, 0, -1)]  # fmt: skip
    # n > 1: each prompt's samples are `<rid>-<k>` under that rid
    client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 1, "n": 2}})
    assert [(r.rid, r.parent_rid) for r in tm.requests[-4:]] == [
        ("first-0", "first"), ("first-1", "first"), ("second-0", "second"),
        ("second-1", "second")]  # fmt: skip
    for name in ("rid", "return_logprob", "top_logprobs_num", "logprob_start_len"):
        short = {**body, name: body[name][:1]}
        error = assert_error(client.post("/generate", json=short), 400, name)
        assert "got 1 entries for 2 prompts" in error["message"]


def test_generate_stream_cumulative(client):
    body = {"text": "ab", "stream": True, "sampling_params": {"max_new_tokens": 4}}
    with client.stream("POST", "/generate", json=body) as response:
        events = sse_events(response)
    texts = [e["text"] for e in events]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_bad_sampling_params(client):
    body = {"text": "ab", "sampling_params": {"max_new_tokens": 2, "bogus": 1}}
    assert "bogus" in assert_error(client.post("/generate", json=body), 400)["message"]
    # rules across fields name a field too (a pydantic model validator's carry none)
    for both_or_neither in ({"sampling_params": {}}, {"text": "a", "input_ids": [1]}):
        error = assert_error(client.post("/generate", json=both_or_neither), 400, "text")
        assert error["message"] == "give exactly one of text and input_ids"


@pytest.mark.parametrize(
    "body, param, code",
    [({"prompt": []}, "prompt", "invalid_value"), ({"prompt": [[1], []]}, "prompt", "invalid_value"),
     ({"prompt": "a", "n": 1, "best_of": 2}, "best_of", "unsupported")],
)  # fmt: skip
def test_completions_refusals_carry_the_documented_code(client, body, param, code):
    response = client.post("/v1/completions", json={"model": "fake-model", **body})
    assert assert_error(response, 400, param)["code"] == code


def _user(content) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize(
    "extra, param, code",
    [({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
     ({"regex": "a", "response_format": {"type": "json_object"}}, "response_format",
      "invalid_value"),
     ({"messages": _user([{"type": "image_url", "image_url": {"url": "x"}}])}, "messages",
      "unsupported"),
     ({"messages": _user([{"type": "text"}])}, "messages", "invalid_value"),  # OpenAI's 400
     ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value")],
)  # fmt: skip
def test_chat_refusals_carry_the_documented_code(client, extra, param, code):
    """api.md's table: no 400 answers `"code": null`."""
    response = client.post("/v1/chat/completions", json=chat_body(**extra))
    assert assert_error(response, 400, param)["code"] == code


# --- ops routes --------------------------------------------------------------------------------


def test_models_routes(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert_error(client.get("/v1/models/other"), 404)


def test_health_follows_status_and_liveness(client, tm):
    assert client.get("/health").status_code == 200
    assert client.head("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200
    tm.alive = False
    assert client.get("/health").status_code == 503
    tm.alive = True
    client.app.state.server.status = ServerStatus.SHUTTING_DOWN
    assert client.get("/health").status_code == 503


def test_readback_after_update_weights(client):
    response = client.post("/update_weights_from_disk", json={"model_path": "/models/new"})
    assert response.json()["success"] is True
    assert client.get("/model_info").json()["model_path"] == "/models/new"
    info = client.get("/get_server_info").json()
    assert info["model_path"] == "/models/new"
    assert info["internal_states"][0]["model_path"] == "/models/new"
    bad = client.post("/update_weights_from_disk", json={"model_path": "/missing/x"})
    assert_error(bad, 400, "model_path")
    # an unknown format is the field's error (it was reported as model_path's)
    bogus = client.post("/update_weights_from_disk", json={"model_path": "/m", "load_format": "gguf"})
    assert "unsupported load format" in assert_error(bogus, 400, "load_format")["message"]


def test_flush_and_abort(client, tm, monkeypatch):
    assert client.post("/flush_cache").status_code == 200
    monkeypatch.setattr(tm, "flush_outcome", ([0], [1]))  # DP: rank 1 busy
    partial = client.post("/flush_cache")
    assert partial.status_code == 400
    assert "ranks [0] only" in partial.json()["error"]["message"]
    monkeypatch.setattr(tm, "flush_outcome", None)
    # 200 either way; success says whether the request was in flight
    assert client.post("/abort_request", json={"rid": "r1"}).json() == {
        "success": False,
        "rid": "r1",
    }
    assert "r1" in tm.aborted
    tm.running.add("r2")
    assert client.post("/abort_request", json={"rid": "r2"}).json()["success"] is True
    tm.running.discard("r2")


def test_a_single_choice_runs_under_the_response_id(client, tm):
    # SGLang: the response's id is the rid, so /abort_request with it reaches the request
    # (an n=1 request used to run as `<id>-0`, and the abort was a silent no-op)
    chat = client.post("/v1/chat/completions", json=chat_body(max_tokens=2)).json()
    assert tm.requests[-1].rid == chat["id"]
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2}
    completion = client.post("/v1/completions", json=body).json()
    assert tm.requests[-1].rid == completion["id"]


def test_metrics(client):
    client.post("/v1/chat/completions", json=chat_body(max_tokens=3, stream=True))
    client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2})
    text = client.get("/metrics").text
    for name in ("prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
                 "num_requests_total", "num_aborted_requests_total",
                 "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "e2e_request_latency_seconds_bucket", "queue_time_seconds_bucket",
                 "num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate",
                 "gen_throughput"):  # fmt: skip
        assert f"sglang:{name}" in text, name
    assert metric_value(text, "num_requests_total") == 2.0
    assert metric_value(text, "generation_tokens_total") == 5.0
    assert metric_value(text, "queue_time_seconds_count") == 2.0
    assert 'sglang:num_requests_total{model_name="fake-model"} 2.0' in text  # SGLang's label


def test_metrics_count_the_tokens_of_a_request_cut_short():
    """A client gone mid-stream: its prompt and the tokens generated so far are counted."""
    from sglang.srt.observability.metrics import RequestTracker, ServerMetrics

    metrics = ServerMetrics()
    tracker = RequestTracker(metrics)
    for done in (1, 4):
        meta = {"prompt_tokens": 7, "completion_tokens": done, "cached_tokens": 2}
        tracker.on_output({"meta_info": {**meta, "finish_reason": None}})
    tracker.on_abort()
    text = metrics.render().decode()
    for name, value in (("prompt_tokens_total", 7), ("generation_tokens_total", 4),
                        ("cached_tokens_total", 2), ("num_aborted_requests_total", 1),
                        # it ended here: in the latency histograms as every finished request
                        ("e2e_request_latency_seconds_count", 1), ("num_requests_total", 1)):  # fmt: skip
        assert metric_value(text, name) == value, name


def test_metrics_leave_out_the_latencies_of_a_cancelled_request():
    """A batch sibling cancelled by a refused prompt is no request: the tokens it had
    before the cancel add no first-token or inter-token samples."""
    from sglang.srt.observability.metrics import RequestTracker, ServerMetrics

    metrics = ServerMetrics()
    cancelled, finished = RequestTracker(metrics), RequestTracker(metrics)
    for done in (1, 3):
        meta = {"prompt_tokens": 2, "completion_tokens": done}
        cancelled.on_output({"meta_info": {**meta, "finish_reason": None}})
        finished.on_output({"meta_info": {**meta, "finish_reason": None}})
    finished.on_output({"meta_info": {"prompt_tokens": 2, "completion_tokens": 3,
                                      "finish_reason": {"type": "length"}}})  # fmt: skip
    text = metrics.render().decode()
    assert metric_value(text, "time_to_first_token_seconds_count") == 1
    assert metric_value(text, "inter_token_latency_seconds_count") == 2
    assert metric_value(text, "num_requests_total") == 1


def test_abort_all_and_the_bodies_of_admin_routes(client, tm):
    tm.running.update({"a", "b"})
    reply = client.post("/abort_request", json={"abort_all": True}).json()
    assert reply["success"] is True and reply["num_aborted"] == 2
    assert {"a", "b"} <= tm.aborted
    tm.running.clear()
    assert_error(client.post("/abort_request", json={}), 400, "rid")
    assert client.post("/abort_request", json={"rid": "a", "abort_al": True}).status_code == 400
    update = {"model_path": "/models/new"}
    assert_error(client.post("/update_weights_from_disk", json={**update, "flush_cache": False}),
                 400, "flush_cache")  # fmt: skip
    unknown = client.post("/update_weights_from_disk", json={**update, "weight_version": "2"})
    assert unknown.status_code == 400 and "weight_version" in unknown.text
    ok = client.post("/update_weights_from_disk", json={**update, "abort_all_requests": True})
    assert ok.json()["success"] is True


def _metric(client, name: str) -> float:
    return metric_value(client.get("/metrics").text, name)


def test_a_refused_batch_is_not_counted_and_a_failed_request_is(client, tm):
    # one bad prompt refuses the whole request (400): the sibling it cancelled is no
    # request of its own; a request the runtime fails (5xx) finished, and is counted
    before = _metric(client, "num_requests_total")
    refused = client.post("/v1/completions", json={"model": MODEL, "prompt": ["ab", "x" * 300]})
    assert refused.status_code == 400
    assert _metric(client, "num_requests_total") == before
    tm.fail_after_tokens = 1  # the runtime dies after one token
    failed = client.post("/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 4})
    assert failed.status_code >= 500
    assert _metric(client, "num_requests_total") == before + 1


def test_api_key(tm):
    with make_client(tm, api_key="sekret") as client:
        assert client.get("/health").status_code == 200
        error = assert_error(client.get("/v1/models"), 401)
        assert error["code"] == "invalid_api_key"
        wrong = {"Authorization": "Bearer nope"}
        assert client.get("/v1/models", headers=wrong).status_code == 401
        right = {"Authorization": "Bearer sekret"}
        assert client.get("/v1/models", headers=right).status_code == 200
        tm.config["api_key"] = "sekret"  # as the real readback holds it
        info = client.get("/server_info", headers=right).json()
        assert info["api_key"] == "<set>" and "sekret" not in str(info)
        # the scheme is case-insensitive; /health/ is as open as /health (it was a 401)
        assert client.get("/v1/models", headers={"Authorization": "bearer sekret"}).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": "Bearersekret"}).status_code == 401
        assert client.get("/health/", follow_redirects=False).status_code != 401
        # the first Authorization header counts, as Starlette reads it (the last did)
        two = [("Authorization", "Bearer nope"), ("Authorization", "Bearer sekret")]
        assert client.get("/v1/models", headers=two).status_code == 401
        # a browser's preflight is answered before the key is asked for (CORS, as SGLang)
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})  # fmt: skip
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] in ("*", "http://app.example")
        reply = client.get("/v1/models", headers={**right, "Origin": "http://app.example"})
        assert reply.headers["access-control-allow-origin"] in ("*", "http://app.example")


def test_a_batch_items_runtime_error_names_the_item(client):
    # sampling_params given per prompt: the 400 said "sampling_params.logit_bias", not
    # which prompt's, while the field checks name "sampling_params.1.temperature"
    params = [{"max_new_tokens": 2}, {"max_new_tokens": 2, "logit_bias": {"99999": 1.0}}]
    reply = client.post("/generate", json={"text": ["ab", "cd"], "sampling_params": params})
    assert assert_error(reply, 400, "sampling_params.1.logit_bias")
    one = {"max_new_tokens": 2, "logit_bias": {"99999": 1.0}}  # one for all: its own name
    reply = client.post("/generate", json={"text": ["ab", "cd"], "sampling_params": one})
    assert assert_error(reply, 400, "sampling_params.logit_bias")


def test_item_params_index_only_the_fields_given_per_prompt():
    from sglang.srt.entrypoints.openai.serving_native import GenerateRequest

    batch = GenerateRequest.model_validate(
        {"text": ["a", "b"], "logprob_start_len": [0, 5], "token_ids_logprob": [1, 2]}
    )
    assert batch.item_param("text", 1) == "text.1"
    assert batch.item_param("logprob_start_len", 1) == "logprob_start_len.1"
    assert batch.item_param("token_ids_logprob", 1) == "token_ids_logprob"  # one list for all
    assert batch.item_param("sampling_params.regex", 1) == "sampling_params.regex"
    ids = GenerateRequest.model_validate({"input_ids": [[1], [2]]})
    assert ids.item_param("input_ids", 0) == "input_ids.0"
    assert GenerateRequest.model_validate({"input_ids": [1, 2]}).item_param("input_ids", 0) == "input_ids"


@pytest.mark.parametrize(
    "host, url",
    [("0.0.0.0", "http://127.0.0.1:31234"), ("::", "http://[::1]:31234"),
     ("::1", "http://[::1]:31234"), ("localhost", "http://localhost:31234")],
)  # fmt: skip
def test_the_ready_line_names_a_url_that_answers(host, url):
    # "::" listens on IPv6 only: the line said http://127.0.0.1:P, which refused
    from sglang.srt.entrypoints.http_server import _server_url

    with get_context().override_server_args(host=host, port=31234):
        assert _server_url() == url


def test_405_names_the_allowed_methods_and_bodies_must_be_plain_utf8(client):
    assert client.get("/v1/chat/completions").headers.get("allow") == "POST"
    # a path served by two routes names both methods (Starlette named one)
    assert client.delete("/flush_cache").headers.get("allow") == "GET, POST"
    gzipped = client.post("/v1/completions", content=b"\x1f\x8b\x08\x00",
                          headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert assert_error(gzipped, 415)["code"] == "unsupported_media_type"
    # a coding in any Content-Encoding header, or in Transfer-Encoding: not a UTF-8 400
    for headers in ([("Content-Encoding", "identity"), ("Content-Encoding", "gzip")],
                    [("Content-Encoding", "identity, br")],
                    [("Transfer-Encoding", "gzip, chunked")]):  # fmt: skip
        reply = client.post("/v1/completions", content=b"\x1f\x8b\x08\x00", headers=headers)
        assert assert_error(reply, 415)["code"] == "unsupported_media_type", headers
    latin1 = client.post("/v1/completions", content='{"prompt": "caf\xe9"}'.encode("latin-1"))
    assert "the body is not UTF-8 (byte 15" in assert_error(latin1, 400)["message"]


def test_openai_client(client):
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4, n=2, seed=3)  # fmt: skip
    assert len(chat.choices) == 2 and chat.usage.completion_tokens == 8
    stream = oai.completions.create(model=MODEL, prompt="ab", max_tokens=3, stream=True,
                                    stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 3
    assert set("".join(c.choices[0].text for c in chunks if c.choices)) <= set(OUTPUT_ALPHABET)


def test_json_body_without_content_type(client):
    body = json.dumps(chat_body(max_tokens=2)).encode()
    response = client.post("/v1/chat/completions", content=body,
                           headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert response.status_code == 200 and len(response.json()["choices"]) == 1


def test_runtime_failure_mid_stream_is_an_sse_error(client, tm):
    tm.fail_after_tokens = 2
    with client.stream("POST", "/v1/chat/completions",
                       json=chat_body(max_tokens=10, stream=True)) as response:  # fmt: skip
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1]["error"]["type"] == "service_unavailable_error"
    tm.fail_after_tokens = None
    assert client.post("/v1/chat/completions", json=chat_body(max_tokens=1)).status_code == 200


def test_health_503_when_scheduler_does_not_answer(client, tm, monkeypatch):
    """/health answers within SGLANG_HEALTH_TIMEOUT: 503 when the scheduler is silent,
    200 without asking it when the runtime sent output within the timeout."""

    async def hang():
        await asyncio.sleep(10)

    monkeypatch.setattr(tm, "get_internal_state", hang)
    with envs.SGLANG_HEALTH_TIMEOUT.override(0.05):
        stuck = client.get("/health")
        assert stuck.status_code == 503 and stuck.json() == {"status": "unhealthy"}
        monkeypatch.setattr(tm, "scheduler_busy_for_s", lambda: 30.0)  # a long prefill
        assert client.get("/health").status_code == 200
        monkeypatch.setattr(tm, "scheduler_busy_for_s", lambda: None)
        monkeypatch.setattr(tm, "seconds_since_output", lambda: 0.01)
        assert client.get("/health").status_code == 200
        # output from one DP rank says nothing of a frozen other
        monkeypatch.setattr(tm, "stalled_ranks", lambda limit_s: [1])
        frozen = client.get("/health")
        assert frozen.status_code == 503 and frozen.json() == {"status": "unhealthy"}


def test_health_is_200_while_a_weight_update_loads(client, tm, monkeypatch):
    # the loading scheduler does not step; requests wait for it and then run
    monkeypatch.setattr(tm, "stalled_ranks", lambda limit_s: [0])
    monkeypatch.setattr(tm, "updating_weights", lambda: True)
    assert client.get("/health").status_code == 200


def test_a_runtime_that_dies_under_a_weight_update_is_a_503(client, tm, monkeypatch):
    from sglang.srt.managers.request_errors import ServerUnavailableError

    async def died(*args, **kwargs):
        raise ServerUnavailableError("The scheduler process (pid 1) exited unexpectedly")

    monkeypatch.setattr(tm, "update_weights_from_disk", died)
    response = client.post("/update_weights_from_disk", json={"model_path": "/new"})
    assert response.status_code == 503 and "exited" in response.json()["error"]["message"]


def test_health_body_says_dead_once_a_child_died(client, tm, monkeypatch):
    monkeypatch.setattr(tm, "is_alive", lambda: False)  # the status is READY until exit
    response = client.get("/health")
    assert response.status_code == 503 and response.json() == {"status": "dead"}


def test_a_rank_is_stalled_when_it_neither_steps_nor_runs_a_forward():
    from sglang.srt.managers.forward_clock import ForwardClock, ForwardClocks

    stepping, frozen, in_forward, loading = (ForwardClock() for _ in range(4))
    for clock in (stepping, frozen, in_forward):
        clock.step()
    frozen._shared[1] -= 60.0  # last stepped a minute ago
    in_forward._shared[1] -= 60.0
    in_forward.start()  # its own watchdog ends a forward past --watchdog-timeout
    clocks = ForwardClocks([stepping, frozen, in_forward, loading])
    assert clocks.stalled_ranks(5.0) == [1]
    assert frozen.stalled_ranks(5.0) == [0] and stepping.stalled_ranks(5.0) == []


def test_forward_clock_is_shared_between_processes():
    import multiprocessing as mp

    from sglang.srt.managers.forward_clock import ForwardClock

    clock = ForwardClock.shared(mp.get_context("spawn"))
    assert clock.busy_for_s() is None
    clock.start()
    assert 0.0 <= clock.busy_for_s() < 5.0
    clock.stop()
    assert clock.busy_for_s() is None
    assert clock.silent_for_s() is None  # no step yet: not judged while loading
    clock.step()
    assert 0.0 <= clock.silent_for_s() < 5.0 and clock.busy_for_s() is None


def test_continuous_usage_stats_and_sse_headers(client):
    body = chat_body(max_tokens=3, stream=True,
                     stream_options={"continuous_usage_stats": True})  # fmt: skip
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["cache-control"] == "no-cache"
        events = sse_events(response)
    completions = [e["usage"]["completion_tokens"] for e in events]
    assert completions == sorted(completions) and completions[-1] == 3
    assert all(e["choices"] for e in events)  # no usage-only chunk without include_usage


def test_openapi_describes_every_post_body(client):
    """Clients and API fuzzers read the real request schema from /openapi.json."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns on duplicate operation ids
        doc = client.get("/openapi.json").json()
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    schemas = doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        if "post" not in operations or path == "/flush_cache":  # flush_cache takes no body
            continue
        body = operations["post"].get("requestBody")
        assert body is not None, f"POST {path} has no request body in the OpenAPI document"
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[-1] in schemas
    native = schemas["GenerateRequest"]["properties"]["sampling_params"]
    spec = schemas["SamplingParamsSpec"]["properties"]
    assert any("SamplingParamsSpec" in str(option) for option in native.get("anyOf", [native]))
    assert spec["seed"]["anyOf"][0]["type"] == "integer"
    assert spec["top_p"]["exclusiveMinimum"] == 0.0
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["n"]["maximum"] == spec["n"]["maximum"]  # one definition of the cap


@pytest.mark.parametrize(
    "sampling_params, param",
    [
        ({"seed": "x"}, "sampling_params.seed"),
        ({"seed": 1.5}, "sampling_params.seed"),
        ({"stop": [1]}, "sampling_params.stop.0"),
        ({"stop_token_ids": [1.5], "min_new_tokens": 1}, "sampling_params.stop_token_ids.0"),
        ({"skip_special_tokens": "no"}, "sampling_params.skip_special_tokens"),
        ({"n": 10_000}, "sampling_params.n"),
        ({"bogus": 1}, "sampling_params.bogus"),
    ],
)
def test_native_bad_sampling_params_are_400_naming_the_field(client, sampling_params, param):
    body = {"text": "def f(", "sampling_params": {"max_new_tokens": 4, **sampling_params}}
    assert_error(client.post("/generate", json=body), 400, param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input_ids": [[1, 2], [3, -1]]}, "input_ids.1.1"),
        ({"input_ids": [[1, 2], [3, 1.5]]}, "input_ids.1.1"),
        ({"input_ids": [[1], [2, [3]]]}, "input_ids.1.1"),
        ({"text": ["a", 5]}, "text.1"),
        ({"text": "x", "return_logprob": True, "token_ids_logprob": [[1], [2, -3]]},
         "token_ids_logprob.1.1"),
    ],
)
def test_native_bad_nested_list_names_the_bad_element(client, body, param):
    assert_error(client.post("/generate", json=body), 400, param)


def test_native_null_options_take_their_defaults(client):
    body = {"text": "def f(", "sampling_params": {"max_new_tokens": 2},
            "return_logprob": None, "top_logprobs_num": None, "logprob_start_len": None,
            "stream": None, "return_text_in_logprobs": None, "require_reasoning": None}
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    assert "input_token_logprobs" not in response.json()["meta_info"]


def test_native_null_sampling_fields_are_unset(client, tm):
    """A null temperature (top_p, ...) is unset: the model's generation_config default
    applies, as on the OpenAI routes; a null max_new_tokens stays "up to the context"."""
    body = {"text": "x", "sampling_params": {"temperature": None, "top_p": None, "top_k": None,
                                             "min_p": None, "repetition_penalty": None,
                                             "max_new_tokens": None, "n": None}}  # fmt: skip
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    assert tm.requests[0].sampling_params == {"max_new_tokens": None}


@pytest.mark.parametrize("route", ["/generate", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("name", ["data_parallel_rank", "routed_dp_rank"])
def test_a_chosen_dp_rank_is_refused_on_every_route_rank_0_of_one_is_fine(tm, route, name):
    """SGLang's routing fields were dropped on the OpenAI routes (a 200 served wherever
    the balancer sent it) and "unknown" on /generate."""
    body = {"model": MODEL, "max_tokens": 1, "prompt": "x", "messages": [{"role": "user",
            "content": "x"}]} if route != "/generate" else {"text": "x"}  # fmt: skip
    if route == "/v1/completions":
        del body["messages"]
    elif route == "/v1/chat/completions":
        del body["prompt"]
    tm.num_dp_ranks = 2
    with make_client(tm) as dp2:
        error = assert_error(dp2.post(route, json={**body, name: 1}), 400, name)
        assert "not supported" in error["message"]
        assert_error(dp2.post(route, json={**body, name: 0}), 400, name)
        assert dp2.post(route, json={**body, name: None}).status_code == 200
    tm.num_dp_ranks = 1
    with make_client(tm) as one:
        assert one.post(route, json={**body, name: 0}).status_code == 200


def test_native_top_logprobs_num_capped(client):
    body = {"text": "x", "return_logprob": True, "top_logprobs_num": 101}
    assert_error(client.post("/generate", json=body), 400, "top_logprobs_num")


def test_top_logprobs_num_capped_by_the_vocabulary():
    obj = GenerateReqInput(text="x", return_logprob=True, top_logprobs_num=60)
    check_request_fields(obj, vocab_size=64)
    with pytest.raises(ValueError, match=r"top_logprobs_num must be an integer in \[0, 50\]"):
        check_request_fields(obj, vocab_size=50)


def test_one_request_cannot_ask_for_unbounded_generations(client):
    """prompts x n is capped per HTTP request (each choice is a concurrent generation)."""
    many = client.post("/v1/completions", json={"model": MODEL, "prompt": ["a"] * 20, "n": 128})
    assert_error(many, 400, "prompt")
    native = client.post(
        "/generate", json={"text": ["a"] * 2000, "sampling_params": {"max_new_tokens": 1}}
    )
    assert_error(native, 400, "text")
    ok = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": ["a"] * 8, "n": 2, "max_tokens": 1}
    )
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 16


# --- structured output -------------------------------------------------------------------


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
STRUCTURES = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
              "triggers": ["<f>"]}  # fmt: skip


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"regex": "a+"}, {"regex": "a+"}),
        ({"ebnf": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
        ({"json_schema": json.dumps(SCHEMA)}, {"json_schema": json.dumps(SCHEMA)}),
        ({"response_format": {"type": "text"}}, {}),
        ({"response_format": {"type": "json_object"}}, {"json_schema": '{"type": "object"}'}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            {"json_schema": json.dumps(SCHEMA)},
        ),
        (
            {"response_format": {"type": "structural_tag", **STRUCTURES}},
            {"structural_tag": json.dumps(STRUCTURES)},
        ),
    ],
)
def test_constraints_reach_the_sampling_params(client, tm, extra, expected):
    """Both OpenAI routes hand the runtime the native constraint field the request asks
    for (the scheduler compiles and enforces it; tested end to end in test_structured_output)."""
    for route, body in (
        ("/v1/chat/completions", chat_body(max_tokens=2, **extra)),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, **extra}),
    ):
        assert client.post(route, json=body).status_code == 200
        params = tm.requests[-1].sampling_params
        constraint = {k: params[k] for k in ("json_schema", "regex", "ebnf", "structural_tag")
                      if k in params}  # fmt: skip
        assert constraint == expected, route


# --- /v1/tokenize, /v1/detokenize -------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_tokenize_and_detokenize_round_trip(client, prefix):
    one = client.post(f"{prefix}/tokenize", json={"model": MODEL, "prompt": "hi there"}).json()
    assert one == {"tokens": [ord(c) for c in "hi there"], "count": 8, "max_model_len": 256}
    many = client.post(f"{prefix}/tokenize", json={"prompt": ["ab", "", "c"]}).json()
    assert many["tokens"] == [[97, 98], [], [99]] and many["count"] == [2, 0, 1]
    text = client.post(f"{prefix}/detokenize", json={"tokens": one["tokens"]}).json()
    assert text == {"text": "hi there"}
    texts = client.post(f"{prefix}/detokenize", json={"tokens": many["tokens"]}).json()
    assert texts == {"text": ["ab", "", "c"]}
    assert client.post(f"{prefix}/detokenize", json={"tokens": []}).json() == {"text": ""}


@pytest.mark.parametrize(
    "route, body, status, param",
    [
        ("/v1/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/v1/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/v1/tokenize", {"prompt": ["x", 5]}, 400, "prompt"),
        ("/v1/tokenize", {}, 400, "prompt"),
        ("/v1/tokenize", {"prompt": "x", "add_special_tokens": "no"}, 400, "add_special_tokens"),
        ("/v1/tokenize", {"prompt": ["x"] * 2049}, 400, "prompt"),
        ("/v1/detokenize", {"tokens": [1, 256]}, 400, "tokens"),
        ("/v1/detokenize", {"tokens": [[1], [2, 999]]}, 400, "tokens"),
        ("/v1/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/v1/detokenize", {"tokens": ["1"]}, 400, "tokens"),
        ("/v1/detokenize", {"tokens": [1, [2]]}, 400, "tokens"),
        ("/detokenize", {"tokens": [[1]] * 2049}, 400, "tokens"),
    ],
)
def test_tokenize_routes_refuse_bad_input_and_keep_serving(client, route, body, status, param):
    error = assert_error(client.post(route, json=body), status)
    assert error["param"] is not None and error["param"].split(".")[0] == param
    assert client.post("/v1/tokenize", json={"prompt": "ok"}).json()["count"] == 2


def test_tokenize_without_a_tokenizer_is_400(tm):
    tm.tokenizer = None  # --skip-tokenizer-init
    with make_client(tm) as client:
        error = assert_error(client.post("/v1/tokenize", json={"prompt": "x"}), 400, "model")
        assert "--skip-tokenizer-init" in error["message"]
        assert_error(client.post("/detokenize", json={"tokens": [1]}), 400, "model")
        # chat renders text: a 400 naming the reason, with or without --chat-template
        error = assert_error(client.post("/v1/chat/completions", json=chat_body()), 400, "messages")
        assert "--skip-tokenizer-init" in error["message"]


def test_completions_without_a_tokenizer_return_the_token_ids(tm, client):
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}
    assert "token_ids" not in client.post("/v1/completions", json=body).json()["choices"][0]
    tm.tokenizer = None  # --skip-tokenizer-init: there is no text to send
    with make_client(tm) as no_tokenizer:
        choice = no_tokenizer.post("/v1/completions", json=body).json()["choices"][0]
        assert len(choice["token_ids"]) == 4 and all(isinstance(t, int) for t in choice["token_ids"])
        events = sse_events(no_tokenizer.post("/v1/completions", json={**body, "stream": True}))
        streamed = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
        assert streamed == choice["token_ids"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_every_chunk_of_a_stream_has_the_same_created(route, monkeypatch):
    import itertools
    import types

    from sglang.srt.entrypoints.openai import stream_chunks

    ticks = itertools.count(1_700_000_000)  # a clock that moves at every read
    monkeypatch.setattr(stream_chunks, "time", types.SimpleNamespace(time=lambda: next(ticks)))
    body = {"model": MODEL, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    body.update({"prompt": "ab"} if "chat" not in route else chat_body())
    with make_client(FakeTokenizerManager(step_delay_s=0.002)) as client:  # a chunk a step
        events = sse_events(client.post(route, json=body))
    assert len(events) > 3 and len({e["created"] for e in events}) == 1


def test_a_stream_that_fails_while_shaping_chunks_ends_with_an_error_event():
    """A bug past the first chunk (a parser raising, say) must not cut the connection:
    the client gets an error event and [DONE], and the choices are closed."""
    from sglang.srt.entrypoints.openai.serving_base import SSE_DONE, _sse

    class Fanout:
        closed = False

        def close(self) -> None:
            self.closed = True

    async def chunks():
        yield {"text": "a"}
        raise RecursionError("maximum recursion depth exceeded")

    async def read(fanout) -> list[bytes]:
        return [event async for event in _sse(fanout, chunks())]

    fanout = Fanout()
    events = asyncio.run(read(fanout))
    assert json.loads(events[0].decode().removeprefix("data: ")) == {"text": "a"}
    error = json.loads(events[1].decode().removeprefix("data: "))["error"]
    assert error["code"] == "request_failed" and "recursion" in error["message"]
    assert events[-1] == SSE_DONE and fanout.closed


def test_an_integer_past_64_bits_is_named_out_of_range(client):
    # orjson reads such a literal as a float: the 400 must not say "not an integer"
    body = b'{"model": "fake-model", "prompt": "a", "max_tokens": 1180591620717411303424}'
    reply = client.post("/v1/completions", content=body,
                        headers={"content-type": "application/json"})  # fmt: skip
    assert_error(reply, 400, "max_tokens")
    assert "out of range" in reply.json()["error"]["message"]


@pytest.mark.parametrize("field,value", [("priority", 5), ("lora_path", "adapter"),
                                         ("return_hidden_states", True),
                                         ("stop_regex", "[a-z]")])  # fmt: skip
def test_sglang_fields_this_server_lacks_are_refused_not_ignored(client, field, value):
    # /generate refuses them as unknown fields; the OpenAI routes must not drop them
    for route, body in (("/v1/chat/completions", chat_body(max_tokens=2)),
                        ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2}),
                        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})):  # fmt: skip
        error = assert_error(client.post(route, json={**body, field: value}), 400, field)
        assert not error["message"].startswith(f"{field}: Value error")
        assert "unknown field" not in error["message"]  # it says what is not supported
        assert client.post(route, json={**body, field: None}).status_code == 200
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2,
                                                "priority": None}).status_code == 200  # fmt: skip


@pytest.mark.parametrize(
    "field,value",
    [("functions", [{"name": "f", "parameters": {"type": "object"}}]), ("function_call", "auto"),
     ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"})],
)  # fmt: skip
def test_openai_chat_fields_this_server_cannot_answer_are_refused(client, field, value):
    # they were ignored: legacy functions never called, audio never produced
    error = assert_error(client.post("/v1/chat/completions", json=chat_body(**{field: value})),
                         400, field)  # fmt: skip
    assert "tools" in error["message"] or "text only" in error["message"]
    ok = chat_body(modalities=["text"], functions=None, audio=None)
    assert client.post("/v1/chat/completions", json=ok).status_code == 200


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_vllms_include_stop_str_in_output_keeps_the_stop(client, tm, route):
    # vLLM's name for no_stop_trim: it was ignored, the stop trimmed all the same
    body = {"model": MODEL, "max_tokens": 4, "stop": ["x"], "include_stop_str_in_output": True}
    body.update({"prompt": "a"} if route == "/v1/completions" else chat_body())
    assert client.post(route, json=body).status_code == 200
    assert tm.requests[-1].sampling_params["no_stop_trim"] is True
    client.post(route, json={**body, "include_stop_str_in_output": False})
    assert not tm.requests[-1].sampling_params.get("no_stop_trim")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_refuses_zero_tokens_under_either_name(client, field):
    # a chat turn has nothing to score without output (completions' echo does)
    assert_error(client.post("/v1/chat/completions", json=chat_body(**{field: 0})), 400, field)
