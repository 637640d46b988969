"""The link between node 0 and a node k > 0 that runs whole DP groups (`--dp-size > 1
--nnodes > 1`): two ZMQ TCP sockets, both bound on node 0 at ports derived from
`--dist-init-addr` (`arg_groups/parallel.node_link_ports`), connected from node k.

    node 0, DP controller --down--> node k, launcher
        [b"r<dp_rank>", request or control message] | [b"hb"]
    node 0, DP controller <--up---- node k, launcher
        [b"detok" | b"tok" | b"load", message] | [b"ready", {dp_rank: ready info}] | [b"hb"]

Messages travel as received (never re-encoded), tagged with where they go. Within a
node everything stays ipc:// as with one node: on node k the launcher binds the
queues its schedulers push to (as the detokenizer, TokenizerManager and controller
do on node 0) and relays between them and the link (`WorkerNodeLink`); on node 0
the DP controller is the link's end (`RemoteNode`) and pushes what arrives to the
detokenizer and the TokenizerManager.

Liveness: each end sends a heartbeat every HEARTBEAT_INTERVAL_S. An end raises
NodeLost when its peer's connection drops (ZMQ's disconnect event: a killed process
closes its TCP connections) or, once it has heard the peer, when nothing arrives for
NODE_SILENT_AFTER_S (a node cut off the network). A dropped connection is a lost node,
never reconnected: what was queued on it is gone.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from sglang.srt.arg_groups.parallel import node_link_ports
from sglang.srt.managers.ipc import PullEndpoint, PushEndpoint, decode, encode

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 0.5
NODE_SILENT_AFTER_S = 5.0

TAG_HEARTBEAT = b"hb"
TAG_READY = b"ready"
TAG_DETOKENIZER = b"detok"
TAG_TOKENIZER = b"tok"
TAG_LOAD_REPORT = b"load"


class NodeLost(RuntimeError):
    """The node at the other end of a link is gone (disconnected or silent)."""


def split_dist_init_addr(dist_init_addr: str) -> tuple[str, int]:
    host, _, port = dist_init_addr.rpartition(":")
    return host, int(port)


def dp_rank_tag(dp_rank: int) -> bytes:
    return b"r%d" % dp_rank


def dp_rank_of_tag(tag: bytes) -> int:
    return int(tag[1:])


class _LinkSender:
    """The PUSH side of a link: never blocks. A message that cannot go yet (node 0's
    bound socket before node k connects) waits, in order, for the next flush."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.pending: deque[list[Any]] = deque()

    def send(self, tag: bytes, payload: Any) -> None:
        self.pending.append([tag, payload])
        self.flush()

    def send_heartbeat(self) -> None:
        if self.pending:
            return  # the peer is not connected yet; nothing to prove
        try:
            self.socket.send(TAG_HEARTBEAT, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def flush(self) -> None:
        while self.pending:
            try:
                self.socket.send_multipart(self.pending[0], zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.pending.popleft()


class _LinkEnd:
    """What both ends share: the two TCP sockets, heartbeats and the loss checks."""

    def __init__(self, ctx: zmq.Context, peer: str, down: zmq.Socket, up: zmq.Socket) -> None:
        self.peer = peer
        self._ctx = ctx
        self._sockets = [down, up]
        self._monitors = [s.get_monitor_socket(zmq.EVENT_DISCONNECTED) for s in self._sockets]
        self.last_heard_s: float | None = None
        self._last_heartbeat_s = 0.0
        self.closed = False

    @property
    def monitors(self) -> list[zmq.Socket]:
        return self._monitors

    def heard(self) -> None:
        self.last_heard_s = time.monotonic()

    def _check_alive(self, sender: _LinkSender) -> None:
        """Send a heartbeat when due; raise NodeLost if the peer dropped or went silent."""
        now_s = time.monotonic()
        if now_s - self._last_heartbeat_s >= HEARTBEAT_INTERVAL_S:
            sender.send_heartbeat()
            self._last_heartbeat_s = now_s
        sender.flush()
        self.check_connected()
        if self.last_heard_s is not None and now_s - self.last_heard_s > NODE_SILENT_AFTER_S:
            raise NodeLost(f"{self.peer}: nothing heard for {now_s - self.last_heard_s:.1f} s")

    def check_connected(self) -> None:
        """NodeLost if a connection to the peer dropped (a connection not yet made is
        not a drop: node k may start before node 0)."""
        for monitor in self._monitors:
            if monitor.poll(0):
                event = parse_monitor_message(monitor.recv_multipart())
                raise NodeLost(f"{self.peer}: connection dropped ({event['endpoint']})")

    def recv_tagged_nowait(self, socket: zmq.Socket) -> list[tuple[bytes, Any]]:
        """(tag, payload frame or None) of every message queued now; heartbeats dropped."""
        out = []
        while True:
            try:
                parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            self.heard()
            tag = parts[0].bytes
            if tag != TAG_HEARTBEAT:
                out.append((tag, parts[1] if len(parts) > 1 else None))

    def close(self) -> None:
        """Close the link's sockets; idempotent."""
        if self.closed:
            return
        self.closed = True
        for socket in self._sockets:
            socket.disable_monitor()
        for socket in self._monitors + self._sockets:
            socket.close(linger=0)


def _socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    socket = ctx.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, 0)
    return socket


class RemoteNode(_LinkEnd):
    """Node 0's end of the link to node `node_rank` (runs in the DP controller)."""

    def __init__(self, ctx: zmq.Context, dist_init_addr: str, node_rank: int) -> None:
        host, dist_port = split_dist_init_addr(dist_init_addr)
        down_port, up_port = node_link_ports(dist_port, node_rank)
        down, up = _socket(ctx, zmq.PUSH), _socket(ctx, zmq.PULL)
        down.bind(f"tcp://{host}:{down_port}")
        up.bind(f"tcp://{host}:{up_port}")
        super().__init__(ctx, f"node {node_rank}", down, up)
        self.node_rank = node_rank
        self.up_socket = up
        self._sender = _LinkSender(down)

    def send_to_rank(self, dp_rank: int, data: Any) -> None:
        self._sender.send(dp_rank_tag(dp_rank), data)

    def recv_nowait(self) -> list[tuple[bytes, Any]]:
        return self.recv_tagged_nowait(self.up_socket)

    def check_alive(self) -> None:
        """Heartbeat when due, send what waited; NodeLost if node k dropped or is silent."""
        self._check_alive(self._sender)

    def wait_ready(self, timeout_s: float) -> dict[int, dict[str, Any]]:
        """Block until node k reports its DP groups ready; their ready infos by DP rank."""
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            self.check_connected()
            if not self.up_socket.poll(int(HEARTBEAT_INTERVAL_S * 1000)):
                continue
            for tag, payload in self.recv_nowait():
                if tag == TAG_READY:
                    return decode(payload.bytes)
                logger.warning("%s sent %r before it was ready; dropped", self.peer, tag)
        raise TimeoutError(
            f"{self.peer} did not report its DP groups ready within {timeout_s:.0f} s "
            "(is its launcher started with the same --dist-init-addr?)"
        )


class RemoteRankSender:
    """Looks like a PushEndpoint to the controller: sends to a DP rank on node k."""

    def __init__(self, node: RemoteNode, dp_rank: int) -> None:
        self.node = node
        self.dp_rank = dp_rank

    def send_encoded(self, data: Any) -> None:
        self.node.send_to_rank(self.dp_rank, data)


class WorkerNodeLink(_LinkEnd):
    """Node k's end (runs in node k's launcher): relays between the link and the ipc
    queues of this node's DP groups. It binds the queues the schedulers push to
    (detokenizer, tokenizer, load report: `port_args`' names) and connects to each
    group's input queue, which its scheduler binds."""

    def __init__(
        self, port_args: Any, dist_init_addr: str, node_rank: int, dp_ranks: range
    ) -> None:
        ctx = zmq.Context(1)
        host, dist_port = split_dist_init_addr(dist_init_addr)
        down_port, up_port = node_link_ports(dist_port, node_rank)
        down, up = _socket(ctx, zmq.PULL), _socket(ctx, zmq.PUSH)
        down.connect(f"tcp://{host}:{down_port}")
        up.connect(f"tcp://{host}:{up_port}")
        super().__init__(ctx, "node 0", down, up)
        self.down_socket = down
        self._sender = _LinkSender(up)
        self._to_ranks = {
            d: PushEndpoint(ctx, port_args.dp_scheduler_input_ipc_names[d]) for d in dp_ranks
        }
        self._from_ranks = [
            (TAG_DETOKENIZER, PullEndpoint(ctx, port_args.detokenizer_ipc_name)),
            (TAG_TOKENIZER, PullEndpoint(ctx, port_args.tokenizer_ipc_name)),
            (TAG_LOAD_REPORT, PullEndpoint(ctx, port_args.load_report_ipc_name)),
        ]
        self._poller = zmq.Poller()
        for socket in [down, *(pull.socket for _, pull in self._from_ranks), *self.monitors]:
            self._poller.register(socket, zmq.POLLIN)

    def send_ready(self, infos: dict[int, dict[str, Any]]) -> None:
        self._sender.send(TAG_READY, encode(infos))

    def pump(self, timeout_s: float) -> None:
        """Relay what arrives within `timeout_s` both ways; NodeLost if node 0 is gone."""
        self._poller.poll(int(timeout_s * 1000))
        for tag, payload in self.recv_tagged_nowait(self.down_socket):
            self._to_ranks[dp_rank_of_tag(tag)].send_encoded(payload)
        for tag, pull in self._from_ranks:
            for frame in pull.recv_frames_nowait():
                self._sender.send(tag, frame)
        self._check_alive(self._sender)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        for endpoint in self._to_ranks.values():
            endpoint.close()
        for _, pull in self._from_ranks:
            pull.close()
        self._ctx.term()
