"""Mixture-of-experts feed-forward: a softmax top-k router and experts run grouped by expert.

Expert weights are stacked, one tensor per projection for this rank's experts:
`gate_up_proj` [E / ep, 2 * I / moe_tp, H] laid out as [gate | up] per expert,
and `down_proj` [E / ep, H, I / moe_tp], where tp = ep * moe_tp. Expert
parallelism gives each of the ep ranks a contiguous block of whole experts;
tensor parallelism splits every expert along its intermediate dim, as the dense
MLP is split. Every rank sees every token (TP replicates activations), computes
the contributions of the experts it holds, and one all-reduce over the TP group
per block sums them: no token dispatch is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import (
    ReplicatedLinear,
    _copy_checked,
    _param,
    tensor_parallel_all_reduce,
)
from sglang.srt.runtime_context import get_parallel

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, K], expert ids int64 [T, K]).

    Softmax over all experts in float32, then the top k; with `renormalize` the k
    weights are scaled to sum to one (Mixtral; Qwen-MoE's `norm_topk_prob`).
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class GroupedExperts(nn.Module):
    """E SwiGLU experts; each token's k (expert, weight) pairs are computed grouped by expert.

    With ep > 1 this rank holds experts [first, first + E / ep) whole; with moe_tp > 1
    it holds a 1 / moe_tp slice of each one's intermediate dim."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_size: int = 1,
    ) -> None:
        super().__init__()
        if num_experts % ep_size or tp_size % ep_size:
            raise ValueError(
                f"ep_size={ep_size} must divide num_experts={num_experts} and tp_size={tp_size}"
            )
        moe_tp = tp_size // ep_size
        assert intermediate_size % moe_tp == 0, (intermediate_size, moe_tp)
        self.num_experts = num_experts
        self.num_local = num_experts // ep_size
        self.first_expert = (tp_rank // moe_tp) * self.num_local  # ep rank = tp_rank // moe_tp
        self.shard_rank = tp_rank % moe_tp
        self.shard_size = i = intermediate_size // moe_tp
        self.gate_up_proj = _param(self.num_local, 2 * i, hidden_size)
        self.down_proj = _param(self.num_local, hidden_size, i)
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.down_proj.weight_loader = self._load_down
        self.act_fn = SiluAndMul()

    def forward(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H], topk_ids / topk_weights [T, K] -> this rank's partial sum [T, H]."""
        k = topk_ids.shape[1]
        flat_ids = topk_ids.flatten()  # [T * K]: slot s is token s // K's choice s % K
        order = torch.argsort(flat_ids, stable=True)  # slots grouped by expert
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        # slots of this rank's experts: a contiguous run of the sorted order
        start = sum(counts[: self.first_expert])
        local_counts = counts[self.first_expert : self.first_expert + self.num_local]
        order = order[start : start + sum(local_counts)]
        token_idx = order // k
        x_sorted = x[token_idx]  # [slots here, H]
        out_sorted = torch.empty_like(x_sorted)
        offset = 0
        for local, n in enumerate(local_counts):
            if n:
                rows = slice(offset, offset + n)
                out_sorted[rows] = self._run_expert(local, x_sorted[rows])
                offset += n
        out_sorted *= topk_weights.flatten()[order].unsqueeze(1).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token_idx, out_sorted)

    def _run_expert(self, local: int, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H] through one (local) expert's SwiGLU."""
        return F.linear(self.act_fn(F.linear(x, self.gate_up_proj[local])), self.down_proj[local])

    def _local(self, expert: int) -> int | None:
        """This rank's index of global expert `expert`, or None when another rank holds it."""
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local else None

    # -- loading: shard_id is (expert, 0 gate | 1 up | None down), or None for a stacked tensor

    def _load_gate_up(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:  # HF's fused [E, 2I, H]
            gate, up = loaded.chunk(2, dim=1)
            for expert in range(self.num_experts):
                self._load_gate_up(param, gate[expert], (expert, 0))
                self._load_gate_up(param, up[expert], (expert, 1))
            return
        expert, part = shard_id
        local = self._local(expert)
        if local is None:
            return
        i = self.shard_size
        shard = loaded.narrow(0, self.shard_rank * i, i)
        _copy_checked(param.data[local].narrow(0, part * i, i), shard, f"expert {expert} gate_up")

    def _load_down(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:  # HF's fused [E, H, I]
            for expert in range(self.num_experts):
                self._load_down(param, loaded[expert], (expert, None))
            return
        expert, _ = shard_id
        local = self._local(expert)
        if local is None:
            return
        i = self.shard_size
        shard = loaded.narrow(1, self.shard_rank * i, i)
        _copy_checked(param.data[local], shard, f"expert {expert} down")


class SparseMoeBlock(nn.Module):
    """Router (`gate`, replicated) + grouped experts: [T, H] -> [T, H], reduced over TP."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_size: int = 1,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in 1..{num_experts}")
        self.top_k, self.renormalize, self.tp_size = top_k, renormalize, tp_size
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = GroupedExperts(
            num_experts,
            hidden_size,
            intermediate_size,
            tp_rank=tp_rank,
            tp_size=tp_size,
            ep_size=ep_size,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        return tensor_parallel_all_reduce(self.experts(x, ids, weights), self.tp_size)


def moe_block_from_config(
    config: ModelConfig, tp: dict[str, int], renormalize: bool
) -> SparseMoeBlock:
    """The config's expert block; `renormalize` is the family's top-k rule. The expert-
    parallel width is the published `moe_ep_size` (1 on a single rank)."""
    ep_size = get_parallel().moe_ep_size if tp.get("tp_size", 1) > 1 else 1
    return SparseMoeBlock(
        config.hidden_size,
        config.num_experts,
        config.num_experts_per_tok,
        config.moe_intermediate_size,
        renormalize=renormalize,
        ep_size=ep_size,
        **tp,
    )
