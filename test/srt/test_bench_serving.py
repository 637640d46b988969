"""bench_serving against a real server, with both backends."""

from __future__ import annotations

import json

import pytest
from http_server_fixture import start_server

from sglang import bench_serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("bench-server") / "server.log"
    srv = start_server(tiny_llama_dir, log_path)
    yield srv
    srv.stop()


@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_bench_serving(server, backend, tmp_path, capsys):
    out_file = tmp_path / "bench.jsonl"
    argv = ["--base-url", server.base_url, "--backend", backend, "--dataset-name", "random",
            "--num-prompts", "8", "--random-input-len", "16", "--random-output-len", "4",
            "--request-rate", "20", "--max-concurrency", "4", "--output-file", str(out_file)]  # fmt: skip
    assert bench_serving.main(argv) == 0
    summary = json.loads(out_file.read_text().splitlines()[-1])
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 32
    if backend == "sglang":  # the server's tokenizer gives exact prompt lengths
        assert summary["total_input_tokens"] == 8 * 16
    report = capsys.readouterr().out
    assert "Mean TTFT (ms)" in report and "P99 E2E Latency (ms)" in report
