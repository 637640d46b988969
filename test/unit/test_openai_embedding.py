"""/v1/embeddings over a fake TokenizerManager, and the embedding path's pure pieces."""

from __future__ import annotations

import asyncio
import base64
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from openai_fake_tm import FakeTokenizerManager
from pydantic import ValidationError

from sglang.srt.entrypoints.http_server import ServerStatus, create_app
from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.protocol import EmbeddingRequest
from sglang.srt.entrypoints.openai.serving_embedding import (
    OpenAIServingEmbedding,
    encode_vector,
    split_inputs,
)
from sglang.srt.managers.request_errors import RequestFailedError
from sglang.srt.managers.tokenizer_embedding import (
    TokenizerEmbeddingMixin,
    check_finite,
    truncate_embedding,
)
from sglang.srt.observability.metrics import ServerMetrics
from sglang.srt.runtime_context import get_context
from sglang.srt.sampling.param_types import InvalidParamError
from sglang.test.prometheus import metric_value

MODEL = "fake-model"
DIM = 8


def fake_vector(input_ids: list[int]) -> list[float]:
    """A deterministic unit vector of the ids."""
    raw = [math.sin(sum(input_ids) + k) for k in range(DIM)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


@dataclass
class FakeEmbeddingTM(FakeTokenizerManager):
    is_embedding: bool = True
    encoded: list[Any] = field(default_factory=list)
    fail_on: str | None = None  # a text whose request fails (a 400 from the runtime)

    async def encode_request(self, obj) -> dict[str, Any]:
        self.encoded.append(obj)
        if obj.text is not None and obj.text == self.fail_on:
            raise InvalidParamError("input_ids must be token ids in [0, 256)", "input_ids")
        ids = self._input_ids(obj)
        await asyncio.sleep(0)
        vector = fake_vector(ids)
        if obj.dimensions is not None:
            vector = truncate_embedding(vector, obj.dimensions)
        meta = {"id": obj.rid, "prompt_tokens": len(ids), "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 0, "matched": None}}  # fmt: skip
        return {"embedding": vector, "meta_info": meta}


def make_client(tm: FakeTokenizerManager) -> TestClient:
    with get_context().override_server_args():
        app = create_app(tm)
    app.state.server.status = ServerStatus.READY
    return TestClient(app)


@pytest.fixture
def tm() -> FakeEmbeddingTM:
    return FakeEmbeddingTM()


@pytest.fixture
def client(tm) -> TestClient:
    with make_client(tm) as test_client:
        yield test_client


def post(client: TestClient, **body: Any):
    return client.post("/v1/embeddings", json={"model": MODEL, **body})


# --- the route -----------------------------------------------------------------------------


def test_single_text_shape_and_usage(client, tm):
    response = post(client, input="hello")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    [item] = body["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert item["embedding"] == pytest.approx(fake_vector(tm.tokenizer.encode("hello")))


def test_every_input_shape_is_one_request_per_input(client, tm):
    cases = [
        ("ab", [[97, 98]]),
        (["ab", "c"], [[97, 98], [99]]),
        ([5, 6, 7], [[5, 6, 7]]),
        ([[5, 6], [7]], [[5, 6], [7]]),
    ]
    for value, expected_ids in cases:
        tm.encoded.clear()
        body = post(client, input=value).json()
        assert [d["index"] for d in body["data"]] == list(range(len(expected_ids)))
        got = np.array([d["embedding"] for d in body["data"]])
        assert np.allclose(got, [fake_vector(ids) for ids in expected_ids])
        assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in expected_ids)
        assert len({o.rid for o in tm.encoded}) == len(expected_ids)


def test_base64_is_float32_little_endian(client):
    floats = post(client, input=["ab", "xyz"]).json()["data"]
    packed = post(client, input=["ab", "xyz"], encoding_format="base64").json()["data"]
    for f, b in zip(floats, packed):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == pytest.approx(f["embedding"], abs=1e-7)


def test_dimensions_are_passed_to_the_runtime(client, tm):
    body = post(client, input="abc", dimensions=3).json()
    assert tm.encoded[-1].dimensions == 3
    vector = body["data"][0]["embedding"]
    assert len(vector) == 3 and math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[1], []]}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": [-1]}, "input"),
        ({"input": 5}, "input"),
    ],
)
def test_bad_bodies_are_400(client, body, param):
    response = post(client, **body)
    assert response.status_code == 400, response.text
    got = response.json()["error"]["param"]
    assert re.fullmatch(rf"{param}(\.\d+)*", got), got  # a field path, no pydantic type tag


def test_runtime_refusal_is_400_naming_input(client, tm):
    tm.fail_on = "boom"
    response = post(client, input=["fine", "boom"])
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"


def test_unknown_model_is_404(client):
    response = client.post("/v1/embeddings", json={"model": "other", "input": "a"})
    assert response.status_code == 404


def test_generation_server_refuses_embeddings():
    with make_client(FakeTokenizerManager()) as client:
        response = post(client, input="a")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "--is-embedding" in error["message"] and error["code"] == "model_not_embedding"
    with make_client(FakeTokenizerManager()) as client:  # the native /encode too
        error = client.post("/encode", json={"text": "a"}).json()["error"]
    assert error["code"] == "model_not_embedding"


