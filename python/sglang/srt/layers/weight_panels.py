"""bf16 linear weights re-laid out once at load for the many-row CPU linear
(`linear_packed`): each call otherwise packs every 16-column panel of the weight again
(widened and transposed), which at a 32-stream decode step was 12% of the served
scheduler's samples on a 2-core Zen 2 (benchmark/RESULTS.md, twelfth session).

The panels (`kernels.pack_weight_panels`, layout in sgl-kernel/csrc/cpu/gemm_packed.cpp)
hang off the weight tensor as `weight.cpu_panels`, so every caller of `linear` (the
modules, the logits' lm_head, the fused decode layers) finds them without a new argument.
The bf16 dot-product path (all-bf16 compute on CPUs with avx512_bf16) packs the same
layout per call (gemm_packed_bf16.cpp): 9% of the served scheduler's samples at 32
streams on a 2-core AVX-512 EPYC, so it reads these panels too.

Built only where they are read (a bf16 checkpoint run in float32 on a vector build of the
kernels, or in bf16 where the kernels have the bf16 dot product; SGLANG_CPU_WEIGHT_PANELS
on), at load time, when the weights are final; a weight update builds a new model and so
new panels.

Where every use of a weight reads its panels (`linear.panels_kernel`: the panels' GEMV
for decode-size calls, the tiles, the bf16 dot product or linear_packed past them; an
embedding tied to the lm_head gathers its lookups' rows from them), the row-major copy
is not kept: its module's parameter becomes a shape-only tensor on the meta device
carrying the panels, so the weights take their bytes once (Qwen3-0.6B: 1,137 MiB less).
That holds for bf16 compute, and for float32 compute on the AVX2 build; under float32
on AVX-512 the prefill-size calls read the row-major weight (`_kernels_read_only_panels`),
and a weight some other module holds keeps its rows too: there the panels are a second
copy, packed while they fit MAX_AVAILABLE_FRACTION of the available memory.
"""

from __future__ import annotations

import logging

import psutil
import torch
from torch import nn

from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import PANELS_ATTR, LinearBase, widened_weight_serves
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

logger = logging.getLogger(__name__)

# The panels are a second copy of the linear weights: packed only while they take at most
# this share of the memory available at load (a large model on a small machine keeps
# packing per call rather than risk running out of memory).
MAX_AVAILABLE_FRACTION = 0.25
# Modules whose every read of their `weight` goes through linear() or embedding_rows(),
# which serve a shape-only weight from its panels.
PANEL_READERS = (LinearBase, VocabParallelEmbedding)


