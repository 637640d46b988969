"""The `parallel` namespace: the topology an operator asks for, and its quotients.

The quotients are `Derived` class attributes (unannotated, so never fields of the
record): publish computes them once into ordinary leaves of the parallel bag.
`get_parallel()` answers a test override, else the stamp taken when process
groups are built, else these published leaves. Overriding a leaf (`tp_size`)
does not move a quotient: nothing is recomputed on read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang.srt.arg_groups.arg_utils import Derived, arg


def _attn_dp_size(c: Any) -> int:
    return c.dp_size if c.enable_dp_attention else 1


def _attn_tp_size(c: Any) -> int:
    return c.tp_size // _attn_dp_size(c)


@dataclass(kw_only=True)
class ParallelArgs:
    _NS_PATH = "parallel"

    tp_size: int = arg(1, "Tensor parallel size (ranks per model replica).")
    dp_size: int = arg(
        1,
        "Data parallel size: model replicas (each with --tp-size ranks and its own KV "
        "pool), fed by a controller process that routes each request to one replica.",
    )
    load_balance_method: str = arg(
        "round_robin",
        "How the data-parallel controller picks a replica for a request (dp_size > 1): "
        "in turn, by fewest requests, or by the longest prefix already cached "
        "(else fewest requests).",
        choices=("round_robin", "shortest_queue", "prefix_aware"),
    )
    pp_size: int = arg(1, "Pipeline parallel size.", unsupported="pipeline parallelism")
    ep_size: int = arg(
        1,
        "Expert parallel size (MoE models): 1, or tp_size to give each TP rank a block of "
        "whole experts instead of a slice of every expert.",
    )
    nnodes: int = arg(
        1,
        "Number of nodes the TP ranks are spread over (tp_size/nnodes ranks per node); "
        "needs --dist-init-addr. Node 0 serves HTTP, the others run scheduler ranks only.",
    )
    node_rank: int = arg(0, "Rank of this node, 0-based (0 serves HTTP).")
    dist_init_addr: str | None = arg(
        None,
        "host:port of the torch.distributed rendezvous (required with --nnodes > 1: "
        "node 0's address, reachable from every node).",
    )
    enable_dp_attention: bool = arg(
        False,
        "Data-parallel attention: split the TP ranks into dp_size attention groups.",
        unsupported="data-parallel attention",
    )
    decode_context_parallel_size: int = arg(
        1,
        "Decode context parallel size: shard the KV cache across TP ranks.",
        unsupported="decode context parallelism",
    )

    attn_dp_size = Derived(fn=_attn_dp_size, help="Attention data-parallel width.")
    attn_tp_size = Derived(fn=_attn_tp_size, help="Attention tensor-parallel width.")
    moe_ep_size = Derived(fn=lambda c: c.ep_size, help="MoE expert-parallel width.")
    moe_tp_size = Derived(fn=lambda c: c.tp_size // c.ep_size, help="MoE tensor-parallel width.")
    dcp_enabled = Derived(
        fn=lambda c: c.decode_context_parallel_size > 1, help="Whether decode CP is on."
    )
    attn_dcp_size = Derived(
        fn=lambda c: c.decode_context_parallel_size, help="Decode context-parallel width."
    )


def node_tp_ranks(tp_size: int, nnodes: int, node_rank: int) -> range:
    """The TP ranks node `node_rank` runs: a contiguous block, rank 0 on node 0."""
    per_node = tp_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)
