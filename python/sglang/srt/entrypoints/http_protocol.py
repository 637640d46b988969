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
LINGER_S = 2.0  # after a 431, how long the rest of the request is read and dropped

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
        self._head_bytes = 0  # bytes of chunks read wholly inside the current head
        self._head_parsed = 0  # bytes of its request line and headers the parser gave us
        self._too_large = False
        self._discarding = False  # refused: what still arrives is read and dropped
        self._in_head = True  # reading a request line and headers
        self._in_body = False  # reading a body (headers in, message not complete)
        self._read_timer: asyncio.TimerHandle | None = None
        self._arm(REQUEST_HEAD_TIMEOUT_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """A head's size is known two ways: the parser's callbacks give each completed
        line (a head sent in one write), and the chunks read while it stays incomplete
        bound one huge header still arriving (the parser joins its pieces at a cost
        quadratic in its size, before any callback)."""
        if self._discarding:
            return
        if self._in_head and self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            self._refuse_head()
            return
        if self._in_body:
            self._arm(REQUEST_BODY_IDLE_TIMEOUT_S)  # the body is still coming
        head_at_start = self._in_head
        super().data_received(data)
        if head_at_start and self._in_head:  # this chunk lay wholly inside the head
            self._head_bytes += len(data)

    # parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_parsed = 0
        if not self._in_head:  # a later request on this connection: its own deadline
            self._in_head, self._head_bytes = True, 0
            self._arm(REQUEST_HEAD_TIMEOUT_S)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count_head(self, num_bytes: int) -> None:
        self._head_parsed += num_bytes
        if self._head_parsed > MAX_REQUEST_HEAD_BYTES:
            self._too_large = True
            raise ValueError("request head too large")  # the parser stops; see below

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a parser error (ours from _count_head included) with a 400."""
        if self._too_large:
            self._refuse_head()
        else:
            super().send_400_response(msg)

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
        """431, then a lingering close: the rest the client is still sending is read and
        dropped for a moment (closing with unread data sends a reset, which can destroy
        the 431 before the client reads it)."""
        self._disarm()
        self._in_head, self._in_body, self._discarding = False, False, True
        if self.transport.is_closing():
            return
        self.transport.write(_HEAD_TOO_LARGE)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._read_timer = self.loop.call_later(LINGER_S, self.transport.close)