def test_openai_sdk_default_base64_decodes(client):
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    result = oai.embeddings.create(model=MODEL, input=["ab", "c"])
    assert [d.index for d in result.data] == [0, 1]
    assert result.data[1].embedding == pytest.approx(fake_vector([99]), abs=1e-6)
    assert result.usage.prompt_tokens == result.usage.total_tokens == 3


def test_openapi_documents_the_body(client):
    doc = client.get("/openapi.json").json()
    ref = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
    assert ref["schema"]["$ref"].endswith("/EmbeddingRequest")
    assert "encoding_format" in doc["components"]["schemas"]["EmbeddingRequest"]["properties"]


def test_model_info_says_not_generation(client):
    assert client.get("/model_info").json()["is_generation"] is False


# --- pure pieces -----------------------------------------------------------------------------


def test_split_inputs():
    assert split_inputs("a") == ["a"]
    assert split_inputs([1, 2]) == [[1, 2]]
    assert split_inputs(["a", "b"]) == ["a", "b"]
    assert split_inputs([[1], [2, 3]]) == [[1], [2, 3]]
    with pytest.raises(APIError):
        split_inputs([])
    with pytest.raises(APIError):
        split_inputs(["a"] * 2049)


def test_request_model_is_strict():
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"model": "m", "input": ["a", 1]})
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"model": "m", "input": "a", "dimensions": "3"})
    ok = EmbeddingRequest.model_validate({"model": "m", "input": [1, 2], "user": "u"})
    assert ok.encoding_format == "float" and ok.dimensions is None
    # SGLang's EmbeddingRequest has priority and lora_path: refused here, never ignored
    for name in ("priority", "lora_path"):
        with pytest.raises(ValidationError, match="not"):
            EmbeddingRequest.model_validate({"model": "m", "input": "a", name: 1})
        EmbeddingRequest.model_validate({"model": "m", "input": "a", name: None})


def test_encode_vector_float_passthrough_and_base64():
    vector = [0.5, -0.25, 1.0]
    assert encode_vector(vector, "float") is vector
    decoded = np.frombuffer(base64.b64decode(encode_vector(vector, "base64")), dtype="<f4")
    assert decoded.tolist() == vector


def test_truncate_renormalises():
    out = truncate_embedding([3.0, 4.0, 12.0], 2)
    assert out == pytest.approx([0.6, 0.8])
    assert truncate_embedding([0.0, 0.0, 1.0], 2) == [0.0, 0.0]


@dataclass
class _Config:
    raw: dict[str, Any]
    hidden_size: int = 16


class _Dims(TokenizerEmbeddingMixin):
    def __init__(self, raw: dict[str, Any]) -> None:
        self.model_config = _Config(raw)


def test_dimensions_need_a_matryoshka_model():
    _Dims({}).check_dimensions(None)
    with pytest.raises(InvalidParamError, match="does not support"):
        _Dims({}).check_dimensions(4)
    _Dims({"is_matryoshka": True}).check_dimensions(4)
    with pytest.raises(InvalidParamError, match="at most"):
        _Dims({"is_matryoshka": True}).check_dimensions(17)
    _Dims({"matryoshka_dimensions": [4, 8]}).check_dimensions(8)
    with pytest.raises(InvalidParamError, match="one of"):
        _Dims({"matryoshka_dimensions": [4, 8]}).check_dimensions(5)


def test_embedding_requests_are_counted_in_metrics(tm):
    # as SGLang: each input is a request with its prompt tokens and its latency
    with get_context().override_server_args(enable_metrics=True):
        app = create_app(tm)
    app.state.server.status = ServerStatus.READY
    with TestClient(app) as client:
        assert post(client, input=["hello", "hi"]).status_code == 200
        text = client.get("/metrics").text
    for name, value in (("num_requests_total", 2), ("prompt_tokens_total", 7),
                        ("e2e_request_latency_seconds_count", 2)):  # fmt: skip
        assert metric_value(text, name) == value, name


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_embedding_is_a_500_naming_it_on_every_format(bad):
    """JSON cannot carry NaN: "float" answered the serializer's 500, "base64" a 200 of
    NaN bytes. The check runs where every route (and Engine.encode) reads the vector."""
    with pytest.raises(RequestFailedError, match="holds NaN or inf") as failed:
        check_finite([0.5, bad, 0.25])
    assert failed.value.status_code == 500
    check_finite([0.5, -0.25])
    check_finite(None)  # aborted: no vector


def test_an_input_cut_off_by_its_client_is_counted_as_an_abort():
    """The tracker was fed only by a finished input: 196 inputs cut off by a disconnect
    left num_requests and num_aborted_requests where they were."""

    class Stalled:
        async def encode_request(self, obj):
            await asyncio.Event().wait()  # never finishes

    metrics = ServerMetrics("m")
    serving = OpenAIServingEmbedding(Stalled(), metrics)

    async def run(client_left: bool) -> None:
        task = asyncio.ensure_future(serving._encode(None, lambda: client_left))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run(client_left=False))  # a sibling's failure: that sibling's count
    asyncio.run(run(client_left=True))
    text = metrics.render().decode()
    assert metric_value(text, "num_requests_total") == 1
    assert metric_value(text, "num_aborted_requests_total") == 1
