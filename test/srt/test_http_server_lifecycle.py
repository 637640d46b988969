"""End to end: readiness, API key, weight reload readback, SIGTERM and a dead scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import openai
import psutil
import pytest
import requests
from http_server_fixture import SMALL_SERVER_FLAGS, free_port, start_server

from sglang.test.make_tiny_model import make_tiny_model

pytestmark = pytest.mark.slow
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}


TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lifecycle-server")
    template = workdir / "template.jinja"
    template.write_text(TEMPLATE)
    srv = start_server(tiny_llama_dir, workdir / "server.log", "--api-key", KEY,
                       "--log-level", "info", "--chat-template", str(template))  # fmt: skip
    yield srv
    srv.stop()


def greedy(server, prompt: str = "The answer is") -> str:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    return requests.post(server.base_url + "/generate", json=body, headers=AUTH).json()["text"]


def test_ready_line_logged(server):
    assert f"ready to roll! URL: {server.base_url}" in server.log()


def test_api_key_required_except_health(server):
    assert requests.get(server.base_url + "/health").status_code == 200
    missing = requests.get(server.base_url + "/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    model = right.models.list().data[0].id
    reply = right.completions.create(model=model, prompt="hi", max_tokens=2)
    assert reply.usage.completion_tokens == 2


def test_chat_template_file(server, tiny_llama_dir):
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "Hi there"}]
    reply = client.chat.completions.create(model=client.models.list().data[0].id,
                                           messages=messages, max_tokens=8, temperature=0)  # fmt: skip
    ids = AutoTokenizer.from_pretrained(tiny_llama_dir).encode(
        "user: Hi there\nassistant:", add_special_tokens=False
    )
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    native = requests.post(server.base_url + "/generate", json=body, headers=AUTH).json()
    assert reply.choices[0].message.content == native["text"]
    assert reply.usage.prompt_tokens == len(ids)


def test_update_weights_readback(server, tiny_llama_dir, tmp_path):
    before = greedy(server)
    other = make_tiny_model("llama", tmp_path / "other", seed=1)
    response = requests.post(server.base_url + "/update_weights_from_disk", headers=AUTH,
                             json={"model_path": str(other)})  # fmt: skip
    assert response.status_code == 200 and response.json()["success"] is True
    assert greedy(server) != before
    model_info = requests.get(server.base_url + "/model_info", headers=AUTH).json()
    assert model_info["model_path"] == str(other)
    info = requests.get(server.base_url + "/server_info", headers=AUTH).json()
    assert info["model_path"] == str(other)  # the TokenizerManager's record
    assert info["internal_states"][0]["model_path"] == str(other)  # the scheduler's override
    bad = requests.post(server.base_url + "/update_weights_from_disk", headers=AUTH,
                        json={"model_path": str(tmp_path / "missing")})  # fmt: skip
    assert bad.status_code == 400 and "error" in bad.json()
    requests.post(server.base_url + "/update_weights_from_disk", headers=AUTH,
                  json={"model_path": str(tiny_llama_dir)})  # fmt: skip
    assert greedy(server) == before


def _stream_until(server, body: dict, started: threading.Event, out: list) -> None:
    """Stream /generate `body`, setting `started` at the first chunk; the chunks go to `out`."""
    with requests.post(server.base_url + "/generate", json={**body, "stream": True},
                       headers=AUTH, stream=True, timeout=120) as r:  # fmt: skip
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data: {"):
                out.append(json.loads(line[len("data: "):]))
                started.set()


def _long_streams(server, count: int) -> tuple[list[threading.Thread], list[list]]:
    body = {"text": "Once", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    events = [threading.Event() for _ in range(count)]
    chunks: list[list] = [[] for _ in range(count)]
    threads = [threading.Thread(target=_stream_until, args=(server, body, e, c), daemon=True)
               for e, c in zip(events, chunks)]  # fmt: skip
    for thread in threads:
        thread.start()
    assert all(e.wait(60) for e in events)
    return threads, chunks


def test_abort_all_ends_every_request_with_abort(server):
    threads, chunks = _long_streams(server, 2)
    reply = requests.post(server.base_url + "/abort_request", headers=AUTH,
                          json={"abort_all": True})  # fmt: skip
    assert reply.status_code == 200
    assert reply.json()["success"] is True and reply.json()["num_aborted"] == 2
    for thread in threads:
        thread.join(timeout=60)
    for stream in chunks:
        assert stream[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    # a rid is needed without abort_all; unknown fields are refused, not dropped
    for body in ({}, {"rid": "x", "abort_everything": True}):
        bad = requests.post(server.base_url + "/abort_request", headers=AUTH, json=body)
        assert bad.status_code == 400, body


def test_update_weights_with_abort_all_requests(server, tiny_llama_dir):
    threads, chunks = _long_streams(server, 1)
    url = server.base_url + "/update_weights_from_disk"
    body = {"model_path": str(tiny_llama_dir)}
    busy = requests.post(url, headers=AUTH, json=body)  # refused while a request runs
    assert busy.status_code == 400 and "in flight" in busy.json()["error"]["message"]
    done = requests.post(url, headers=AUTH, json={**body, "abort_all_requests": True})
    assert done.status_code == 200 and done.json()["success"] is True
    threads[0].join(timeout=60)
    assert chunks[0][-1]["meta_info"]["finish_reason"]["type"] == "abort"
    keep = requests.post(url, headers=AUTH, json={**body, "flush_cache": False})
    assert keep.status_code == 400 and keep.json()["error"]["param"] == "flush_cache"
    unknown = requests.post(url, headers=AUTH, json={**body, "weight_version": "v2"})
    assert unknown.status_code == 400 and "weight_version" in unknown.text


def test_update_weights_with_abort_all_under_steady_traffic(server, tiny_llama_dir):
    """New requests keep coming (one every 10 ms, none waiting for another): the update
    aborts those in flight, holds the new ones until it is done, then serves them; it
    used to wait for a moment with no request in flight and was refused after 30 s."""
    stop, statuses, threads = threading.Event(), [], []
    body = {"text": "Once", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}

    def one() -> None:
        r = requests.post(server.base_url + "/generate", json=body, headers=AUTH, timeout=120)
        statuses.append((r.status_code, r.json()["meta_info"]["finish_reason"]["type"]))

    def traffic() -> None:
        while not stop.wait(0.01):
            thread = threading.Thread(target=one, daemon=True)
            thread.start()
            threads.append(thread)

    feeder = threading.Thread(target=traffic, daemon=True)
    feeder.start()
    time.sleep(0.5)
    url = server.base_url + "/update_weights_from_disk"
    done = requests.post(url, headers=AUTH, timeout=120,
                         json={"model_path": str(tiny_llama_dir), "abort_all_requests": True})  # fmt: skip
    time.sleep(0.5)
    stop.set()
    feeder.join()
    for thread in list(threads):
        thread.join(timeout=120)
    assert done.status_code == 200 and done.json()["success"] is True, done.text
    assert all(code == 200 for code, _ in statuses), statuses
    assert {"abort", "length"} <= {reason for _, reason in statuses}


def _group_alive(pgid: int) -> bool:
    return any(_pgid(p) == pgid for p in psutil.process_iter())


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_sigterm_stops_everything_and_exits_zero(server):
    """Runs last in this module: it stops the module's server."""
    body = {"text": "Once", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
    started = threading.Event()

    def stream() -> None:
        try:
            with requests.post(server.base_url + "/generate", json=body, headers=AUTH,
                               stream=True, timeout=120) as r:  # fmt: skip
                for _ in r.iter_lines():
                    started.set()
        except requests.RequestException:
            pass

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert started.wait(60)
    begin = time.time()
    assert server.stop(signal.SIGTERM, timeout_s=60) == 0
    assert time.time() - begin < 30
    thread.join(timeout=10)
    deadline = time.time() + 10
    while _group_alive(server.proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group_alive(server.proc.pid)


@pytest.mark.parametrize(
    "signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT], [signal.SIGHUP]]
)  # SIGHUP (the terminal closed) killed the launcher at once: streams cut, no error event
def test_sigterm_gives_requests_past_the_grace_an_error_not_a_cut(tiny_llama_dir, tmp_path,
                                                                   signals):  # fmt: skip
    """A stream still running when the shutdown grace ends gets an error event and
    [DONE] (it was cut mid-body, with a traceback per request); a blocking one a 503.
    A second Ctrl-C (uvicorn's forced exit) too: it gave a 500 ("Socket operation on
    non-socket") and cut streams."""
    env = {"SGLANG_GRACEFUL_SHUTDOWN_TIMEOUT": "2", "SGLANG_FAULT_INJECT": "stall:slow"}
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", env=env)
    body = {"text": "Once", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    results: dict[str, object] = {}
    started = threading.Event()

    def stream() -> None:
        with requests.post(srv.base_url + "/generate", json={**body, "stream": True,
                           "rid": "slow-stream"}, stream=True, timeout=60) as r:  # fmt: skip
            lines = []
            for line in r.iter_lines(decode_unicode=True):
                started.set()
                lines.append(line)
            results["stream"] = [line for line in lines if line]

    def blocking() -> None:
        r = requests.post(srv.base_url + "/generate", json={**body, "rid": "slow-block"}, timeout=60)
        results["blocking"] = r.status_code

    try:
        threads = [threading.Thread(target=f, daemon=True) for f in (stream, blocking)]
        for thread in threads:
            thread.start()
        assert started.wait(60)
        time.sleep(0.3)
        for sig in signals[:-1]:
            srv.proc.send_signal(sig)
            time.sleep(0.3)
        assert srv.stop(signals[-1], timeout_s=30) == 0
        for thread in threads:
            thread.join(timeout=10)
        lines = results["stream"]
        assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2], lines[-3:]
        assert "shut down before this request finished" in lines[-2]
        assert results["blocking"] == 503
        assert "Exception in ASGI application" not in srv.log()
    finally:
        srv.stop(signal.SIGKILL)


def test_dead_scheduler_makes_health_503_and_exits(tiny_llama_dir, tmp_path):
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--skip-server-warmup")
    try:
        scheduler = max(_spawned_children(srv.proc.pid), key=lambda p: p.memory_info().rss)
        scheduler.kill()
        seen_503 = False
        deadline = time.time() + 30
        while srv.proc.poll() is None and time.time() < deadline:
            try:
                seen_503 |= requests.get(srv.base_url + "/health", timeout=1).status_code == 503
            except requests.RequestException:
                pass
            time.sleep(0.1)
        assert seen_503
        assert srv.proc.wait(timeout=30) != 0
    finally:
        srv.stop(signal.SIGKILL)


def _spawned_children(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if "spawn_main" in " ".join(_cmdline(p))]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def test_ctrl_c_to_the_process_group_stops_quietly(tiny_llama_dir, tmp_path):
    """A terminal's Ctrl-C signals every process of the group: the launcher shuts the
    server down and exits 0; no child unwinds with a traceback or is reported dead."""
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--skip-server-warmup")
    try:
        os.killpg(srv.proc.pid, signal.SIGINT)
        assert srv.proc.wait(timeout=60) == 0
        log = srv.log()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log
        assert "ERROR" not in log and "exited unexpectedly" not in log
    finally:
        srv.stop(signal.SIGKILL)


def test_sigterm_during_startup_exits_zero(tiny_llama_dir, tmp_path):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_llama_dir),
           "--port", str(free_port()), *SMALL_SERVER_FLAGS]  # fmt: skip
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not _spawned_children(proc.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert _spawned_children(proc.pid), "the runtime's children never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        deadline = time.time() + 10
        while _group_alive(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
