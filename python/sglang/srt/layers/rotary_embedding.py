"""Rotary position embedding (neox layout, as HF Llama/Qwen apply it) and its scalings."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from sglang.srt.layers import cpu_kernels, triton_ops

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        scaling: dict[str, Any] | None = None,
        cache_len: int | None = None,
    ) -> None:
        """max_position: the model's max_position_embeddings (what scaling is relative
        to); cache_len: positions the tables cover (default max_position; more when
        the served context is longer)."""
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        cache_len = max(max_position, cache_len or 0)
        inv_freq, positions = _scaled_inv_freq(rotary_dim, max_position, base, scaling, cache_len)
        # inv_freq: [rotary_dim / 2], or one row per position ([max_len, rotary_dim / 2])
        freqs = positions.unsqueeze(1) * inv_freq  # float32[max_len, rotary_dim / 2]
        scale = _attention_factor(scaling)  # yarn scales cos and sin
        self.register_buffer("cos_cache", freqs.cos() * scale, persistent=False)
        self.register_buffer("sin_cache", freqs.sin() * scale, persistent=False)
        self._prepared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def prepare(self, positions: torch.Tensor) -> None:
        """Build cos / sin for this forward's positions (int64[T]); the model calls it once
        per forward, before its layers, so every layer reuses them (the Triton kernel
        reads the caches itself)."""
        if triton_ops.fused_ops_enabled(positions) or self._kernel_usable(positions):
            return
        self._prepared = self._gather_cos_sin(positions)

    def _gather_cos_sin(self, positions: torch.Tensor):
        """(positions, cos [T, 1, rot], signed sin [T, 1, rot])."""
        cos = self.cos_cache.index_select(0, positions).unsqueeze(1)  # [T, 1, rot / 2]
        sin = self.sin_cache.index_select(0, positions).unsqueeze(1)
        # with the halves swapped by roll, x * cos + roll(x) * sin_signed is HF's
        # x * cos + rotate_half(x) * sin, op for op
        return positions, torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """(cos [T, 1, rot], signed sin [T, 1, rot]) for `positions` (built here when
        prepare skipped them: the kernels' path falling back for an unsupported x)."""
        if self._prepared is None or self._prepared[0] is not positions:
            self._prepared = self._gather_cos_sin(positions)
        _, cos, sin = self._prepared
        return cos.to(dtype), sin.to(dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: int64[T]; q: [T, Hq * D]; k: [T, Hkv * D] -> rotated (q, k). On the
        CPU kernels' path (cpu_kernels) q and k are rotated in place and returned."""
        if triton_ops.fused_ops_enabled(q):
            q_rot, k_rot = self._rotate_triton(positions, q), self._rotate_triton(positions, k)
            return q_rot.view(q.shape), k_rot.view(k.shape)
        if self._kernel_usable(positions) and q.dim() == 2 and k.dim() == 2:
            return self._rotate_kernel(positions, q), self._rotate_kernel(positions, k)
        cos, sin = self._cos_sin(positions, q.dtype)
        return self._rotate(q, cos, sin).view(q.shape), self._rotate(k, cos, sin).view(k.shape)

    def rotate_heads(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H * D] (any heads, e.g. q and k side by side) -> rotated [T, H, D]. On
        the CPU kernels' path x is rotated in place (the result is a view of it)."""
        if triton_ops.fused_ops_enabled(x):
            return self._rotate_triton(positions, x)
        if self._kernel_usable(positions) and x.dim() == 2:
            return self._rotate_kernel(positions, x).view(x.shape[0], -1, self.head_dim)
        cos, sin = self._cos_sin(positions, x.dtype)
        return self._rotate(x, cos, sin)

    def _kernel_usable(self, positions: torch.Tensor) -> bool:
        """The CPU kernel (in place) serves every call on CPU while the kernels are on."""
        return cpu_kernels.serves(positions)

    def _rotate_kernel(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H * D] with contiguous rows, rotated in place and returned."""
        if x.stride(-1) != 1 or x.dtype not in cpu_kernels.SUPPORTED_DTYPES:
            cos, sin = self._cos_sin(positions, x.dtype)
            return self._rotate(x, cos, sin).view(x.shape)
        cpu_kernels.load().rotary_neox_(x, positions, self.cos_cache, self.sin_cache, self.head_dim)
        return x

    def _rotate_triton(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        from sglang.srt.layers.triton_ops.rotary import rotary_neox

        return rotary_neox(positions, x, self.cos_cache, self.sin_cache, self.head_dim)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], -1, self.head_dim)  # [T, H, D]
        rot = self.rotary_dim
        if rot == self.head_dim:
            return x * cos + torch.roll(x, rot // 2, dims=-1) * sin
        part = x[..., :rot]
        rotated = part * cos + torch.roll(part, rot // 2, dims=-1) * sin
        return torch.cat((rotated, x[..., rot:]), dim=-1)


def _base_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _scaled_inv_freq(
    dim: int, max_position: int, base: float, scaling: dict[str, Any] | None, cache_len: int
):
    """(inv_freq float32[dim / 2] or [max_len, dim / 2], positions float32[max_len]);
    max_len is cache_len, or more for dynamic NTK (original x factor)."""
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    positions = torch.arange(cache_len, dtype=torch.float32)
    if rope_type == "default":
        return _base_inv_freq(dim, base), positions
    if "factor" not in scaling:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs a 'factor': {scaling}")
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return _base_inv_freq(dim, base), positions / factor
    if rope_type == "dynamic":
        return _dynamic_ntk(dim, base, factor, scaling, max_position, cache_len)
    if rope_type == "yarn":
        return _yarn_inv_freq(dim, base, factor, scaling, max_position), positions
    return _llama3_inv_freq(dim, base, factor, scaling, max_position), positions


def _dynamic_ntk(dim, base, factor, scaling, max_position, cache_len):
    """HF's dynamic NTK scaling as its generate applies it, one row per position: the
    plain base while a sequence fits max_position_embeddings; past it, the token at
    position p is rotated (and its K cached) with the base HF computes for a sequence of
    p + 1 tokens. (SGLang and vLLM use the base for the longest sequence at every
    position, which differs from HF on every prompt.) HF's one forward over a whole
    prompt longer than the window rotates all of it with that prompt's base; here each
    token keeps its own position's (chunked prefill and the prefix cache need a
    rotation that does not depend on the forward). Rows cover cache_len and original *
    factor; max_position is the model's max_position_embeddings, whatever the
    served context length."""
    original = int(scaling.get("original_max_position_embeddings") or max_position)
    max_len = max(cache_len, int(original * factor))
    inv_freq = _base_inv_freq(dim, base).repeat(max_len, 1)  # bitwise HF's in the window
    # Past it, HF's float32 arithmetic on one 0-d sequence length per forward; done here
    # for all rows at once, it agrees to float32 rounding (a loop of 0-d ops would be
    # bitwise, at ~1 s per layer for a 4k context x 4).
    seq_len = torch.arange(max_position + 1, max_len + 1)
    scaled = base * ((factor * seq_len / max_position) - (factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq[max_position:] = 1.0 / scaled.unsqueeze(1) ** exponents
    return inv_freq, torch.arange(max_len, dtype=torch.float32)


def _llama3_inv_freq(
    dim: int, base: float, factor: float, scaling: dict[str, Any], max_position: int
):
    inv_freq = _base_inv_freq(dim, base)
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    # absent, HF (standardize_rope_params) takes the model's max_position_embeddings
    old_ctx = float(scaling.get("original_max_position_embeddings") or max_position)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _attention_factor(scaling: dict[str, Any] | None) -> float:
    """The factor yarn applies to cos / sin (1 for every other type), as HF computes it."""
    if not scaling or scaling.get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all = (
        scaling["factor"],
        scaling.get("mscale"),
        scaling.get("mscale_all_dim"),
    )
    if mscale and mscale_all:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return _yarn_mscale(factor)


def _yarn_inv_freq(
    dim: int, base: float, factor: float, scaling: dict[str, Any], max_position: int
):
    """YaRN: interpolate the low frequencies, keep the high ones, ramp in between."""
    original = float(scaling.get("original_max_position_embeddings") or max_position)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def get_rope(
    head_dim: int,
    max_position: int,
    base: float,
    scaling: dict[str, Any] | None = None,
    partial_rotary_factor: float = 1.0,
    cache_len: int | None = None,
) -> RotaryEmbedding:
    """max_position: the model's max_position_embeddings; cache_len: the served context
    length where longer (a --context-length past the model's)."""
    rotary_dim = int(head_dim * partial_rotary_factor)
    return RotaryEmbedding(head_dim, rotary_dim, max_position, base, scaling, cache_len)
