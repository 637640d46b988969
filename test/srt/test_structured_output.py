"""End to end: grammar-constrained decoding on a real server (tiny random-weight Llama).

Random weights produce garbage; under a grammar the garbage must still be valid:
every JSON output parses and validates against its schema, every regex output
fully matches, and unconstrained requests in the same batches are unchanged.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests
from http_server_fixture import start_server

from sglang.test.pool_checks import idle_pool_problems

pytestmark = pytest.mark.slow

NAME = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "flat_required": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "name": NAME,
                },
                "required": ["id", "name"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": NAME,
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
            "note": {"type": ["string", "null"], "maxLength": 10},
        },
        "required": ["items", "note"],
        "additionalProperties": False,
    },
}
REGEX = r"(cat|dog)s? [0-9]{1,3}"
PROMPTS = [f"Request {i}: answer in the format asked." for i in range(16)]


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("structured") / "server.log"
    srv = start_server(
        tiny_llama_dir,
        log_path,
        "--served-model-name",
        "tiny",
        "--constrained-json-disable-any-whitespace",
        "--random-seed",
        "0",
        # decoding rows ride along the prefill batches of requests that arrive while
        # others decode: the grammar masks and outputs below hold for mixed batches too
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        "16",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def generate(server, text, **params) -> dict:
    response = requests.post(
        server.base_url + "/generate", json={"text": text, "sampling_params": params}, timeout=120
    )
    return response


def json_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_chat_response_format_json_schema_validates(client, name):
    for temperature, seed in ((0.0, None), (0.9, 1), (0.9, 2)):
        response = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"Give me a {name} object."}],
            response_format=json_format(name),
            max_tokens=200,
            temperature=temperature,
            seed=seed,
        )
        choice = response.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_streamed_json_object_on_completions(client):
    stream = client.completions.create(
        model="tiny",
        prompt="Any JSON object:",
        extra_body={"response_format": {"type": "json_object"}},
        max_tokens=1000,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_regex_and_ebnf_on_generate(server):
    batch = requests.post(
        server.base_url + "/generate",
        json={
            "text": PROMPTS[:8],
            "sampling_params": {"regex": REGEX, "max_new_tokens": 30, "temperature": 1.0},
        },  # fmt: skip
        timeout=120,
    )
    assert batch.status_code == 200, batch.text
    for out in batch.json():
        assert re.fullmatch(REGEX, out["text"]), out["text"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
    out = generate(server, "Yes or no?", ebnf='root ::= "yes" | "no"', temperature=0).json()
    assert out["text"] in ("yes", "no")


def test_mixed_batch_leaves_unconstrained_outputs_unchanged(server):
    """32 concurrent requests, every other one constrained: the unconstrained ones get
    exactly the tokens they get in a run with no constraint in sight."""
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    alone = [generate(server, p, **params).json()["output_ids"] for p in PROMPTS]

    def one(i: int) -> tuple[int, dict]:
        if i % 2:
            return i, generate(server, PROMPTS[i // 2], regex=REGEX, max_new_tokens=30).json()
        return i, generate(server, PROMPTS[i // 2], **params).json()

    with ThreadPoolExecutor(32) as pool:
        results = dict(pool.map(one, range(32)))
    for i, out in results.items():
        if i % 2:
            assert re.fullmatch(REGEX, out["text"]), out
        else:
            assert out["output_ids"] == alone[i // 2]


@pytest.mark.parametrize(
    "params, param",
    [
        ({"regex": "a("}, "sampling_params.regex"),
        ({"ebnf": "root ::= undefined_rule"}, "sampling_params.ebnf"),
        ({"json_schema": '{"type": "bogus"}'}, "sampling_params.json_schema"),
        ({"json_schema": "{not json"}, "sampling_params.json_schema"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "sampling_params.ebnf"),
    ],
)
def test_invalid_constraint_is_a_400_naming_the_field(server, params, param):
    response = generate(server, "x", **params)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert generate(server, "still serving", max_new_tokens=2).status_code == 200


def test_invalid_schema_through_response_format(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], response_format=bad
        )
    assert "bogus" in str(info.value) and info.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", extra_body={"regex": "(a"})
    assert info.value.body["param"] == "regex"


def test_pool_intact_and_grammar_backend_reported(server):
    info = requests.get(server.base_url + "/server_info", timeout=30).json()
    state = info["internal_states"][0]
    assert state["grammar_backend"] == "xgrammar"
    assert state["num_grammar_queue_reqs"] == 0
    assert not idle_pool_problems(state), idle_pool_problems(state)
