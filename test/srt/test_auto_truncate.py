"""--allow-auto-truncate (SGLang's flag) on a live server: a prompt longer than the
context keeps its first tokens that fit and max_new_tokens shrinks to the room left,
on every route, instead of a 400; usage counts the tokens kept."""

from __future__ import annotations

import pytest
import requests
from http_server_fixture import start_server

pytestmark = pytest.mark.slow

CONTEXT = 64
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("auto-truncate-server")
    srv = start_server(tiny_llama_dir, workdir / "server.log", "--allow-auto-truncate",
                       "--served-model-name", "m", "--context-length", str(CONTEXT))  # fmt: skip
    yield srv
    srv.stop()


def generate(server, input_ids: list[int], max_new_tokens: int) -> dict:
    params = {**GREEDY, "max_new_tokens": max_new_tokens}
    body = {"input_ids": input_ids, "sampling_params": params}
    response = requests.post(server.base_url + "/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_long_prompt_keeps_its_head_and_the_room_left(server):
    prompt = [(31 * i) % 900 + 20 for i in range(100)]
    cut = generate(server, prompt, 10)
    assert cut["meta_info"]["prompt_tokens"] == CONTEXT - 1
    assert cut["meta_info"]["completion_tokens"] == 1  # the context's last slot
    head = generate(server, prompt[: CONTEXT - 1], 1)
    assert cut["output_ids"] == head["output_ids"]


def test_max_new_tokens_shrinks_to_the_room_left(server):
    body = {"model": "m", "prompt": [(7 * i) % 900 + 20 for i in range(40)], "max_tokens": 50,
            **GREEDY}  # fmt: skip
    response = requests.post(server.base_url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == CONTEXT - 40


def test_chat_and_a_huge_text_are_cut_not_refused(server):
    words = "hello world " * 200_000  # 2.4 MB: cut by characters before tokenizing
    body = {"model": "m", "messages": [{"role": "user", "content": words}], **GREEDY}
    response = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == CONTEXT - 1 and usage["completion_tokens"] == 1
    body = {"text": words, "sampling_params": {**GREEDY, "max_new_tokens": 4}}
    response = requests.post(server.base_url + "/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["prompt_tokens"] == CONTEXT - 1
