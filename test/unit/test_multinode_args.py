"""Multi-node topology (issue 11): which TP ranks a node runs, and the refusals."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

from sglang.srt.arg_groups.parallel import node_tp_ranks
from sglang.srt.managers.ipc import free_tcp_port
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
        (["--tp-size", "2", "--nnodes", "2", "--dp-size", "2", "--dist-init-addr", ADDR],
         "dp_size=2 is not supported yet with nnodes=2"),
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
