"""Build a model for a ModelConfig and fill its weights (from files, or random)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from sglang.srt import huge_pages
from sglang.srt.arg_groups.model import LOAD_FORMAT_CHOICES
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels, weight_panels
from sglang.srt.layers.linear import HALF_WEIGHT_DTYPES, LinearBase
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.model_loader.weight_utils import (
    iterate_weights,
    pt_files,
    resolve_model_path,
    safetensors_files,
    stored_matrix_dtypes,
)
from sglang.srt.models.registry import ModelRegistry

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(
    model_config: ModelConfig, device: torch.device | str, tp_rank: int = 0, tp_size: int = 1
) -> nn.Module:
    """An uninitialized model of the config's architecture, on `device`."""
    model_cls = ModelRegistry.resolve(model_config.architectures)
    with _default_dtype(model_config.dtype), torch.device(device):
        model = model_cls(model_config, tp_rank=tp_rank, tp_size=tp_size)
    return model.eval()


def get_model(
    model_config: ModelConfig,
    device: torch.device | str,
    load_format: str | None = "auto",
    tp_rank: int = 0,
    tp_size: int = 1,
    model_path: str | None = None,
) -> nn.Module:
    """Build the model and load its weights from `model_path` (default: the config's)."""
    load_format = load_format or "auto"
    if load_format not in LOAD_FORMAT_CHOICES:
        raise ValueError(
            f"unsupported load format {load_format!r}; supported: {', '.join(LOAD_FORMAT_CHOICES)}"
        )
    model = build_model(model_config, device, tp_rank, tp_size)
    files = None  # dummy weights: no files, the config's dtype stands
    if load_format != "dummy":
        path = resolve_model_path(model_path or model_config.model_path)
        files = checkpoint_files(path, load_format)
    # what the files store decides (safetensors headers); other files are not read twice
    stored = None if files is None else (files[0] if files[1] else [])
    weight_dtype = half_weight_dtype(model_config, device, stored)
    if weight_dtype is not None:
        keep_weights_in(model, weight_dtype)
        logger.info(
            "linear and embedding weights kept in %s, the checkpoint's dtype (compute %s)",
            weight_dtype,
            model_config.dtype,
        )
    if torch.device(device).type == "cpu":
        place_on_huge_pages(model)
    with torch.no_grad():
        if load_format == "dummy":
            init_dummy_weights(model)
        else:
            model.load_weights(iterate_weights(*files))
    if torch.device(device).type == "cpu":
        cpu_kernels.load()  # built (or loaded from the cache) at start-up, not mid-request
        weight_panels.attach(model, model_config.dtype)  # packs only where they are read
    return model


def half_weight_dtype(
    model_config: ModelConfig, device: torch.device | str, files: list[Path] | None = None
) -> torch.dtype | None:
    """The half dtype to keep the linear and embedding weights in, or None (the compute
    dtype): on CPU, a bf16/fp16 checkpoint run in float32 keeps its own dtype
    (SGLANG_CPU_HALF_WEIGHTS, default on). Widening bf16/fp16 to float32 is exact, so the
    results are float32's, with half the weight memory and half the bytes a decode step
    reads (a memory-bound step: Qwen3-0.6B shape, batch 1, see benchmark/RESULTS.md).
    With the checkpoint's safetensors `files`, their matrices must all be stored in that
    dtype (a config.json may claim bf16 over float32 tensors: rounding them would change
    the results); `[]` (.bin/.pt files, not read twice): no half weights."""
    if torch.device(device).type != "cpu" or model_config.dtype != torch.float32:
        return None
    raw = model_config.raw
    name = raw.get("dtype") or raw.get("torch_dtype")
    checkpoint_dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if checkpoint_dtype not in HALF_WEIGHT_DTYPES or not envs.SGLANG_CPU_HALF_WEIGHTS.get():
        return None
    if files is not None and stored_matrix_dtypes(files) != {checkpoint_dtype}:
        return None
    return checkpoint_dtype


def keep_weights_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Re-allocate (before loading) the weights of the linear and embedding layers in
    `dtype`; the layers widen them to the compute dtype as they read them."""
    for module in model.modules():
        if isinstance(module, (LinearBase, VocabParallelEmbedding)):
            module.weight.data = torch.empty(module.weight.shape, dtype=dtype)


def place_on_huge_pages(model: nn.Module) -> None:
    """Re-allocate (before loading) the parameters of 2 MiB or more on huge pages where the
    kernel gives them (sglang.srt.huge_pages): a decode step streams them all."""
    if not huge_pages.enabled():
        return
    for param in model.parameters():  # once per tensor: tied weights share the Parameter
        if param.numel() * param.element_size() >= huge_pages.HUGE_PAGE_BYTES:
            param.data = huge_pages.empty(param.shape, param.dtype)


def checkpoint_files(model_dir: Path, load_format: str = "auto") -> tuple[list[Path], bool]:
    """(weight files, whether they are safetensors) of a checkpoint directory; auto
    prefers safetensors, and falls back to .bin/.pt only where there are none (an
    index naming a missing shard is that error, not a fallback)."""
    if load_format in ("auto", "safetensors"):
        try:
            return safetensors_files(model_dir), True
        except FileNotFoundError:
            indexed = (model_dir / "model.safetensors.index.json").is_file()
            if load_format == "safetensors" or indexed:
                raise
    try:
        return pt_files(model_dir), False
    except FileNotFoundError:
        if load_format == "auto":
            raise FileNotFoundError(
                f"no weight files (*.safetensors, *.bin, *.pt) in {model_dir}"
            ) from None
        raise


def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights (norms stay at one) for `--load-format dummy`."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.fill_(1.0)
            continue
        values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
        param.data.copy_(values.to(param.dtype))
