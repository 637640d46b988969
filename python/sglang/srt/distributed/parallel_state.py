"""torch.distributed process groups for tensor parallelism (a minimal first version).

The scheduler process of each TP rank calls `init_distributed_environment(...)`
then `initialize_model_parallel(tp_size)`; the latter stamps the derived parallel
widths into `get_parallel()` as its last act. Reading a rank or a group before
that raises a RuntimeError saying what to call. Torch is imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_NOT_INIT = (
    "{what} is not initialized: call init_distributed_environment() and then "
    "initialize_model_parallel() first (each scheduler process does this at start)"
)


@dataclass
class GroupCoordinator:
    """One process group seen from this rank: its ranks, our place, and collectives."""

    ranks: list[int]
    rank_in_group: int
    device_group: Any  # torch.distributed.ProcessGroup
    cpu_group: Any  # a gloo group over the same ranks, for object broadcasts

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    def all_reduce(self, tensor: Any) -> Any:
        """Sum `tensor` over the group in place; returns it."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: Any, dim: int = -1) -> Any:
        """Concatenate every rank's `tensor` along `dim` (same shape on every rank)."""
        if self.world_size == 1:
            return tensor
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        """Broadcast from group rank `src`, in place."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, src=self.ranks[src], group=self.device_group)
        return tensor

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Broadcast a picklable object from group rank `src` (over the cpu group)."""
        if self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.cpu_group)


_TP: GroupCoordinator | None = None


def default_backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def init_distributed_environment(
    world_size: int = 1,
    rank: int = 0,
    distributed_init_method: str = "tcp://127.0.0.1:29500",
    local_rank: int = 0,
    backend: str = "gloo",
    timeout_s: float | None = None,
) -> None:
    """Join the default process group (idempotent within a process).

    `timeout_s` bounds every collective of this group and of the groups built after
    it: a peer that stops answering (a lost node) fails the collective then. A peer
    process that exits fails it at once (its sockets close).
    """
    global _TIMEOUT
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return
    if backend == "nccl":
        import torch

        torch.cuda.set_device(local_rank)
    _TIMEOUT = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend,
        init_method=distributed_init_method,
        world_size=world_size,
        rank=rank,
        timeout=_TIMEOUT,
    )


_TIMEOUT: Any = None  # the collectives' timeout (a timedelta) set at init, for new groups


def _new_group(ranks: list[int], backend: str | None) -> tuple[Any, Any]:
    import torch.distributed as dist

    device_group = dist.new_group(ranks, backend=backend, timeout=_TIMEOUT)
    cpu_group = (
        device_group
        if backend in (None, "gloo")
        else dist.new_group(ranks, backend="gloo", timeout=_TIMEOUT)
    )
    return device_group, cpu_group


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    *,
    expert_model_parallel_size: int = 1,
    attention_data_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    backend: str | None = None,
) -> None:
    """Build the TP groups (consecutive ranks) and stamp the derived widths."""
    global _TP
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(_NOT_INIT.format(what="torch.distributed"))
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tp = tensor_model_parallel_size
    if world_size % tp:
        raise ValueError(f"tp_size={tp} must divide the world size {world_size}")
    for start in range(0, world_size, tp):
        ranks = list(range(start, start + tp))
        groups = _new_group(ranks, backend)  # every rank joins every new_group call
        if rank in ranks:
            _TP = GroupCoordinator(ranks, ranks.index(rank), *groups)
    _stamp_widths(
        tp, expert_model_parallel_size, attention_data_parallel_size, decode_context_parallel_size
    )


def _stamp_widths(tp: int, ep: int, attn_dp: int, dcp: int) -> None:
    from sglang.srt.runtime_context import get_parallel

    get_parallel().stamp(
        attn_tp_size=tp // attn_dp,
        attn_dp_size=attn_dp,
        moe_tp_size=tp // ep,
        moe_ep_size=ep,
        dcp_enabled=dcp > 1,
        attn_dcp_size=dcp,
    )


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> GroupCoordinator:
    if _TP is None:
        raise RuntimeError(_NOT_INIT.format(what="the tensor parallel group"))
    return _TP


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_world_rank() -> int:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(_NOT_INIT.format(what="torch.distributed"))
    return dist.get_rank()


def get_world_size() -> int:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(_NOT_INIT.format(what="torch.distributed"))
    return dist.get_world_size()


def tensor_model_parallel_all_reduce(tensor: Any) -> Any:
    return get_tp_group().all_reduce(tensor)


def tensor_model_parallel_all_gather(tensor: Any, dim: int = -1) -> Any:
    return get_tp_group().all_gather(tensor, dim)


def destroy_model_parallel() -> None:
    """Drop the TP groups and the stamped widths."""
    global _TP
    _TP = None
    from sglang.srt.runtime_context import get_parallel

    get_parallel().clear_stamp()


def destroy_distributed_environment() -> None:
    destroy_model_parallel()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
