"""Multi-node topology (issue 11): which TP and DP ranks a node runs, the node link's
ports and messages, and the refusals."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

from sglang.srt.arg_groups.parallel import (
    node_link_ports,
    node_of_dp_rank,
    node_scheduler_ranks,
    node_tp_ranks,
)
from sglang.srt.managers import node_link
from sglang.srt.managers.ipc import PortArgs, PullEndpoint, PushEndpoint, free_tcp_port
from sglang.srt.managers.node_link import NodeLost, RemoteNode, WorkerNodeLink
from sglang.srt.server_args import ServerArgs, prepare_server_args

ADDR = "127.0.0.1:29500"


@pytest.mark.parametrize(
    "tp_size, nnodes, expected",
    [
        (2, 2, [[0], [1]]),
        (4, 2, [[0, 1], [2, 3]]),
        (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (4, 1, [[0, 1, 2, 3]]),
    ],
)
def test_each_node_runs_a_contiguous_block_rank_0_on_node_0(tp_size, nnodes, expected):
    blocks = [list(node_tp_ranks(tp_size, nnodes, k)) for k in range(nnodes)]
    assert blocks == expected
    assert sorted(r for block in blocks for r in block) == list(range(tp_size))


@pytest.mark.parametrize(
    "tp_size, dp_size, nnodes, expected",
    [
        # dp_size 1: the TP ranks are split, the one DP rank spans the nodes
        (2, 1, 2, [([0], [0]), ([0], [1])]),
        # dp_size > 1: each node runs dp_size/nnodes whole groups (all TP ranks each)
        (1, 2, 2, [([0], [0]), ([1], [0])]),
        (2, 4, 2, [([0, 1], [0, 1]), ([2, 3], [0, 1])]),
        (3, 2, 2, [([0], [0, 1, 2]), ([1], [0, 1, 2])]),
        (1, 4, 1, [([0, 1, 2, 3], [0])]),
    ],
)
def test_each_node_runs_whole_dp_groups(tp_size, dp_size, nnodes, expected):
    layout = [node_scheduler_ranks(tp_size, dp_size, nnodes, k) for k in range(nnodes)]
    assert [(list(dp), list(tp)) for dp, tp in layout] == expected
    if dp_size > 1:
        for k, (dp_ranks, _) in enumerate(layout):
            assert all(node_of_dp_rank(dp_size, nnodes, d) == k for d in dp_ranks)


def test_node_link_ports_sit_past_node_0s_rendezvous_ports():
    assert node_link_ports(29500, 1) == (29600, 29601)
    assert node_link_ports(29500, 2) == (29602, 29603)


def test_dp_across_nodes_parses_without_tp_dividing():
    argv = ["--dp-size", "2", "--tp-size", "3", "--nnodes", "2", "--dist-init-addr", ADDR]
    sa = prepare_server_args(argv)
    assert (sa.dp_size, sa.tp_size, sa.nnodes) == (2, 3, 2)


def test_multi_node_args_parse():
    argv = ["--tp-size", "4", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", ADDR]
    sa = prepare_server_args(argv)
    assert (sa.tp_size, sa.nnodes, sa.node_rank, sa.dist_init_addr) == (4, 2, 1, ADDR)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", ADDR],
         "nnodes=2 is not accepted with tp_size=3: each node runs tp_size/nnodes TP ranks"),
        (["--tp-size", "2", "--nnodes", "2"], "nnodes=2 needs dist_init_addr (--dist-init-addr"),
        (["--tp-size", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", ADDR],
         "node_rank=2 is not accepted; it must be < nnodes=2"),
        (["--dp-size", "3", "--nnodes", "2", "--dist-init-addr", ADDR],
         "dp_size=3 is not accepted with nnodes=2: each node runs dp_size/nnodes whole DP "
         "groups"),
        (["--dp-size", "2", "--tp-size", "2", "--nnodes", "4", "--dist-init-addr", ADDR],
         "dp_size=2 is not accepted with nnodes=4"),
        (["--dp-size", "202", "--nnodes", "2", "--dist-init-addr", ADDR],
         "at most 100 DP groups per node"),
        (["--dp-size", "2", "--nnodes", "2"], "nnodes=2 needs dist_init_addr"),
    ],
)  # fmt: skip
def test_cli_refusals_exit_2_naming_the_fields(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_engine_refuses_node_rank_above_0():
    from sglang.srt.entrypoints.engine import _launch_subprocesses

    sa = ServerArgs(
        model_path="org/model", device="cpu", tp_size=2, nnodes=2, node_rank=1, dist_init_addr=ADDR
    )
    with pytest.raises(ValueError, match="node_rank > 0 runs scheduler ranks only"):
        _launch_subprocesses(sa)


def _silent_peer(rank: int, init_method: str, result: Any) -> None:
    """Rank 1 joins, then stops answering; rank 0 reports how its broadcast ended."""
    from sglang.srt.distributed.parallel_state import _new_group, init_distributed_environment

    init_distributed_environment(2, rank, init_method, backend="gloo", timeout_s=2.0)
    _, cpu_group = _new_group([0, 1], "gloo")
    if rank == 1:
        time.sleep(60)
        return
    import torch.distributed as dist

    started = time.monotonic()
    try:
        dist.broadcast_object_list([None], src=1, group=cpu_group)
        result.put(("returned", time.monotonic() - started))
    except RuntimeError as exc:
        result.put((str(exc), time.monotonic() - started))


def test_a_silent_peer_fails_the_collective_after_the_timeout():
    """The timeout bounds the groups built after init too (gloo's default: 30 min)."""
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
    procs = [ctx.Process(target=_silent_peer, args=(r, init_method, result)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        message, waited_s = result.get(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.join(timeout=10)
    assert "Timed out" in message and waited_s < 10, (message, waited_s)


@pytest.fixture
def link_pair():
    """Node 0's end (as in the DP controller) and node 1's (as in its launcher) on
    loopback; node 1 runs DP rank 1 of 2."""
    import zmq

    addr = f"127.0.0.1:{free_tcp_port()}"
    ctx = zmq.Context(1)
    port_args = PortArgs.init_new(None, dp_size=2)
    node = RemoteNode(ctx, addr, node_rank=1)
    worker = WorkerNodeLink(port_args, addr, node_rank=1, dp_ranks=range(1, 2))
    try:
        yield node, worker, port_args, ctx
    finally:
        worker.close()
        node.close()
        ctx.term()
        port_args.cleanup()


def _pump_until(worker: WorkerNodeLink, done: Any, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker.pump(0.05)
        result = done()
        if result:
            return result
    raise AssertionError("nothing arrived")


def test_the_link_relays_both_ways_as_received(link_pair):
    node, worker, port_args, ctx = link_pair
    worker.send_ready({1: {"max_total_num_tokens": 64}})
    assert node.wait_ready(timeout_s=5) == {1: {"max_total_num_tokens": 64}}
    scheduler_input = PullEndpoint(ctx, port_args.dp_scheduler_input_ipc_names[1])
    to_detokenizer = PushEndpoint(ctx, port_args.detokenizer_ipc_name)
    try:
        node.send_to_rank(1, b"request bytes")
        assert _pump_until(worker, lambda: scheduler_input.recv_frames_nowait())[0].bytes == (
            b"request bytes"
        )
        to_detokenizer.send({"rid": "a"})
        received = []
        _pump_until(worker, lambda: received.extend(node.recv_nowait()) or received)
        assert [(tag, node_link.decode(p.bytes)) for tag, p in received] == [
            (b"detok", {"rid": "a"})
        ]
        node.check_alive()  # heartbeats flowing, connected
    finally:
        scheduler_input.close()
        to_detokenizer.close()


def test_a_closed_worker_end_is_a_lost_node_at_once(link_pair):
    node, worker, _, _ = link_pair
    worker.send_ready({})
    node.wait_ready(timeout_s=5)
    worker.close()
    deadline = time.monotonic() + 5
    with pytest.raises(NodeLost, match="node 1: connection dropped"):
        while time.monotonic() < deadline:
            node.check_alive()
            time.sleep(0.05)


def test_a_silent_worker_is_a_lost_node_after_the_timeout(link_pair, monkeypatch):
    monkeypatch.setattr(node_link, "NODE_SILENT_AFTER_S", 0.5)
    node, worker, _, _ = link_pair
    worker.send_ready({})
    node.wait_ready(timeout_s=5)  # heard once; the worker never pumps (no heartbeats)
    started = time.monotonic()
    with pytest.raises(NodeLost, match="node 1: nothing heard for"):
        while time.monotonic() - started < 5:
            node.check_alive()
            time.sleep(0.05)
    assert time.monotonic() - started < 2
