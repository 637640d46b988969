"""Finding a checkpoint (local dir or hub id) and iterating its tensors."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # resolve_model_path runs in the launcher, which does not import torch
    import torch

logger = logging.getLogger(__name__)

_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.py"]
_PT_PATTERNS = ["*.bin", "*.pt"]  # fetched only for a checkpoint without safetensors
# Files beside the weights that are not the model's: a Trainer's state, a PEFT adapter,
# Mistral's consolidated copy of the same weights (HF's from_pretrained skips them too).
_NOT_MODEL_WEIGHTS = (
    "training_args.bin",
    "optimizer.pt",
    "optimizer.bin",
    "scheduler.pt",
    "scaler.pt",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "consolidated*",
)


def resolve_model_path(model_path: str, revision: str | None = None) -> Path:
    """A local directory as is; otherwise a hub id downloaded into the HF cache.

    Honours HF_HUB_OFFLINE (through huggingface_hub): offline, only the cache is
    consulted and a miss is a clear error.
    """
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model_path.startswith((".", "/")) or model_path.count("/") > 1:
        raise FileNotFoundError(f"model path {model_path!r} is not a directory")
    return _snapshot_download(model_path, revision)


def _snapshot_download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    offline = _hub_offline()

    def download(patterns: list[str]) -> str:
        return snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=patterns,
            ignore_patterns=list(_NOT_MODEL_WEIGHTS),
            local_files_only=offline,
        )

    try:
        local = download(_ALLOW_PATTERNS)
        if not any(Path(local).glob("*.safetensors")):  # a .bin checkpoint
            local = download(_ALLOW_PATTERNS + _PT_PATTERNS)
    except HFValidationError as e:
        raise FileNotFoundError(
            f"model path {repo_id!r} is neither a directory nor a hub id"
        ) from e
    except Exception as e:  # network errors, 404s, cache misses when offline
        hint = " (HF_HUB_OFFLINE is set and it is not in the local HF cache)" if offline else ""
        raise FileNotFoundError(
            f"cannot find model {repo_id!r}: not a local directory and the hub download "
            f"failed{hint}: {type(e).__name__}: {e}"
        ) from e
    return Path(local)


def _hub_offline() -> bool:
    """huggingface_hub's view of HF_HUB_OFFLINE (re-read: it may be set after import)."""
    from huggingface_hub import constants

    raw = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or raw.upper() in ("1", "ON", "YES", "TRUE")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files, from the sharded index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists missing shard(s): {', '.join(missing)}")
        return files
    files = _model_weight_files(model_dir, "model.safetensors", ["*.safetensors"])
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def pt_files(model_dir: Path) -> list[Path]:
    """The checkpoint's .bin / .pt files, from pytorch_model.bin.index.json when there
    is one."""
    index = model_dir / "pytorch_model.bin.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = _model_weight_files(model_dir, "pytorch_model.bin", ["*.bin", "*.pt"])
    if not files:
        raise FileNotFoundError(f"no *.bin / *.pt weight files in {model_dir}")
    return files


def _model_weight_files(model_dir: Path, canonical: str, patterns: list[str]) -> list[Path]:
    """The one file HF names (`canonical`) when present, else every file matching
    `patterns` that is not another program's (a Trainer's state, an adapter, ...)."""
    if (model_dir / canonical).is_file():
        return [model_dir / canonical]
    files = sorted(f for pattern in patterns for f in model_dir.glob(pattern))
    return [f for f in files if not any(f.match(skip) for skip in _NOT_MODEL_WEIGHTS)]


_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def stored_matrix_dtypes(files: list[Path]) -> set[Any]:
    """The torch dtypes the safetensors `files` store their matrices (2-D and up) in,
    read from the headers alone (8 bytes of length, then JSON)."""
    import torch

    dtypes = set()
    for path in files:
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__" and len(info.get("shape", ())) >= 2:
                dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
                dtypes.add(getattr(torch, dtype) if dtype else info.get("dtype"))
    return dtypes


def iterate_weights(files: list[Path], use_safetensors: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor in `files`, lazily; a progress bar over many files."""
    import torch

    for path in _progress(files):
        if use_safetensors:
            yield from _read_safetensors(path)
        else:
            yield from _guarded(
                path, lambda p=path: torch.load(p, map_location="cpu", weights_only=True)
            ).items()


class CheckpointError(RuntimeError):
    """A weight file that exists but cannot be read."""


def _guarded(path: Path, fn):
    try:
        return fn()
    except Exception as e:  # safetensors and torch raise their own error types
        raise CheckpointError(f"cannot read weight file {path}: {e}") from e


def _read_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    handle = _guarded(path, lambda: safe_open(str(path), framework="pt", device="cpu"))
    with handle as f:
        for name in list(f.keys()):
            yield name, _guarded(path, lambda n=name: f.get_tensor(n))


def _progress(files: list[Path]):
    if len(files) <= 1:
        return files
    from tqdm import tqdm

    return tqdm(files, desc="Loading checkpoint shards", unit="file")
