"""A runtime child killed under load (issue 9): the requests in flight get an error
answer within seconds, not a hang, and the server exits non-zero leaving no process
behind. Each test kills its own server. (A dead scheduler: test_http_server_lifecycle.)
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from http_server_fixture import start_server

from sglang.srt.entrypoints.engine import hang_limit_s
from sglang.test.soak import server_processes

pytestmark = pytest.mark.slow

LONG = {"max_new_tokens": 3000, "ignore_eos": True}  # runs until the kill
ANSWER_WITHIN_S = 10.0


def _stream(base_url: str, started) -> tuple[int, list[str]]:
    """A long /generate stream: its status and its data lines (after the first)."""
    body = {"text": "Once", "stream": True, "sampling_params": LONG}
    lines = []
    with requests.post(base_url + "/generate", json=body, stream=True, timeout=120) as r:
        for line in r.iter_lines(decode_unicode=True):
            started.append(time.monotonic())
            if line.startswith("data:"):
                lines.append(line)
        return r.status_code, lines


def _blocking(base_url: str) -> int:
    """A long non-streaming request: the status it is answered with."""
    body = {"model": "default", "prompt": "def f(", "max_tokens": 3000, "ignore_eos": True}
    return requests.post(base_url + "/v1/completions", json=body, timeout=120).status_code


def test_dead_detokenizer_fails_requests_and_exits(tiny_llama_dir, tmp_path):
    # a detokenizer process (the CPU default detokenizes inline, in the launcher)
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--detokenizer-mode", "process")
    try:
        roles = server_processes(srv.proc.pid)
        tree = [p for _, p in roles]
        detok = dict(roles)["detokenizer"]
        started: list[float] = []
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(_stream, srv.base_url, started) for _ in range(2)]
            blocking = [pool.submit(_blocking, srv.base_url) for _ in range(2)]
            deadline = time.monotonic() + 60
            while len(started) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(started) >= 4, "the streams never started"
            time.sleep(0.5)  # the non-streaming requests are running too
            killed_at = time.monotonic()
            detok.kill()
            _assert_failed_answers(blocking, streams, ANSWER_WITHIN_S)
            answered_s = time.monotonic() - killed_at
        assert srv.proc.wait(timeout=30) != 0
        assert f"The detokenizer process (pid {detok.pid}) exited unexpectedly" in srv.log()
        _assert_all_gone(tree, srv.proc.pid)
        assert answered_s < ANSWER_WITHIN_S
    finally:
        srv.stop(signal.SIGKILL)


def test_frozen_scheduler_is_killed_and_fails_requests(tiny_llama_dir, tmp_path):
    # SIGSTOP freezes the scheduler mid-decode, its own watchdog thread included: the
    # launcher sees it stop stepping, kills it past --watchdog-timeout, and the
    # requests in flight get errors instead of waiting forever.
    watchdog_s = 1.0
    srv = start_server(
        tiny_llama_dir, tmp_path / "server.log", "--watchdog-timeout", str(watchdog_s)
    )
    try:
        roles = server_processes(srv.proc.pid)
        tree = [p for _, p in roles]
        scheduler = dict(roles)["scheduler"]
        started: list[list[float]] = [[], []]  # each stream's lines so far
        with ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(_stream, srv.base_url, seen) for seen in started]
            blocking = pool.submit(_blocking, srv.base_url)
            deadline = time.monotonic() + 60
            while min(map(len, started)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert min(map(len, started)) >= 2, "the streams never started"
            time.sleep(0.5)  # the non-streaming request is running too
            stopped_at = time.monotonic()
            scheduler.suspend()  # SIGSTOP
            answer_within_s = hang_limit_s(watchdog_s) + ANSWER_WITHIN_S
            _assert_failed_answers([blocking], streams, answer_within_s)
            answered_s = time.monotonic() - stopped_at
        assert srv.proc.wait(timeout=30) != 0
        assert f"The scheduler process (pid {scheduler.pid}) was killed after" in srv.log()
        _assert_all_gone(tree, srv.proc.pid)
        # not before the scheduler's own watchdog would have had its chance
        assert hang_limit_s(watchdog_s) <= answered_s < answer_within_s
    finally:
        srv.stop(signal.SIGKILL)


def _assert_failed_answers(blocking: list, streams: list, within_s: float) -> None:
    """Each non-streaming request got a 503; each stream an error event, then [DONE]."""
    for future in blocking:
        assert future.result(timeout=within_s) == 503
    for future in streams:
        status, lines = future.result(timeout=within_s)
        assert status == 200 and lines[-1] == "data: [DONE]", lines[-3:]
        assert '"error"' in lines[-2], lines[-3:]


def _assert_all_gone(tree: list[psutil.Process], pgid: int) -> None:
    """Every process of the server's tree has exited and its group is empty."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in tree if _alive(p)] + _group_members(pgid)
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"orphans left: {alive}")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass
    return members
