"""Checkpoint tensor names -> model parameters (stacked qkv / gate_up, TP shards)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

logger = logging.getLogger(__name__)

# tensors a checkpoint may carry that no parameter corresponds to
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
# HF's per-expert tensors: `<prefix>.experts.<e>.<proj>.weight`
_EXPERT_TENSOR = re.compile(r"\.experts\.(\d+)\.(\w+)\.weight$")


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch: model {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(loaded)


def load_stacked_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params_mapping: list[tuple[str, str, object]],
    tied_embeddings: bool = False,
    expert_params_mapping: dict[str, tuple[str, int | None]] | None = None,
    optional: tuple[str, ...] = (),
    num_experts: int = 0,
) -> set[str]:
    """Load `weights` into `model`; raise naming any unknown tensor or unloaded parameter
    (the parameters named in `optional` may stay unloaded). Returns the loaded names.

    `expert_params_mapping` maps a per-expert checkpoint projection name to (stacked
    expert parameter, part): `experts.3.up_proj.weight` -> `experts.gate_up_proj`
    with shard id (3, part).
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    shards: dict[str, set[Any]] = {}  # fused parameter -> the parts loaded into it
    tied_head: torch.Tensor | None = None  # a tied model's lm_head tensor, if one is stored
    for name, tensor in weights:
        if tied_embeddings and name == "lm_head.weight":
            tied_head = tensor
            continue
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        mapped = _map_expert_name(name, expert_params_mapping or {})
        param_name, shard_id = mapped or _map_name(name, stacked_params_mapping)
        if param_name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no matching model parameter")
        param = params[param_name]
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            loader(param, tensor.to(param.dtype), shard_id)
        except (ValueError, RuntimeError) as e:  # RuntimeError: a narrow() past the tensor
            raise ValueError(f"cannot load checkpoint tensor {name!r}: {e}") from e
        loaded.add(param_name)
        if shard_id is not None:
            shards.setdefault(param_name, set()).add(shard_id)
    if tied_head is not None:
        _untie_if_different(model, tied_head)
    missing = sorted(set(params) - loaded - set(optional))
    missing += _missing_parts(
        shards, stacked_params_mapping, expert_params_mapping or {}, num_experts
    )
    if missing:
        raise ValueError(
            f"checkpoint is missing weights for: {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else "")
        )
    return loaded


def _untie_if_different(model: nn.Module, head: torch.Tensor) -> None:
    """A config with tie_word_embeddings whose checkpoint stores an lm_head that differs
    from the embeddings: the stored head is used, as transformers (5) does ("both are
    present with different values, so we will NOT tie them"). The same values: tied."""
    tied = model.lm_head  # the embedding module itself
    shard = head[tied.vocab_start : tied.vocab_end].to(tied.weight.dtype)
    if torch.equal(tied.weight.data[: shard.shape[0]], shard):
        return
    untied = ParallelLMHead(tied.num_embeddings, tied.weight.shape[1],
                            tp_rank=tied.tp_rank, tp_size=tied.tp_size)  # fmt: skip
    untied.weight.data = torch.empty_like(tied.weight)
    untied.compute_dtype = tied.compute_dtype
    untied.weight_loader(untied.weight, head)
    model.lm_head = untied
    logger.warning("tie_word_embeddings is set but the checkpoint's lm_head differs from its "
                   "embeddings: the lm_head is used, untied (as transformers does)")  # fmt: skip


def _missing_parts(
    shards: dict[str, set[Any]],
    stacked: list[tuple[str, str, object]],
    experts: dict[str, tuple[str, int | None]],
    num_experts: int = 0,
) -> list[str]:
    """The fused parameters loaded in part only (a checkpoint with q_proj and v_proj but
    no k_proj would leave that slice uninitialized): "<param> (<part>)" each. Experts:
    every part of each of the `num_experts` (every rank reads all of them, its own
    kept), or of each expert the checkpoint has when the count is not given."""
    out = []
    for param_name, seen in sorted(shards.items()):
        if isinstance(next(iter(seen)), tuple):  # (expert, part) of a stacked expert param
            stem = param_name.rsplit(".", 1)[-1]
            parts = {part for target, part in experts.values() if target == stem}
            ids = range(num_experts) if num_experts else {expert for expert, _ in seen}
            want = {(expert, part) for expert in ids for part in parts}
        else:
            want = {sid for _, target, sid in stacked if f".{target}." in f".{param_name}."}
        out += [f"{param_name} ({_part_name(part)})" for part in sorted(want - seen, key=str)]
    return out


def _part_name(part: Any) -> str:
    if isinstance(part, tuple):
        expert, which = part
        return f"expert {expert}" + (f" part {which}" if which is not None else "")
    return str(part)


def _map_name(name: str, mapping: list[tuple[str, str, object]]) -> tuple[str, object]:
    for ckpt_part, param_part, shard_id in mapping:
        if f".{ckpt_part}." in name:
            return name.replace(f".{ckpt_part}.", f".{param_part}."), shard_id
    return name, None


def _map_expert_name(
    name: str, mapping: dict[str, tuple[str, int | None]]
) -> tuple[str, tuple[int, int | None]] | None:
    match = _EXPERT_TENSOR.search(name)
    if match is None or match.group(2) not in mapping:
        return None
    param_part, part = mapping[match.group(2)]
    return f"{name[: match.start()]}.experts.{param_part}", (int(match.group(1)), part)
