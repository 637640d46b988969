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
        "Fraction of the memory free after loading the weights (available RAM on cpu) for the "
        "KV pool. Default: 0.85 on cuda; on cpu unset, see --max-total-tokens.",
    )
    max_total_tokens: int | None = arg(
        None,
        "KV pool size in tokens. Default on cuda: from --mem-fraction-static. Default on cpu: "
        "min(4 GiB of KV, 64 (or --max-running-requests) full contexts), at least one context, "
        "at most 0.3 of available RAM; the startup log names the bound.",
    )
    disable_radix_cache: bool = arg(False, "Disable the radix prefix cache.")
