"""Model configuration read from HF checkpoints."""

from __future__ import annotations

from sglang.srt.configs.model_config import ModelConfig

__all__ = ["ModelConfig"]
