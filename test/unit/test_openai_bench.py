"""bench_serving against the app over a fake TokenizerManager, served by uvicorn in a thread."""

from __future__ import annotations

import asyncio
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


class _ChunkedBody:
    """An aiohttp StreamReader's iter_any() as the network may split a body: arbitrary cuts."""

    def __init__(self, body: bytes, cuts: list[int]) -> None:
        self.pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]

    async def iter_any(self):
        for piece in self.pieces:
            yield piece


def _events(body: bytes, cuts: list[int]) -> list[bytes]:
    async def collect():
        return [e async for e in bench_serving.sse_data(_ChunkedBody(body, cuts))]

    return asyncio.run(collect())


def test_sse_events_survive_any_split_of_the_body():
    big = b'{"text": "' + b"x" * (1 << 20) + b'"}'  # one event past aiohttp's line limit
    body = b'data: {"a": 1}\n\n: keep-alive\r\nevent: ping\ndata: ' + big + b"\r\n\r\ndata: [DONE]"
    want = [b'{"a": 1}', big, b"[DONE]"]  # the last line needs no newline
    assert _events(body, []) == want
    for cut in range(1, 40):  # every cut through the first events and the big one's head
        assert _events(body, [cut]) == want, cut
    assert _events(body, list(range(1, len(body), 4093))) == want


