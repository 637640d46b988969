"""A KV pool smaller than the context (--max-total-tokens): a request is sized to the
pool up front, as SGLang does. It finishes with `length` where the pool ends instead
of filling it and being aborted ("The KV cache is too small")."""

from __future__ import annotations

import pytest
import requests
from http_server_fixture import start_server

pytestmark = pytest.mark.slow

POOL = 128  # tokens of KV; the context (512) is larger
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("small-pool-server")
    srv = start_server(tiny_llama_dir, workdir / "server.log", "--max-total-tokens", str(POOL),
                       "--context-length", "512", "--served-model-name", "m")  # fmt: skip
    yield srv
    srv.stop()


def generate(server, input_ids: list[int], **params) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {**GREEDY, **params}}
    response = requests.post(server.base_url + "/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


@pytest.mark.parametrize("params", [{"max_new_tokens": 300}, {}])  # set, or the default 128
def test_max_new_tokens_is_cut_to_the_pool(server, params):
    meta = generate(server, [(13 * i) % 900 + 20 for i in range(100)], **params)
    assert meta["finish_reason"]["type"] == "length"
    assert meta["prompt_tokens"] + meta["completion_tokens"] == POOL


def test_a_completion_ends_with_length_not_abort(server):
    body = {"model": "m", "prompt": [(7 * i) % 900 + 20 for i in range(10)], "max_tokens": 400,
            **GREEDY}  # fmt: skip
    response = requests.post(server.base_url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == "length"
    assert response.json()["usage"]["total_tokens"] == POOL
