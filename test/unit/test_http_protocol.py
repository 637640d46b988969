"""The limits on reading a request (entrypoints/http_protocol.py), over raw sockets
against uvicorn serving a small app with the guarded protocol."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request

from sglang.srt.entrypoints import http_protocol
from sglang.srt.entrypoints.http_protocol import GuardedHttpToolsProtocol

TIMEOUT_S = 0.5  # the read timeouts under test (60 s when serving)


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
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def closed_within(conn: socket.socket, limit_s: float) -> float:
    start = time.monotonic()
    conn.settimeout(limit_s)
    try:
        read_all(conn)
    except (TimeoutError, socket.timeout):
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
    try:
        while sent < 16 * http_protocol.MAX_REQUEST_HEAD_BYTES:
            conn.sendall(b"a" * 8192)
            sent += 8192
            time.sleep(0.001)
    except (BrokenPipeError, ConnectionResetError):
        pass
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
    conn.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n")  # kept alive
    for piece in (b"ab", b"cd", b"ef"):
        time.sleep(TIMEOUT_S * 0.6)
        conn.sendall(piece)
    read_until(conn, b'{"bytes":6}')
    conn.close()


def read_until(conn: socket.socket, end: bytes) -> bytes:
    reply = b""
    while not reply.endswith(end):
        chunk = conn.recv(65536)
        assert chunk, reply  # closed before the answer
        reply += chunk
    return reply
