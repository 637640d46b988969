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
        "Number of nodes the scheduler ranks are spread over: with --dp-size 1 each node "
        "runs tp_size/nnodes TP ranks, with --dp-size > 1 each node runs dp_size/nnodes "
        "whole DP groups. Needs --dist-init-addr. Node 0 serves HTTP, the others run "
        "scheduler ranks only.",
    )
    node_rank: int = arg(0, "Rank of this node, 0-based (0 serves HTTP).")
    dist_init_addr: str | None = arg(
        None,
        "host:port on node 0, reachable from every node (required with --nnodes > 1): "
        "the torch.distributed rendezvous, and with --dp-size > 1 the base of the ports "
        "node 0 binds for the other nodes' DP groups (docs/scaling.md).",
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


# Ports of --dist-init-addr host:P with dp_size > 1 across nodes, all bound on node 0:
#   P + d                  TP rendezvous of node 0's DP rank d (d < dp_size/nnodes)
#   P + 100 + 2*(k-1)      node 0 -> node k link (requests, control, heartbeats)
#   P + 101 + 2*(k-1)      node k -> node 0 link (outputs, replies, load, heartbeats)
MAX_DP_RANKS_PER_NODE = 100
NODE_LINK_PORT_OFFSET = 100


def node_link_ports(dist_port: int, node_rank: int) -> tuple[int, int]:
    """(node 0 -> node k port, node k -> node 0 port) for node `node_rank` = k >= 1."""
    down_port = dist_port + NODE_LINK_PORT_OFFSET + 2 * (node_rank - 1)
    return down_port, down_port + 1


def node_dp_ranks(dp_size: int, nnodes: int, node_rank: int) -> range:
    """The DP ranks node `node_rank` runs whole: a contiguous block, DP rank 0 on node 0.

    With dp_size 1 the one DP rank spans every node (its TP ranks are split instead).
    """
    if dp_size == 1:
        return range(1)
    per_node = dp_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def node_of_dp_rank(dp_size: int, nnodes: int, dp_rank: int) -> int:
    """The node that runs DP rank `dp_rank` (dp_size > 1)."""
    return dp_rank // (dp_size // nnodes)


def tp_ranks_per_node(tp_size: int, dp_size: int, nnodes: int) -> int:
    """How many of a DP group's TP ranks share a node: all of them when the nodes split
    the DP groups (dp_size > 1), tp_size/nnodes when they split the TP ranks."""
    return tp_size if dp_size > 1 else tp_size // nnodes


def node_scheduler_ranks(
    tp_size: int, dp_size: int, nnodes: int, node_rank: int
) -> tuple[range, range]:
    """(DP ranks, TP ranks of each of them) that node `node_rank` runs."""
    if dp_size == 1:
        return range(1), node_tp_ranks(tp_size, nnodes, node_rank)
    return node_dp_ranks(dp_size, nnodes, node_rank), range(tp_size)


def check_tp_split(config: dict[str, Any], tp_size: int, ep_size: int = 1) -> None:
    """A ValueError naming the config.json field that `tp_size` ranks cannot split: the
    attention heads, the KV heads (divided among ranks, or each replicated on tp/kv of
    them), the MLP width; an MoE's expert width unless its experts are split (ep_size,
    which must then divide the experts: each rank holds whole experts)."""
    if tp_size <= 1:
        return
    config = config.get("text_config") or config
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    # Mixtral's intermediate_size is its experts' width; Qwen3-MoE's, its dense layers'
    expert_width = (
        "moe_intermediate_size"
        if "moe_intermediate_size" in config
        else ("intermediate_size" if num_experts else None)
    )
    widths = [
        (name, int(config.get(name) or 0))
        for name in ("intermediate_size", "moe_intermediate_size")
        if config.get(name) and not (ep_size > 1 and name == expert_width)
    ]
    if ep_size > 1 and num_experts % ep_size:
        _refuse_split("num_experts", num_experts, ep_size, "each rank holds whole experts",
                      flag="ep_size")  # fmt: skip
    if heads % tp_size:
        _refuse_split("num_attention_heads", heads, tp_size, "each rank runs whole heads")
    if kv_heads and kv_heads % tp_size and tp_size % kv_heads:
        _refuse_split("num_key_value_heads", kv_heads, tp_size,
                      "KV heads are divided among the ranks, or each replicated on "
                      "tp_size / num_key_value_heads of them")  # fmt: skip
    for name, width in widths:
        if width % tp_size:
            _refuse_split(name, width, tp_size, "each rank runs an equal slice")


def _refuse_split(field: str, value: int, size: int, why: str, flag: str = "tp_size") -> None:
    raise ValueError(
        f"{flag}={size} cannot split this model: {field}={value} in its config.json is "
        f"not divisible by it ({why}); use a {flag} that divides it"
    )
