"""A model's context length from its config.json, and the rule for serving a longer one.

One rule for both places that apply it: the launcher's resolution (before any child
starts) and ModelConfig (paths that build a config without resolution: the Engine's
draft runner, tests). Torch-free: the launcher imports it.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.environ import envs

# Model types whose models apply each layer's sliding window (ModelConfig.layer_windows);
# the others keep sequences inside the window (window_capped_context).
WINDOWED_MODEL_TYPES = frozenset({"mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"})
# config.json keys that hold the trained context length, in HF's order of preference
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def model_context_len(config: dict[str, Any]) -> int | None:
    """The trained context length (a multimodal config's text_config too); None: unknown."""
    for section in (config, config.get("text_config") or {}):
        value = next((section[k] for k in CONTEXT_KEYS if section.get(k)), None)
        if value is not None:
            return int(value)
    return None


def check_context_override(asked: int, model_len: int | None, longer_ok: bool = False) -> None:
    """A ValueError for a context_length past the model's, unless the caller allows it
    (`longer_ok`) or SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, as SGLang refuses it."""
    if model_len is None or asked <= model_len:
        return
    if not (longer_ok or envs.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.get()):
        raise ValueError(
            f"context_length={asked} is longer than the model's {model_len} "
            f"(max_position_embeddings in config.json); positions past it were never "
            f"trained. Set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to allow it"
        )


def window_capped_context(config: dict[str, Any], context_len: int) -> int:
    """`context_len`, or the sliding window of a model type whose windowed attention does
    not run here (Mixtral, Qwen3-MoE): sequences stay inside the window."""
    if config.get("model_type") in WINDOWED_MODEL_TYPES:
        return context_len
    window = config.get("sliding_window")
    uses = config.get("use_sliding_window", config.get("model_type") in ("mistral", "mixtral"))
    if not window or not uses or context_len <= int(window):
        return context_len
    return int(window)