def panels_of(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight's panels packed at load, or None."""
    return getattr(weight, PANELS_ATTR, None)


def attach(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Pack the panels of the model's bf16 linear weights (and its lm_head's) when the
    kernels will read them: float32 compute over bf16 weights on a vector build, or bf16
    compute where the kernels have the bf16 dot product. A weight whose every call reads
    its panels keeps only them (`_kernels_read_only_panels`, `_panels_serve_every_call`)."""
    if compute_dtype not in (torch.float32, torch.bfloat16):
        return
    if not envs.SGLANG_CPU_WEIGHT_PANELS.get():
        return
    kernels = cpu_kernels.load()
    if kernels is None or kernels.weight_panel_width == 0:
        return
    if compute_dtype == torch.bfloat16 and not kernels.bf16_dot:
        return
    holders = _holders(model)
    replaced: list[tuple[nn.Module, str]] = []  # (module, parameter name): panels only
    copies: list[torch.Tensor] = []  # panels beside the row-major weight
    rows_unread = _kernels_read_only_panels(kernels, compute_dtype)
    for w in _linear_weights(model):
        if w.is_meta or w.dtype != torch.bfloat16 or w.dim() != 2 or not w.is_contiguous():
            continue  # (meta: already kept only as its panels)
        owners = holders.get(id(w), [])
        if rows_unread and _panels_serve_every_call(owners):
            replaced.append(owners[0])
        else:
            copies.append(w)
    width = kernels.weight_panel_width
    copy_bytes = sum(_panel_bytes(w, width) for w in copies)
    budget_bytes = int(psutil.virtual_memory().available * MAX_AVAILABLE_FRACTION)
    if copy_bytes > budget_bytes:
        logger.info(
            "linear weight panels not packed: %.1f MiB is over %.0f%% of the available "
            "memory (%.1f MiB); each call packs its own (SGLANG_CPU_WEIGHT_PANELS=0 skips "
            "this check)",
            copy_bytes / 2**20, 100 * MAX_AVAILABLE_FRACTION, budget_bytes / 2**20,
        )  # fmt: skip
        copies = []
    for weight in copies:
        setattr(weight, PANELS_ATTR, kernels.pack_weight_panels(weight))
    replaced_bytes = sum(_replace_with_panels(kernels, module, name) for module, name in replaced)
    if copies or replaced:
        logger.info(
            "linear weight panels packed at load: %.1f MiB beside the row-major weights, "
            "%.1f MiB in their place",
            copy_bytes / 2**20 if copies else 0.0, replaced_bytes / 2**20,
        )  # fmt: skip


def _holders(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """id(parameter) -> the (module, name) pairs that hold it, a module reached by two
    paths counted twice (a tie by module: `lm_head = embed_tokens`)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    return holders


def _kernels_read_only_panels(kernels, compute_dtype: torch.dtype) -> bool:
    """Whether every linear() call over a weight with panels reads only them in this
    compute dtype (`linear.panels_kernel`): all-bf16 calls do; float32 calls do unless F.linear
    over the widened row-major weight serves some row counts (`linear.widened_weight_serves`:
    prefill chunks on AVX-512, 1.3-1.7x faster than linear_packed there), so both stay."""
    return compute_dtype == torch.bfloat16 or not widened_weight_serves(kernels)


def _panels_serve_every_call(owners: list) -> bool:
    """Whether every use of a weight reads its panels, so its row-major copy is not
    needed (given `_kernels_read_only_panels`): its holders are linear layers and
    embeddings (an lm_head tied to the embedding: `linear.embedding_rows` gathers the
    lookups' rows from the panels), nothing that might read the rows itself."""
    return len(owners) >= 1 and all(
        isinstance(m, PANEL_READERS) and name == "weight" for m, name in owners
    )


def _replace_with_panels(kernels, module: nn.Module, name: str) -> int:
    """Pack `module.<name>`'s panels and put a shape-only parameter carrying them in its
    place, which frees the row-major bytes (one weight at a time, so loading never holds
    two copies of the model); the bytes packed."""
    weight = getattr(module, name)
    panels = kernels.pack_weight_panels(weight)
    setattr(module, name, shape_only(weight, panels))
    return panels.numel() * panels.element_size()


def shape_only(weight: torch.Tensor, panels: torch.Tensor) -> nn.Parameter:
    """A parameter of `weight`'s shape and dtype on the meta device (no bytes) carrying
    `panels` (and the weight loader): linear() reads the panels, and any op that would
    read the values fails loudly."""
    param = nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"),
                         requires_grad=False)  # fmt: skip
    setattr(param, PANELS_ATTR, panels)
    if hasattr(weight, "weight_loader"):
        param.weight_loader = weight.weight_loader
    return param


def _panel_bytes(weight: torch.Tensor, width: int) -> int:
    """Bytes of pack_weight_panels(weight): [ceil(N / width), ceil(K / 2), width] int32."""
    n, k = weight.shape
    return -(-n // width) * ((k + 1) // 2) * width * 4


def _linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """Each linear layer's weight and the lm_head's (a tied embedding's too), once each."""
    weights = [m.weight for m in model.modules() if isinstance(m, LinearBase)]
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and isinstance(getattr(lm_head, "weight", None), torch.Tensor):
        weights.append(lm_head.weight)
    unique: dict[int, torch.Tensor] = {}
    for w in weights:
        unique.setdefault(id(w), w)
    return list(unique.values())
