"""The `lora` namespace: LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg


@dataclass(kw_only=True)
class LoraArgs:
    _NS_PATH = "lora"

    enable_lora: bool = arg(False, "Enable LoRA adapters.")
    lora_paths: list[str] | None = arg(
        None, "Adapters to load, as NAME=PATH or PATH.", nargs="*", metavar="PATH"
    )
    max_loras_per_batch: int = arg(8, "Max distinct adapters in one batch.")
