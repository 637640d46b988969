"""Attention backends and their registry."""

from __future__ import annotations

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, create_attention_backend

__all__ = ["AttentionBackend", "create_attention_backend"]