class _StreamServer:
    """An OpenAI-style streaming server that closes the connection of its first `drop`
    requests without answering (as a server that closed a kept-alive connection does),
    and streams the others' events `gap_s` apart."""

    EVENTS = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]  # fmt: skip

    def __init__(self, drop: int = 0, gap_s: float = 0.0, events: list | None = None) -> None:
        self.drop, self.gap_s, self.seen = drop, gap_s, 0
        self.events = self.EVENTS if events is None else events
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self.handle, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def handle(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))  # fmt: skip
        await reader.readexactly(length)
        self.seen += 1
        if self.seen <= self.drop:
            writer.close()
            return
        events = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in self.events]
        events.append(b"data: [DONE]\n\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(b"".join(events)))  # fmt: skip
        for event in events:
            writer.write(event)
            await writer.drain()
            await asyncio.sleep(self.gap_s)
        writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def _bench_summary(server: _StreamServer, tmp_path, *extra: str) -> dict:
    """bench_serving's summary of 3 requests, one at a time, against `server`."""
    out_file = tmp_path / "bench.jsonl"
    argv = ["--base-url", f"http://127.0.0.1:{server.port}", "--backend", "openai",
            "--model", "m", "--num-prompts", "3", "--random-input-len", "3",
            "--random-output-len", "2", "--max-concurrency", "1", "--output-file", str(out_file),
            *extra]  # fmt: skip
    try:
        bench_serving.main(argv)
    finally:
        server.stop()
    return json.loads(out_file.read_text().splitlines()[-1])


@pytest.mark.parametrize("drop, failed, resends", [(1, 0, 1), (3, 1, 2)])
def test_a_request_lost_with_its_connection_is_sent_again(drop, failed, resends, tmp_path):
    """Lost before any answer: sent again, up to the pool's size + 1 tries (2 at
    concurrency 1), then reported as failed; an answered request is never sent twice."""
    server = _StreamServer(drop=drop)
    summary = _bench_summary(server, tmp_path)
    assert (summary["failed"], summary["resends"]) == (failed, resends), summary
    assert summary["completed"] == 3 - failed and summary["total_output_tokens"] == 2 * (3 - failed)
    assert server.seen == 3 + resends  # each try reached the server once


@pytest.mark.parametrize("gap_s, completed", [(0.15, 3), (0.6, 0)])
def test_timeout_bounds_each_wait_not_the_whole_stream(gap_s, completed, tmp_path):
    """--timeout-s 0.4: a stream of events 0.15 s apart (0.6 s in all) is served; one that
    stalls 0.6 s between events fails with a timeout instead of waiting on."""
    summary = _bench_summary(_StreamServer(gap_s=gap_s), tmp_path, "--timeout-s", "0.4")
    assert summary["completed"] == completed, summary
    if not completed:
        assert "Timeout" in summary["errors"][0]


def test_a_stream_that_ends_in_an_error_event_is_a_failed_request(tmp_path):
    # a server fails a request mid-stream with `data: {"error": ...}` then [DONE]
    events = [{"choices": [{"text": "a"}]}, {"error": {"message": "boom", "code": 500}}]
    summary = _bench_summary(_StreamServer(events=events), tmp_path)
    assert (summary["completed"], summary["failed"]) == (0, 3), summary
    assert "boom" in summary["errors"][0]


@pytest.mark.parametrize("rate", ["0", "-1", "nan"])
def test_a_request_rate_that_is_not_positive_is_refused(rate, capsys):
    with pytest.raises(SystemExit) as info:
        bench_serving.parse_args(["--request-rate", rate])
    assert info.value.code == 2 and "is > 0" in capsys.readouterr().err


def test_disable_ignore_eos_reaches_both_backends():
    req = bench_serving.BenchRequest(prompt="x", prompt_len=1, output_len=4)
    for backend in ("sglang", "openai"):
        for flag, ignore in (([], True), (["--disable-ignore-eos"], False)):
            args = bench_serving.parse_args(["--backend", backend, "--model", "m", *flag])
            _, body = bench_serving.build_payload(args, req)
            sent = body["sampling_params"] if backend == "sglang" else body
            assert sent.get("ignore_eos", False) is ignore, (backend, flag)


def test_a_server_that_is_down_fails_each_request_once(tmp_path):
    """Connection refused is not a lost kept-alive connection: no request is sent again."""
    server = _StreamServer()
    server.loop.call_soon_threadsafe(server.server.close)  # the port stops accepting
    deadline = time.time() + 5
    while server.server.is_serving() and time.time() < deadline:
        time.sleep(0.01)
    summary = _bench_summary(server, tmp_path)
    assert (summary["failed"], summary["resends"]) == (3, 0), summary
    assert "ClientConnectorError" in summary["errors"][0]


def test_bench_one_batch_refuses_lengths_past_the_context():
    from sglang.bench_one_batch import BenchArgs, check_lengths

    check_lengths(BenchArgs([1], [500], [12], False, 0), 512)  # fits exactly
    with pytest.raises(ValueError, match="--input-len 600 \\+ --output-len 4 is longer"):
        check_lengths(BenchArgs([1], [128, 600], [4], False, 0), 512)


def test_bench_one_batch_refuses_a_batch_the_pool_cannot_hold():
    # an AssertionError ("out of request slots", "out of KV slots") deep in the bookkeeping
    from sglang.bench_one_batch import BenchArgs, check_fits_pool

    check_fits_pool(BenchArgs([4], [100], [28], False, 0), 512, 4)  # fits exactly
    with pytest.raises(ValueError, match="--batch-size 5 is more than the 4 request slots"):
        check_fits_pool(BenchArgs([1, 5], [8], [8], False, 0), 10_000, 4)
    with pytest.raises(ValueError, match="is more than the KV pool holds \\(512\\)"):
        check_fits_pool(BenchArgs([4], [100], [29], False, 0), 512, 4)


def _results(server: _StreamServer, backend: str = "openai") -> list:
    """bench_serving's per-request results of 3 requests, one at a time, against `server`."""
    args = bench_serving.parse_args(["--base-url", f"http://127.0.0.1:{server.port}",
                                     "--backend", backend, "--model", "m",
                                     "--max-concurrency", "1"])  # fmt: skip
    requests = [bench_serving.BenchRequest(prompt="x", prompt_len=3, output_len=4)] * 3
    try:
        return asyncio.run(bench_serving.run_benchmark(args, requests))[0]
    finally:
        server.stop()


def test_itl_counts_each_token_of_a_chunk_not_each_chunk():
    # a chunk of 3 tokens (the server merged steps, or --stream-interval 3) is 3 gaps of a
    # third of its wait, as SGLang's bench_serving splits them: it was one 3x gap
    events = [{"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
              {"choices": [{"text": "bcd"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]  # fmt: skip
    for result in _results(_StreamServer(events=events, gap_s=0.03)):
        assert result.success and result.output_len == 4
        assert len(result.itl_s) == 3 and len(set(result.itl_s)) == 1
    # a server without per-chunk usage: one token a chunk, the closing count no gap
    for result in _results(_StreamServer()):
        assert result.success and result.output_len == 2 and len(result.itl_s) == 1


def test_a_native_stream_of_ids_only_is_timed():
    # --skip-tokenizer-init streams output_ids and empty text: TTFT and ITL read 0.00
    events = [{"text": "", "output_ids": [5] * (k + 1),
               "meta_info": {"prompt_tokens": 3, "completion_tokens": k + 1,
                             "finish_reason": {"type": "length"} if k == 2 else None}}
              for k in range(3)]  # fmt: skip
    for result in _results(_StreamServer(events=events, gap_s=0.02), backend="sglang"):
        assert result.success and result.output_len == 3
        assert result.ttft_s > 0 and len(result.itl_s) == 2 and min(result.itl_s) > 0


@pytest.mark.parametrize("backend", ["openai", "sglang"])
def test_a_request_the_server_aborts_is_a_failure(backend):
    # /abort_request cut it: it was counted a success with a short output
    if backend == "openai":
        events = [{"choices": [{"text": "a", "finish_reason": None}]},
                  {"choices": [{"text": "", "finish_reason": "abort"}]}]
    else:
        events = [{"text": "a", "meta_info": {"completion_tokens": 1, "finish_reason": None}},
                  {"text": "a", "meta_info": {"completion_tokens": 1,
                                              "finish_reason": {"type": "abort"}}}]  # fmt: skip
    for result in _results(_StreamServer(events=events), backend=backend):
        assert not result.success and "aborted by the server" in result.error


def test_the_output_file_is_json_without_the_api_key(tmp_path):
    summary = _bench_summary(_StreamServer(), tmp_path, "--api-key", "sk-secret")
    text = (tmp_path / "bench.jsonl").read_text()
    assert "sk-secret" not in text and summary["args"]["api_key"] == "<set>"
    assert summary["args"]["request_rate"] == "inf"  # not a bare Infinity (not JSON)
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


def test_no_arrival_wait_follows_the_last_request():
    # at 0.001 req/s a wait is ~1,000 s: the run's duration counted one after the last
    gen = bench_serving._arrivals([1], 0.001, seed=1)
    assert asyncio.run(asyncio.wait_for(_collect(gen), 5)) == [1]


async def _collect(gen) -> list:
    return [item async for item in gen]


def test_no_server_to_name_the_model_is_one_line_not_a_traceback(capsys):
    argv = ["--base-url", f"http://127.0.0.1:{_free_port()}", "--backend", "openai"]
    assert bench_serving.main(argv) == 2
    assert "cannot read the model name" in capsys.readouterr().err
