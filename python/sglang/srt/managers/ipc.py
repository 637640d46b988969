"""ZeroMQ plumbing: IPC names per launch and typed PUSH/PULL endpoints.

Topology (each arrow is one PUSH -> PULL; the receiver binds):

    TokenizerManager --(scheduler_input)--> Scheduler
    Scheduler --(detokenizer)--> Detokenizer --(tokenizer)--> TokenizerManager
    Scheduler --(tokenizer)--> TokenizerManager      (control replies)

With detokenizer_mode inline the detokenizer name is the tokenizer's: the
Scheduler's outputs go straight to the TokenizerManager, which detokenizes.

With dp_size > 1 the DP controller binds scheduler_input instead, and:

    DP controller --(dp_scheduler_input[d])--> Scheduler of DP rank d
    Scheduler of each DP rank --(load_report)--> DP controller

One codec (pickle) for every message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import socket
import tempfile
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq


@dataclass(frozen=True)
class PortArgs:
    """IPC endpoint names of one launch; unique so several Engines coexist."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    # torch.distributed rendezvous of the TP ranks (unused with tp_size 1)
    dist_init_method: str = ""
    # dp_size > 1: each DP rank's scheduler input and TP rendezvous, and the
    # controller's load-report queue (empty with dp_size 1)
    dp_scheduler_input_ipc_names: tuple[str, ...] = ()
    dp_dist_init_methods: tuple[str, ...] = ()
    load_report_ipc_name: str = ""
    # the DP rank a scheduler's copy is for (see for_dp_rank)
    dp_rank: int = 0

    @staticmethod
    def init_new(
        dist_init_addr: str | None = None, dp_size: int = 1, inline_detokenizer: bool = False
    ) -> PortArgs:
        """`inline_detokenizer`: the schedulers' output queue is the TokenizerManager's
        (detokenizer_mode inline: no detokenizer process between them)."""
        tag = f"sglang-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        base = os.path.join(tempfile.gettempdir(), tag)
        inits = _dist_init_methods(dist_init_addr, dp_size)
        dp = {}
        if dp_size > 1:
            dp = dict(
                dp_scheduler_input_ipc_names=tuple(
                    f"ipc://{base}-sched-dp{d}" for d in range(dp_size)
                ),
                dp_dist_init_methods=tuple(inits),
                load_report_ipc_name=f"ipc://{base}-load",
            )
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{base}-tok",
            scheduler_input_ipc_name=f"ipc://{base}-sched",
            detokenizer_ipc_name=f"ipc://{base}-{'tok' if inline_detokenizer else 'detok'}",
            dist_init_method=inits[0],
            **dp,
        )

    def for_dp_rank(self, dp_rank: int) -> PortArgs:
        """The names DP rank `dp_rank`'s schedulers use: its own input queue (the
        controller pushes there) and its own TP rendezvous; itself with dp_size 1."""
        if not self.dp_scheduler_input_ipc_names:
            return self
        return dataclasses.replace(
            self,
            scheduler_input_ipc_name=self.dp_scheduler_input_ipc_names[dp_rank],
            dist_init_method=self.dp_dist_init_methods[dp_rank],
            dp_rank=dp_rank,
        )

    def ipc_paths(self) -> list[str]:
        names = [self.tokenizer_ipc_name, self.scheduler_input_ipc_name, self.detokenizer_ipc_name]
        names += [*self.dp_scheduler_input_ipc_names, self.load_report_ipc_name]
        return [n[len("ipc://") :] for n in names if n.startswith("ipc://")]

    def cleanup(self) -> None:
        for path in self.ipc_paths():
            try:
                os.unlink(path)
            except OSError:
                pass


def _dist_init_methods(dist_init_addr: str | None, dp_size: int) -> list[str]:
    """One TP rendezvous per DP rank: `host:port + d` when an address is given."""
    if dist_init_addr is None:
        return [f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(dp_size)]
    host, _, port = dist_init_addr.rpartition(":")
    return [f"tcp://{host}:{int(port) + d}" for d in range(dp_size)]


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def encode(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)


class PushEndpoint:
    """Sending side of a PUSH -> PULL queue (connects; never blocks on close)."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.address = address
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        # No high-water mark: a send never blocks (the HTTP event loop sends here);
        # what is queued is bounded by the requests in flight, which admission caps.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.connect(address)

    def send(self, obj: Any) -> None:
        self.socket.send(encode(obj), copy=False)

    def send_encoded(self, data: Any) -> None:
        """Forward a message as received (bytes or a zmq Frame), without re-encoding."""
        self.socket.send(data, copy=False)

    def close(self) -> None:
        self.socket.close(linger=0)


class PullEndpoint:
    """Receiving side (binds)."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.address = address
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.bind(address)

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """One message, or None when nothing arrived within `timeout_ms`."""
        if timeout_ms is not None and not self.socket.poll(timeout_ms):
            return None
        # copy=True: for messages this small a bytes copy is cheaper than a zmq Frame
        return decode(self.socket.recv())

    def recv_all_nowait(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(decode(self.socket.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return out

    def recv_frames_nowait(self) -> list[zmq.Frame]:
        """Every message queued now, still encoded."""
        out = []
        while True:
            try:
                out.append(self.socket.recv(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                return out

    def close(self) -> None:
        self.socket.close(linger=0)


class AsyncPullEndpoint:
    """Receiving side for an asyncio loop (binds).

    A plain socket whose file descriptor the running loop watches: each wake-up
    drains every queued message into `_ready`, so a message costs no zmq.asyncio
    future or poll (receiver CPU per small message 119 -> 56 us, RESULTS.md
    "Per-token server overhead at concurrency 1"). The loop is the one of the
    first `recv`; `recv` is called from one task at a time.
    """

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.address = address
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.bind(address)
        self._fd = self.socket.getsockopt(zmq.FD)
        self._ready: deque[bytes] = deque()  # received, not yet decoded
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def recv(self) -> Any:
        while not self._ready:
            self._watch(asyncio.get_running_loop())
            self._drain()  # what arrived before the watch (zmq's FD is edge-triggered)
            if self._ready:
                break
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return decode(self._ready.popleft())

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop:
            return
        self._unwatch()
        loop.add_reader(self._fd, self._drain)
        self._loop = loop

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)

    def _drain(self) -> None:
        # The FD signals only a change: read until zmq reports no message pending.
        while self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._ready.append(self.socket.recv(zmq.NOBLOCK))
        waiter = self._waiter
        if self._ready and waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self._unwatch()
        self.socket.close(linger=0)
