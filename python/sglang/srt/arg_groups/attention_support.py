"""Which attention backends can run here, asked without importing torch or the kernels.

The launcher resolves `--attention-backend` (and validates an explicit choice) before any
model process starts, so every answer comes from package metadata (`find_spec`), the
torch build (`cuda_probe.torch_build_accelerators`: CUDA or ROCm) and the checkpoint's
config.json. The backends ask again with the live tensors when a runner builds them.

    cpu                           -> torch_native
    cuda, flashinfer can run      -> flashinfer
    cuda without it, or ROCm      -> triton (when the triton package is installed)
    otherwise                     -> torch_native
"""

from __future__ import annotations

import importlib.util
from typing import Any

from sglang.srt.environ import envs

# FlashInfer's prebuilt paged kernels: half-precision Q/KV and these head sizes
FLASHINFER_DTYPES = ("float16", "bfloat16", "half")
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def is_rocm_build() -> bool:
    """Whether the installed torch is a ROCm (HIP) build, read from torch/version.py."""
    from sglang.srt.arg_groups.cuda_probe import torch_build_accelerators

    return bool(torch_build_accelerators().get("hip"))


def triton_unavailable_reason(device: str) -> str | None:
    """Why the triton attention backend cannot run on `device` here; None when it can."""
    if device not in ("cpu", "cuda"):
        return "it runs on cuda (and ROCm)"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install triton)"
    if device == "cpu" and not envs.TRITON_INTERPRET.get():
        return (
            "it needs device cuda; on cpu its kernels run only in the Triton interpreter "
            "(TRITON_INTERPRET=1, for tests: very slow), so use 'torch_native'"
        )
    return None


def flashinfer_unavailable_reason(
    device: str, kv_dtype: str | None = None, head_dim: int | None = None
) -> str | None:
    """Why the flashinfer backend cannot run here; None when it can.

    `kv_dtype` (the dtype name attention runs in) and `head_dim` are checked when known;
    None (e.g. dtype still 'auto', a hub id without a local config) skips that check.
    """
    if device != "cuda":
        return f"it runs on cuda only, not {device}; use 'triton' or 'torch_native'"
    if is_rocm_build():
        return "it runs on NVIDIA CUDA only, not ROCm; use 'triton'"
    if importlib.util.find_spec("flashinfer") is None:
        return "the flashinfer package is not installed (pip install 'sglang[cuda]')"
    if kv_dtype not in (None, "auto") and kv_dtype not in FLASHINFER_DTYPES:
        return (
            f"its kernels take float16/bfloat16, not {kv_dtype}; use --dtype bfloat16 "
            "(and --kv-cache-dtype auto) or 'triton'"
        )
    if head_dim is not None and head_dim not in FLASHINFER_HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {FLASHINFER_HEAD_DIMS}; use 'triton'"
    return None


def default_attention_backend(device: str, kv_dtype: str | None, head_dim: int | None) -> str:
    """The fastest backend that can run on `device` (see the module table)."""
    if device != "cuda":
        return "torch_native"
    if head_dim is not None and flashinfer_unavailable_reason(device, kv_dtype, head_dim) is None:
        return "flashinfer"
    if triton_unavailable_reason(device) is None:
        return "triton"
    return "torch_native"


def attention_kv_dtype(c: Any) -> str:
    """The dtype name attention reads K/V in: --kv-cache-dtype, else the model dtype."""
    return c.dtype if c.kv_cache_dtype in (None, "auto") else c.kv_cache_dtype


def config_head_dim(config: dict[str, Any] | None) -> int | None:
    """head_dim of an HF config.json dict (text_config for multimodal wrappers), or None."""
    if not config:
        return None
    config = config.get("text_config") or config
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return int(hidden) // int(heads) if hidden and heads else None
