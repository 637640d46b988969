"""The `mm` namespace: multimodal inputs."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg


@dataclass(kw_only=True)
class MultimodalArgs:
    _NS_PATH = "mm"

    enable_multimodal: bool = arg(
        False, "Accept image inputs (multimodal models).", unsupported="multimodal inputs"
    )
