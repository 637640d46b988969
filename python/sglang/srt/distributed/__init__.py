"""Process groups and collectives (torch.distributed; gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

from sglang.srt.distributed.parallel_state import (
    GroupCoordinator,
    default_backend,
    destroy_distributed_environment,
    destroy_model_parallel,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    get_world_rank,
    get_world_size,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)

__all__ = [
    "GroupCoordinator",
    "default_backend",
    "destroy_distributed_environment",
    "destroy_model_parallel",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "get_world_rank",
    "get_world_size",
    "init_distributed_environment",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
