"""uvicorn's httptools protocol with the limits a public server needs on reading requests.

uvicorn (0.55) sets none while a request is read: a header of any size was taken
(httptools joins each piece of a header value onto the last, so a 600 MB header
took 9 minutes of the event loop, every other client stalled and /health timed
out), and a connection that sends nothing, or part of a request, was held forever
(about 20,000 of them exhausted the file descriptors). Here:

- a request's line and headers over MAX_REQUEST_HEAD_BYTES: 431, connection closed;
- its line and headers not in within REQUEST_HEAD_TIMEOUT_S of its first byte (of
  the connection's opening, for the first request): connection closed;
- its body silent for REQUEST_BODY_IDLE_TIMEOUT_S (while the server reads it):
  connection closed, which the route sees as the client leaving.

Between requests of a kept-alive connection, uvicorn's keep-alive timeout applies.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_REQUEST_HEAD_BYTES = 64 * 1024  # request line and headers (nginx: 4 x 8 KiB buffers)
REQUEST_HEAD_TIMEOUT_S = 60.0  # as nginx's client_header_timeout
REQUEST_BODY_IDLE_TIMEOUT_S = 60.0  # as nginx's client_body_timeout (between reads)

_HEAD_TOO_LARGE_BODY = (
    f"The request line and headers exceed {MAX_REQUEST_HEAD_BYTES} bytes.".encode()
)
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_HEAD_TOO_LARGE_BODY), _HEAD_TOO_LARGE_BODY)
)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a size limit on a request's head and read timeouts."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0  # bytes of chunks read while the current head was incomplete
        self._in_head = True  # reading a request line and headers
        self._in_body = False  # reading a body (headers in, message not complete)
        self._read_timer: asyncio.TimerHandle | None = None
        self._arm(REQUEST_HEAD_TIMEOUT_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            self._refuse_head()
            return
        if self._in_body:
            self._arm(REQUEST_BODY_IDLE_TIMEOUT_S)  # the body is still coming
        super().data_received(data)
        if self._in_head:  # a chunk that completes the head (and holds a body) is not counted
            self._head_bytes += len(data)

    # parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # a later request on this connection: its own deadline
            self._in_head, self._head_bytes = True, 0
            self._arm(REQUEST_HEAD_TIMEOUT_S)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._in_body = True
        self._arm(REQUEST_BODY_IDLE_TIMEOUT_S)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    # timers ----------------------------------------------------------------------------

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(delay_s, self._read_timed_out)

    def _disarm(self) -> None:
        timer = getattr(self, "_read_timer", None)
        if timer is not None:
            timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._in_body and self.flow is not None and self.flow.read_paused:
            self._arm(REQUEST_BODY_IDLE_TIMEOUT_S)  # we stopped reading, not the client
            return
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self) -> None:
        self._disarm()
        self._in_head = False
        if not self.transport.is_closing():
            self.transport.write(_HEAD_TOO_LARGE)
            self.transport.close()
