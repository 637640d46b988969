"""TP sharding hooks, checked without a process group: each rank's shard of a
checkpoint tensor, recombined, reproduces the unsharded layer."""

from __future__ import annotations

import torch

from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

TP = 2


def _load(layer, full: dict[str, torch.Tensor]) -> None:
    for shard_id, tensor in full.items():
        layer.weight.weight_loader(layer.weight, tensor, shard_id)


def test_qkv_shards_split_heads_per_rank():
    hidden, d, heads, kv_heads = 32, 8, 4, 2
    full = {
        s: torch.randn(n * d, hidden) for s, n in (("q", heads), ("k", kv_heads), ("v", kv_heads))
    }
    x = torch.randn(3, hidden)
    ranks = []
    for rank in range(TP):
        layer = QKVParallelLinear(hidden, d, heads, kv_heads, tp_rank=rank, tp_size=TP)
        _load(layer, full)
        ranks.append(layer(x).split([heads // TP * d, kv_heads // TP * d, kv_heads // TP * d], -1))
    for i, name in enumerate(("q", "k", "v")):
        joined = torch.cat([r[i] for r in ranks], dim=-1)
        torch.testing.assert_close(joined, x @ full[name].T)


def test_kv_heads_replicate_when_fewer_than_ranks():
    layer0 = QKVParallelLinear(16, 8, 4, 1, tp_rank=0, tp_size=TP)
    layer1 = QKVParallelLinear(16, 8, 4, 1, tp_rank=1, tp_size=TP)
    k = torch.randn(8, 16)
    for layer in (layer0, layer1):
        layer.weight.weight_loader(layer.weight, k, "k")
    assert torch.equal(layer0.weight[16:24], layer1.weight[16:24])


def test_merged_column_and_row_parallel_reproduce_the_mlp():
    hidden, inter = 16, 24
    gate, up, down = (
        torch.randn(inter, hidden),
        torch.randn(inter, hidden),
        torch.randn(hidden, inter),
    )
    x = torch.randn(5, hidden)
    ref = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    partial = []
    for rank in range(TP):
        gate_up = MergedColumnParallelLinear(hidden, [inter, inter], tp_rank=rank, tp_size=TP)
        _load(gate_up, {0: gate, 1: up})
        row = RowParallelLinear(inter, hidden, tp_rank=rank, tp_size=TP)
        row.weight.weight_loader(row.weight, down)
        g, u = gate_up(x).chunk(2, dim=-1)
        partial.append(torch.nn.functional.linear(torch.nn.functional.silu(g) * u, row.weight))
    torch.testing.assert_close(sum(partial), ref, atol=1e-4, rtol=1e-4)


def test_vocab_parallel_embedding_shards_rows():
    full = torch.randn(10, 4)
    ids = torch.tensor([0, 4, 5, 9])
    out = torch.zeros(4, 4)
    for rank in range(TP):
        emb = VocabParallelEmbedding(10, 4, tp_rank=rank, tp_size=TP)
        emb.weight.weight_loader(emb.weight, full)
        in_shard = (ids >= emb.vocab_start) & (ids < emb.vocab_end)
        local = torch.where(in_shard, ids - emb.vocab_start, 0)
        out += emb.weight[local] * in_shard[:, None]
    torch.testing.assert_close(out, full[ids])
