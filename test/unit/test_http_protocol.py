"""The limits on reading a request (entrypoints/http_protocol.py), over raw sockets
against uvicorn serving a small app with the guarded protocol."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request

from sglang.srt.entrypoints import http_protocol
from sglang.srt.entrypoints.http_protocol import GuardedHttpToolsProtocol

TIMEOUT_S = 1.5  # the read timeouts under test (60 s when serving); loaded CI machines lag


@pytest.fixture(scope="module")
def server_port():
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=GuardedHttpToolsProtocol, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch):
    monkeypatch.setattr(http_protocol, "REQUEST_HEAD_TIMEOUT_S", TIMEOUT_S)
    monkeypatch.setattr(http_protocol, "REQUEST_BODY_IDLE_TIMEOUT_S", TIMEOUT_S)


def connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    return conn


def read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def closed_within(conn: socket.socket, limit_s: float) -> float:
    start = time.monotonic()
    conn.settimeout(limit_s)
    try:
        read_all(conn)
    except TimeoutError:
        pytest.fail(f"the connection was still open after {limit_s} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_huge_header_is_refused_early(server_port):
    # one header trickled in pieces: refused once past 64 KiB (it was taken at any size,
    # in time quadratic in its size, stalling every other client)
    conn = connect(server_port)
    conn.sendall(b"GET /ok HTTP/1.1\r\nHost: a\r\nX-Big: ")
    sent = 0
    while sent < 16 * http_protocol.MAX_REQUEST_HEAD_BYTES:
        conn.sendall(b"a" * 8192)
        sent += 8192
        if select.select([conn], [], [], 0.002)[0]:  # the server answered
            break
    reply = read_all(conn)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]
    assert sent < 4 * http_protocol.MAX_REQUEST_HEAD_BYTES


def test_connections_that_send_nothing_or_part_of_a_request_are_closed(server_port):
    idle = connect(server_port)
    partial_head = connect(server_port)
    partial_head.sendall(b"GET /ok HTTP/1.1\r\nHost: a\r\n")
    partial_body = connect(server_port)
    partial_body.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
    for conn in (idle, partial_head, partial_body):
        assert closed_within(conn, 10 * TIMEOUT_S) < 10 * TIMEOUT_S


def test_requests_within_the_limits_are_served(server_port):
    # a large body in one write is not counted as head; a body that keeps coming, slower
    # than the timeout overall but never silent that long, is read whole
    conn = connect(server_port)
    body = b"x" * (4 * 1024 * 1024)
    head = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body)
    conn.sendall(head + body)
    reply = read_until(conn, b'{"bytes":4194304}')
    assert b" 200 " in reply.split(b"\r\n")[0]
    conn.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n")  # kept alive
    for piece in (b"ab", b"cd", b"ef", b"gh", b"ij", b"kl"):  # 1.8x the timeout in all
        time.sleep(TIMEOUT_S * 0.3)
        conn.sendall(piece)
    read_until(conn, b'{"bytes":12}')
    conn.close()


def read_until(conn: socket.socket, end: bytes) -> bytes:
    reply = b""
    while not reply.endswith(end):
        chunk = conn.recv(65536)
        assert chunk, reply  # closed before the answer
        reply += chunk
    return reply


def test_a_large_head_in_one_write_is_refused_and_a_pipelined_one_after_a_body_is_not(
    server_port,
):
    # a 120 KiB head sent at once was served (the size was counted on the next chunk);
    # a request pipelined right after a 300 KB body got a 431 (the body was counted)
    conn = connect(server_port)
    conn.sendall(b"GET /ok HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 120_000 + b"\r\n\r\n")
    assert read_all(conn).startswith(b"HTTP/1.1 431 ")
    conn = connect(server_port)
    body = b"x" * 300_000
    first = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body)
    second = b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n"
    conn.sendall(first + body + second[:10])
    time.sleep(0.05)
    conn.sendall(second[10:])
    read_until(conn, b'{"bytes":300000}')
    assert read_until(conn, b'{"ok":true}').startswith(b"HTTP/1.1 200 ")
    conn.close()
