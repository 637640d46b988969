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

Config: `dp_size` and `load_balance_method` (parallel bag) and the log level
(observability bag, read by the shared child entry), under the role's narrowed
namespace set (`ROLE_NAMESPACE_SETS["dp_controller"]`).
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from sglang.srt.managers.data_parallel_policy import (
    LoadBalancer,
    is_new_request,
    make_load_balancer,
)
from sglang.srt.managers.ipc import PullEndpoint, PushEndpoint, decode

logger = logging.getLogger(__name__)


class DataParallelController:
    def __init__(self, port_args: Any, policy: LoadBalancer) -> None:
        self.policy = policy
        self._ctx = zmq.Context(1)
        self.recv_from_tokenizer = PullEndpoint(self._ctx, port_args.scheduler_input_ipc_name)
        self.recv_load_reports = PullEndpoint(self._ctx, port_args.load_report_ipc_name)
        self.send_to_ranks = [
            PushEndpoint(self._ctx, name) for name in port_args.dp_scheduler_input_ipc_names
        ]
        self._poller = zmq.Poller()
        self._poller.register(self.recv_from_tokenizer.socket, zmq.POLLIN)
        self._poller.register(self.recv_load_reports.socket, zmq.POLLIN)

    def event_loop(self) -> None:
        while True:
            self._poller.poll()
            self.step()

    def step(self) -> None:
        """Take in the load reports, then route what the tokenizer sent."""
        for report in self.recv_load_reports.recv_all_nowait():
            self.policy.on_report(report)
        for frame in self.recv_from_tokenizer.recv_frames_nowait():
            self.dispatch(frame)

    def dispatch(self, frame: Any) -> None:
        data = frame.bytes
        msg = decode(data)
        if is_new_request(msg):
            self.send_to_ranks[self.policy.route(msg.input_ids)].send_encoded(data)
            return
        for endpoint in self.send_to_ranks:
            endpoint.send_encoded(data)


def run_data_parallel_controller_process(server_args: Any, port_args: Any, ready_writer: Any):
    """Process entry: publish (role dp_controller), bind, report ready, route forever."""
    from sglang.srt.managers.process_entry import run_child

    run_child("dp_controller", server_args, ready_writer, lambda: _build(port_args))


def _build(port_args: Any):
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    method = parallel.load_balance_method
    controller = DataParallelController(port_args, make_load_balancer(method, parallel.dp_size))
    logger.info("routing to %d DP ranks by %s", parallel.dp_size, method)
    return {"load_balance_method": method}, controller.event_loop
