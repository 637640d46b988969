"""Embeddings end to end: a real `--is-embedding` server on the tiny Qwen3, checked against
HF's last hidden state at the last token, L2-normalised (`AutoModel`, float32).

The server prefills in chunks of 16 tokens, so the longer prompts here take several
chunks; its config.json declares Matryoshka training, so `dimensions` is served.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import requests
import torch
from http_server_fixture import start_server
from transformers import AutoModel, AutoTokenizer

from sglang.test.pool_checks import idle_pool_problems

pytestmark = pytest.mark.slow

TOL = 1e-4
CHUNK = 16
PROMPTS = [
    "import os",
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n",
    "x",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'is even')\n"
    "    else:\n        print(i, 'is odd')\n",
]


@pytest.fixture(scope="module")
def model_dir(tiny_qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 with `is_matryoshka` declared (so `dimensions` is served)."""
    path = tmp_path_factory.mktemp("tiny-qwen3-embedding") / "model"
    shutil.copytree(tiny_qwen3_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["is_matryoshka"] = True
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("embedding-server") / "server.log"
    srv = start_server(model_dir, log_path, "--is-embedding", "--served-model-name", "emb",
                       "--chunked-prefill-size", str(CHUNK), "--context-length", "512",
                       "--log-requests", "--log-level", "info")  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(autouse=True)
def no_leaks(server):
    yield
    deadline = time.monotonic() + 10
    while True:
        info = requests.get(server.base_url + "/server_info").json()
        state = info["internal_states"][0]
        if state["num_running_reqs"] == state["num_queued_reqs"] == 0:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    assert not idle_pool_problems(state), (idle_pool_problems(state), state)


def hf_embedding(hf_model, input_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        hidden = hf_model(torch.tensor([input_ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def embed(server, **body) -> requests.Response:
    return requests.post(server.base_url + "/v1/embeddings", json={"model": "emb", **body})


def vectors(response: requests.Response) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return [np.array(d["embedding"], dtype=np.float64) for d in data]


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL, np.abs(got - want).max()


def test_prompts_span_one_and_several_chunks(tokenizer):
    lengths = [len(tokenizer.encode(p)) for p in PROMPTS]
    assert min(lengths) < CHUNK and max(lengths) > 2 * CHUNK, lengths


def test_single_text_matches_hf(server, tokenizer, hf_model):
    response = embed(server, input=PROMPTS[1])
    [got] = vectors(response)
    ids = tokenizer.encode(PROMPTS[1])
    assert_close(got, hf_embedding(hf_model, ids))
    assert response.json()["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}


def test_batch_of_mixed_lengths_matches_hf(server, tokenizer, hf_model):
    response = embed(server, input=PROMPTS)
    ids = [tokenizer.encode(p) for p in PROMPTS]
    for got, one in zip(vectors(response), ids):
        assert_close(got, hf_embedding(hf_model, one))
    total = sum(len(one) for one in ids)
    assert response.json()["usage"] == {"prompt_tokens": total, "total_tokens": total}


def test_token_id_inputs_match_hf(server, tokenizer, hf_model):
    ids = [tokenizer.encode(p) for p in PROMPTS[:3]]
    [single] = vectors(embed(server, input=ids[2]))
    assert_close(single, hf_embedding(hf_model, ids[2]))
    for got, one in zip(vectors(embed(server, input=ids)), ids):
        assert_close(got, hf_embedding(hf_model, one))


def test_concurrent_requests_and_cached_prefixes_match_hf(server, tokenizer, hf_model):
    """Requests arriving together share prefill batches; the repeats hit the prefix cache
    (only their last token is computed) and give the same vectors."""
    inputs = PROMPTS * 2
    with ThreadPoolExecutor(len(inputs)) as pool:
        responses = list(pool.map(lambda p: embed(server, input=p), inputs))
    for prompt, response in zip(inputs, responses):
        [got] = vectors(response)
        assert_close(got, hf_embedding(hf_model, tokenizer.encode(prompt)))


def test_base64_decodes_to_the_same_floats(server):
    """Two requests (the second may reuse the first's cached prefix: equal to rounding)."""
    floats = vectors(embed(server, input=PROMPTS[:2]))
    packed = embed(server, input=PROMPTS[:2], encoding_format="base64").json()["data"]
    for want, item in zip(floats, packed):
        got = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert got.dtype == np.float32 and np.abs(got - want).max() < 1e-6


def test_dimensions_truncate_and_renormalise(server, tokenizer, hf_model):
    [got] = vectors(embed(server, input=PROMPTS[2], dimensions=32))
    full = hf_embedding(hf_model, tokenizer.encode(PROMPTS[2]))
    want = full[:32] / np.linalg.norm(full[:32])
    assert_close(got, want)
    too_many = embed(server, input="x", dimensions=100_000)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "dimensions"


def test_openai_sdk(client, tokenizer, hf_model):
    result = client.embeddings.create(model="emb", input=PROMPTS[:2])  # the SDK asks base64
    plain = client.embeddings.create(model="emb", input=PROMPTS[:2], encoding_format="float")
    for prompt, a, b in zip(PROMPTS, result.data, plain.data):
        want = hf_embedding(hf_model, tokenizer.encode(prompt))
        assert_close(np.array(a.embedding), want)
        assert_close(np.array(b.embedding), want)
    assert result.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in PROMPTS[:2])


def test_generation_requests_are_refused(server, client):
    for path, body in [
        ("/v1/completions", {"model": "emb", "prompt": "x", "max_tokens": 2}),
        ("/v1/chat/completions",
         {"model": "emb", "messages": [{"role": "user", "content": "x"}]}),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}),
    ]:  # fmt: skip
        response = requests.post(server.base_url + path, json=body)
        assert response.status_code == 400, (path, response.text)
        assert "--is-embedding" in response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="emb", prompt="x", max_tokens=2)


def test_bad_inputs_are_400(server):
    for body in [{"input": ""}, {"input": []}, {"input": [10**9]}, {"input": "x" * 100_000}]:
        response = embed(server, **body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"].startswith("input")


def _many_long_inputs(seed: int) -> list[list[int]]:
    """400 inputs of 150 token ids: at 16 tokens a chunk, tens of seconds of prefill."""
    rng = np.random.default_rng(seed)
    return rng.integers(10, 1000, size=(400, 150)).tolist()


def _queue_drains(server, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        state = requests.get(server.base_url + "/server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == state["num_queued_reqs"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_a_client_that_goes_away_has_its_inputs_aborted(server):
    with pytest.raises(requests.Timeout):
        requests.post(server.base_url + "/v1/embeddings", timeout=0.5,
                      json={"model": "emb", "input": _many_long_inputs(0)})  # fmt: skip
    assert _queue_drains(server, within_s=5.0)


def test_an_aborted_request_is_a_400_not_a_server_error(server):
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(embed, server, input=_many_long_inputs(1), rid="to-abort")
        while not requests.get(server.base_url + "/server_info").json()["internal_states"][0][
            "num_queued_reqs"
        ]:
            time.sleep(0.05)
        requests.post(server.base_url + "/abort_request", json={"rid": "to-abort"})
        response = reply.result(timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "request_aborted"


def test_health_and_model_info(server):
    assert requests.get(server.base_url + "/health_generate").status_code == 200
    assert requests.get(server.base_url + "/model_info").json()["is_generation"] is False


def test_log_requests_logs_each_embedding_request(server):
    # --log-requests logged generation requests only: an embedding server logged none
    rid = "logged-embedding-request"
    reply = requests.post(server.base_url + "/v1/embeddings",
                          json={"model": "emb", "input": "a logged text", "rid": rid}, timeout=60)  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert any(f"request {rid}: prompt='a logged text'" in line for line in server.log().splitlines())


def test_native_encode_route(server, tokenizer, hf_model):
    # SGLang's /encode: {"text"} or {"input_ids"}, one prompt or a list; it was a 404
    one = requests.post(server.base_url + "/encode", json={"text": PROMPTS[1]}, timeout=60).json()
    ids = tokenizer.encode(PROMPTS[1])
    assert_close(np.array(one["embedding"]), hf_embedding(hf_model, ids))
    assert one["meta_info"]["prompt_tokens"] == len(ids)
    batch = requests.post(server.base_url + "/encode", json={"input_ids": [ids, ids[:3]]},
                          timeout=60).json()  # fmt: skip
    assert [len(out["embedding"]) for out in batch] == [len(one["embedding"])] * 2
    assert_close(np.array(batch[0]["embedding"]), np.array(one["embedding"]))
    assert one["meta_info"]["e2e_latency"] > 0
    named = requests.post(server.base_url + "/encode", json={"text": ["a", "b"], "rid": ["x", "y"]},
                          timeout=60).json()  # fmt: skip
    assert [out["meta_info"]["id"] for out in named] == ["x", "y"]
    for body, param in (({}, "text"), ({"text": []}, "text"), ({"input_ids": [[]]}, "input_ids"),
                        ({"text": "a", "input_ids": [1]}, "text"), ({"text": "hi " * 2000}, "text"),
                        ({"text": ["a", "b"], "rid": ["x"]}, "rid")):  # fmt: skip
        reply = requests.post(server.base_url + "/encode", json=body, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
