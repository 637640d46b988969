"""Helpers shared by the GPU tests."""

from __future__ import annotations

import importlib.util


def has_flashinfer() -> bool:
    return importlib.util.find_spec("flashinfer") is not None
