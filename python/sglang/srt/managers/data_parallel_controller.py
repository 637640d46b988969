"""The data-parallel controller process (dp_size > 1), role `dp_controller`.

It binds the scheduler input queue the TokenizerManager pushes to, and forwards
each message as received (never re-encoded): a new request to the one DP rank the
`--load-balance-method` policy picks (`data_parallel_policy.py`), every other
message (abort, flush_cache, update_weights_from_disk, get_internal_state) to all
ranks, so an abort finds its request wherever it runs and each rank answers a
control request. The first TP rank of each DP rank sends a `LoadReport` here after
each step in which its load changed; reports are taken in before the requests
that arrived with them are routed. Outputs never pass through the controller:
each DP rank's first TP rank pushes to the detokenizer directly.

Across nodes (`--nnodes > 1`, node k runs DP ranks [k*G, (k+1)*G), G = dp_size/nnodes)
the controller is node 0's end of each other node's link (`node_link.py`): it sends
a remote rank's messages down that node's TCP link, and pushes what comes up (outputs,
control replies) to the detokenizer and the TokenizerManager as that node's schedulers
would; load reports it takes in itself. It reports ready only once every other node
has reported its groups ready (their ready infos go to the launcher with its own), and
exits when a node is lost (NodeLost), which the launcher's watchdog treats as the
death of a child: pending requests fail, the server exits 1.

Config: `dp_size`, `load_balance_method`, `nnodes`, `dist_init_addr` (parallel bag)
and the log level
(observability bag, read by the shared child entry), under the role's narrowed
namespace set (`ROLE_NAMESPACE_SETS["dp_controller"]`).
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from sglang.srt.arg_groups.parallel import node_of_dp_rank
from sglang.srt.managers.data_parallel_policy import (
    LoadBalancer,
    is_new_request,
    make_load_balancer,
)
from sglang.srt.managers.ipc import PullEndpoint, PushEndpoint, decode
from sglang.srt.managers.node_link import (
    HEARTBEAT_INTERVAL_S,
    TAG_DETOKENIZER,
    TAG_LOAD_REPORT,
    TAG_TOKENIZER,
    NodeLost,
    RemoteNode,
    RemoteRankSender,
)

logger = logging.getLogger(__name__)


IDLE_STEP_MS = 200  # an idle controller still steps (and stamps its clock) this often

class DataParallelController:
    def __init__(
        self,
        port_args: Any,
        policy: LoadBalancer,
        nnodes: int = 1,
        dist_init_addr: str | None = None,
    ) -> None:
        self.policy = policy
        self._ctx = zmq.Context(1)
        self.recv_from_tokenizer = PullEndpoint(self._ctx, port_args.scheduler_input_ipc_name)
        self.recv_load_reports = PullEndpoint(self._ctx, port_args.load_report_ipc_name)
        self.remote_nodes = [RemoteNode(self._ctx, dist_init_addr, k) for k in range(1, nnodes)]
        names = port_args.dp_scheduler_input_ipc_names
        self.send_to_ranks = [self._rank_sender(names, d, nnodes) for d in range(len(names))]
        self._poller = zmq.Poller()
        self._poller.register(self.recv_from_tokenizer.socket, zmq.POLLIN)
        self._poller.register(self.recv_load_reports.socket, zmq.POLLIN)
        self._poll_timeout_ms = None
        if self.remote_nodes:
            self._relay_up = {
                TAG_DETOKENIZER: PushEndpoint(self._ctx, port_args.detokenizer_ipc_name),
                TAG_TOKENIZER: PushEndpoint(self._ctx, port_args.tokenizer_ipc_name),
            }
            for node in self.remote_nodes:
                for socket in (node.up_socket, *node.monitors):
                    self._poller.register(socket, zmq.POLLIN)
            self._poll_timeout_ms = int(HEARTBEAT_INTERVAL_S * 1000)  # heartbeats are due

    def _rank_sender(self, names: tuple[str, ...], dp_rank: int, nnodes: int) -> Any:
        node_rank = node_of_dp_rank(len(names), nnodes, dp_rank) if nnodes > 1 else 0
        if node_rank == 0:
            return PushEndpoint(self._ctx, names[dp_rank])
        return RemoteRankSender(self.remote_nodes[node_rank - 1], dp_rank)

    def wait_remote_ready(self, timeout_s: float) -> dict[int, dict[str, Any]]:
        """The ready infos of every other node's DP groups, by DP rank (blocks)."""
        infos: dict[int, dict[str, Any]] = {}
        for node in self.remote_nodes:
            infos.update(node.wait_ready(timeout_s))
        return infos

    def event_loop(self, clock: Any = None) -> None:
        """Route forever; `clock` (a ForwardClock shared with the launcher) is stamped at
        each step, at least every IDLE_STEP_MS, so a frozen controller is seen and killed."""
        timeout_ms = min(self._poll_timeout_ms or IDLE_STEP_MS, IDLE_STEP_MS)
        while True:
            if clock is not None:
                clock.step()
            self._poller.poll(timeout_ms)
            self.step()

    def step(self) -> None:
        """Take in the load reports, relay what other nodes sent, then route what the
        tokenizer sent; NodeLost if another node is gone."""
        for report in self.recv_load_reports.recv_all_nowait():
            self.policy.on_report(report)
        for node in self.remote_nodes:
            self._relay_from(node)
        for frame in self.recv_from_tokenizer.recv_frames_nowait():
            self.dispatch(frame)
        for node in self.remote_nodes:
            self._check_alive(node)

    def _relay_from(self, node: RemoteNode) -> None:
        for tag, payload in node.recv_nowait():
            if tag == TAG_LOAD_REPORT:
                self.policy.on_report(decode(payload.bytes))
            else:
                self._relay_up[tag].send_encoded(payload)

    @staticmethod
    def _check_alive(node: RemoteNode) -> None:
        try:
            node.check_alive()
        except NodeLost as exc:
            logger.error("%s; its DP ranks cannot serve, so the server stops", exc)
            raise

    def dispatch(self, frame: Any) -> None:
        data = frame.bytes
        msg = decode(data)
        if is_new_request(msg):
            self.send_to_ranks[self.policy.route(msg.input_ids)].send_encoded(data)
            return
        for endpoint in self.send_to_ranks:
            endpoint.send_encoded(data)


def run_data_parallel_controller_process(
    server_args: Any, port_args: Any, clock: Any, ready_writer: Any
):
    """Process entry: publish (role dp_controller), bind, report ready, route forever."""
    from sglang.srt.managers.process_entry import run_child

    run_child("dp_controller", server_args, ready_writer, lambda: _build(port_args, clock))


def _build(port_args: Any, clock: Any = None):
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    method = parallel.load_balance_method
    policy = make_load_balancer(method, parallel.dp_size)
    controller = DataParallelController(port_args, policy, parallel.nnodes, parallel.dist_init_addr)
    remote_infos = controller.wait_remote_ready(envs.SGLANG_CHILD_READY_TIMEOUT.get())
    logger.info(
        "routing to %d DP ranks on %d node(s) by %s", parallel.dp_size, parallel.nnodes, method
    )
    info = {"load_balance_method": method, "remote_rank_infos": remote_infos}
    return info, lambda: controller.event_loop(clock)
