"""Tensor parallelism for the scheduler: every TP rank runs the same scheduler.

Rank 0 alone talks ZMQ. Each step it broadcasts the messages it received to the
other ranks, so every rank makes identical scheduling decisions over identical
state and runs the same batch (the model all-reduces inside the forward). Only
rank 0 sends outputs. Pool sizes are agreed (minimum over ranks) at start.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.arg_groups.parallel import tp_ranks_per_node
from sglang.srt.runtime_context import get_parallel


class NullEndpoint:
    """Stands in for rank 0's sockets on the other ranks."""

    def send(self, obj: Any) -> None:
        pass

    def recv(self, timeout_ms: int | None = None) -> None:
        return None

    def recv_all_nowait(self) -> list[Any]:
        return []


def init_tensor_parallel(tp_size: int, tp_rank: int, init_method: str, device: str) -> None:
    """Join the TP process group (no-op for tp_size 1).

    With nnodes > 1 the ranks of every node join one rendezvous (node 0's
    dist_init_addr; with dp_size > 1 a group's ranks share a node and its own
    rendezvous); a rank's device index is its index on its node.
    """
    if tp_size == 1:
        return
    from sglang.srt.distributed.parallel_state import (
        default_backend,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from sglang.srt.environ import envs

    widths = get_parallel()
    init_distributed_environment(
        world_size=tp_size,
        rank=tp_rank,
        distributed_init_method=init_method,
        local_rank=tp_rank % tp_ranks_per_node(tp_size, widths.dp_size, widths.nnodes),
        backend=default_backend(device),
        timeout_s=envs.SGLANG_DIST_TIMEOUT.get(),
    )
    # one arithmetic: the stamp takes the published quotients
    initialize_model_parallel(
        tp_size,
        expert_model_parallel_size=widths.moe_ep_size,
        attention_data_parallel_size=widths.attn_dp_size,
        decode_context_parallel_size=widths.attn_dcp_size,
    )


class TpSync:
    """The collectives the scheduler needs across TP ranks (identity for tp_size 1)."""

    def __init__(self, tp_size: int) -> None:
        self.tp_size = tp_size
        self.group = None
        if tp_size > 1:
            from sglang.srt.distributed.parallel_state import get_tp_group

            self.group = get_tp_group()

    @property
    def is_first_rank(self) -> bool:
        return self.group is None or self.group.is_first_rank

    def share_inputs(self, msgs: list[Any], clock_s: float) -> tuple[list[Any], float]:
        """Rank 0's received messages and clock reading, on every rank: a decision that
        depends on time (a request waiting past a limit) is then the same on each."""
        if self.group is None:
            return msgs, clock_s
        return self.group.broadcast_object((msgs, clock_s) if self.is_first_rank else None)

    def share_result(self, result: Any) -> Any:
        """Rank 0's sampled tokens on every rank, so request states never diverge
        (sampling with temperature > 0 may differ by rank otherwise)."""
        if self.group is None:
            return result
        return self.group.broadcast_object(result if self.is_first_rank else None)

    def agree_min(self, values: list[int]) -> list[int]:
        """Element-wise minimum over ranks."""
        if self.group is None:
            return values
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group.cpu_group)
        return tensor.tolist()
