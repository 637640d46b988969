"""The `lora` namespace: LoRA adapters (not implemented yet: every field refused)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

LORA_ISSUE = "LoRA adapters"


@dataclass(kw_only=True)
class LoraArgs:
    _NS_PATH = "lora"

    enable_lora: bool = arg(False, "Enable LoRA adapters.", unsupported=LORA_ISSUE)
    lora_paths: list[str] | None = arg(
        None,
        "Adapters to load, as NAME=PATH or PATH.",
        nargs="*",
        metavar="PATH",
        unsupported=LORA_ISSUE,
    )
    max_loras_per_batch: int = arg(8, "Max distinct adapters in one batch.", unsupported=LORA_ISSUE)
