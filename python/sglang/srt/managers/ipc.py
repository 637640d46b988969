"""ZeroMQ plumbing: IPC names per launch and typed PUSH/PULL endpoints.

Topology (each arrow is one PUSH -> PULL; the receiver binds):

    TokenizerManager --(scheduler_input)--> Scheduler
    Scheduler --(detokenizer)--> Detokenizer --(tokenizer)--> TokenizerManager
    Scheduler --(tokenizer)--> TokenizerManager      (control replies)

One codec (pickle) for every message.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio


@dataclass(frozen=True)
class PortArgs:
    """IPC endpoint names of one launch; unique so several Engines coexist."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    # torch.distributed rendezvous of the TP ranks (unused with tp_size 1)
    dist_init_method: str = ""

    @staticmethod
    def init_new(dist_init_addr: str | None = None) -> PortArgs:
        tag = f"sglang-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        base = os.path.join(tempfile.gettempdir(), tag)
        addr = dist_init_addr or f"127.0.0.1:{free_tcp_port()}"
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{base}-tok",
            scheduler_input_ipc_name=f"ipc://{base}-sched",
            detokenizer_ipc_name=f"ipc://{base}-detok",
            dist_init_method=f"tcp://{addr}",
        )

    def ipc_paths(self) -> list[str]:
        names = [self.tokenizer_ipc_name, self.scheduler_input_ipc_name, self.detokenizer_ipc_name]
        return [n[len("ipc://") :] for n in names if n.startswith("ipc://")]

    def cleanup(self) -> None:
        for path in self.ipc_paths():
            try:
                os.unlink(path)
            except OSError:
                pass


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
        return decode(self.socket.recv(copy=False).bytes)

    def recv_all_nowait(self) -> list[Any]:
        out = []
        while True:
            try:
                data = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            out.append(decode(data.bytes))

    def close(self) -> None:
        self.socket.close(linger=0)


class AsyncPullEndpoint:
    """Receiving side for an asyncio loop (binds)."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.bind(address)

    async def recv(self) -> Any:
        return decode(await self.socket.recv())

    def close(self) -> None:
        self.socket.close(linger=0)
