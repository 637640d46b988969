"""A real `python -m sglang.launch_server --device cuda` on the bundled demo model (needs
CUDA): greedy tokens equal HF transformers' on the same GPU, the OpenAI routes stream, a
bad request is a 400 and the server keeps serving.

float32 with the triton backend and CUDA graphs: every matmul is full fp32 on both sides
(torch's default, and the kernels' `input_precision="ieee"`), so on a trained model the
greedy tokens are equal, not merely close.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import requests
import torch
from transformers import AutoTokenizer

from sglang.demo_models import demo_target_path
from sglang.test.hf_reference import load_hf_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "srt"))
from http_server_fixture import start_server  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "The module provides"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("gpu-server") / "server.log"
    srv = start_server(demo_target_path(), log_path, "--device", "cuda", "--dtype", "float32",
                       "--attention-backend", "triton", "--cuda-graph-max-bs", "8",
                       "--served-model-name", "demo")  # fmt: skip
    yield srv
    srv.stop()


def post(server, route: str, body: dict) -> requests.Response:
    return requests.post(server.base_url + route, json=body, timeout=120)


@torch.inference_mode()
def hf_greedy_cuda(prompt_ids: list[int]) -> list[int]:
    model = load_hf_model(str(demo_target_path()), torch.float32).cuda()
    out = model.generate(
        torch.tensor([prompt_ids], device="cuda"),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.int64, device="cuda"),
        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
    )  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


def test_server_runs_on_cuda_with_graphs(server):
    info = requests.get(server.base_url + "/server_info", timeout=30).json()
    assert info.get("device") == "cuda", info
    assert info.get("attention_backend") == "triton", info
    assert not info.get("disable_cuda_graph"), info


def test_greedy_tokens_equal_hf_on_the_gpu(server):
    tokenizer = AutoTokenizer.from_pretrained(demo_target_path())
    greedy = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    for text in PROMPTS:
        ids = tokenizer(text)["input_ids"]
        ours = post(server, "/generate", {"input_ids": ids, "sampling_params": greedy})
        assert ours.status_code == 200, ours.text
        assert ours.json()["output_ids"] == hf_greedy_cuda(ids), text


def test_chat_stream_equals_non_stream(server):
    body = {"model": "demo", "messages": [{"role": "user", "content": "def add(a, b):"}],
            "max_tokens": 12, "temperature": 0}  # fmt: skip
    full = post(server, "/v1/chat/completions", body)
    assert full.status_code == 200, full.text
    text = full.json()["choices"][0]["message"]["content"]
    with requests.post(server.base_url + "/v1/chat/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as r:  # fmt: skip
        lines = [line for line in r.iter_lines() if line.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    assert streamed == text


def test_bad_request_is_400_and_server_keeps_serving(server):
    bad = post(server, "/v1/completions", {"model": "demo", "prompt": "hi", "temperature": -1})
    assert bad.status_code == 400 and "error" in bad.json(), bad.text
    malformed = requests.post(server.base_url + "/v1/completions", data=b"{oops", timeout=30)
    assert malformed.status_code == 400
    ok = post(server, "/v1/completions", {"model": "demo", "prompt": "def", "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
