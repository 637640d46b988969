"""The `disagg` namespace: prefill/decode disaggregation."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

DISAGGREGATION_MODE_CHOICES = ("null", "prefill", "decode")


@dataclass(kw_only=True)
class DisaggArgs:
    _NS_PATH = "disagg"

    disaggregation_mode: str = arg(
        "null",
        "Role in a disaggregated deployment.",
        choices=DISAGGREGATION_MODE_CHOICES,
        unsupported="prefill/decode disaggregation",
    )
