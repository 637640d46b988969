"""bench_serving against the app over a fake TokenizerManager, served by uvicorn in a thread."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import uvicorn
from openai_fake_tm import FakeTokenizerManager

from sglang import bench_serving
from sglang.srt.entrypoints.http_server import ServerStatus, create_app
from sglang.srt.runtime_context import get_context


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    with get_context().override_server_args():
        app = create_app(FakeTokenizerManager(step_delay_s=0.001))
    app.state.server.status = ServerStatus.READY
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_bench_serving_runs(base_url, backend, tmp_path, capsys):
    out_file = tmp_path / "bench.jsonl"
    argv = ["--base-url", base_url, "--backend", backend, "--num-prompts", "6",
            "--random-input-len", "8", "--random-output-len", "5", "--request-rate", "50",
            "--max-concurrency", "3", "--output-file", str(out_file)]  # fmt: skip
    assert bench_serving.main(argv) == 0
    summary = json.loads(out_file.read_text().splitlines()[-1])
    assert summary["completed"] == 6, summary["errors"]
    assert summary["total_output_tokens"] == 30
    assert summary["ttft_ms"]["mean"] > 0 and summary["itl_ms"]["p99"] > 0
    report = capsys.readouterr().out
    for name in ("Mean TTFT (ms)", "P99 ITL (ms)", "Median TPOT (ms)", "Mean E2E Latency (ms)",
                 "Output token throughput"):  # fmt: skip
        assert name in report
