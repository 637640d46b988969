"""The `memory` namespace: KV pool sizing and the prefix cache."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg


@dataclass(kw_only=True)
class MemoryArgs:
    _NS_PATH = "memory"

    page_size: int = arg(1, "Tokens per KV cache page.")
    mem_fraction_static: float | None = arg(
        None,
        "Fraction of memory for weights + KV pool. Default: 0.3 on cpu (of available RAM), "
        "0.85 on cuda.",
    )
    max_total_tokens: int | None = arg(
        None, "KV pool size in tokens. Default: from the memory fraction."
    )
    disable_radix_cache: bool = arg(False, "Disable the radix prefix cache.")
