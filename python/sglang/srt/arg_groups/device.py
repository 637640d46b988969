"""The `device` namespace: where the model runs."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

DEVICE_CHOICES = ("auto", "cpu", "cuda")


@dataclass(kw_only=True)
class DeviceArgs:
    _NS_PATH = "device"

    device: str = arg(
        "auto",
        "Device to run on; 'auto' picks cuda when available, else cpu.",
        choices=DEVICE_CHOICES,
    )
