"""ModelConfig: the facts the runtime needs from a checkpoint's config.json.

Reads both the transformers-4 layout found on most hub checkpoints
(`rope_theta`, `rope_scaling`, `torch_dtype`) and the transformers-5 layout
(`rope_parameters`, `dtype`).

The launcher (TokenizerManager) builds one too, and it does not import torch: the
dtype is kept by name (`dtype_name`) and `dtype` / `hf_config` load torch and
transformers only when read (model-running processes).
"""

from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang.srt.configs.context_length import (
    WINDOWED_MODEL_TYPES,
    check_context_override,
    model_context_len,
    window_capped_context,
)
from sglang.srt.model_loader.weight_utils import resolve_model_path

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# accepted dtype names -> the torch attribute they name
_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}
# when config.json names no architecture (a bare `config.save_pretrained`)
_ARCH_BY_MODEL_TYPE = {
    "llama": ["LlamaForCausalLM"],
    "mistral": ["MistralForCausalLM"],
    "qwen2": ["Qwen2ForCausalLM"],
    "qwen3": ["Qwen3ForCausalLM"],
    "gemma2": ["Gemma2ForCausalLM"],
    "gemma3_text": ["Gemma3ForCausalLM"],
    "qwen3_moe": ["Qwen3MoeForCausalLM"],
    "mixtral": ["MixtralForCausalLM"],
}
DEFAULT_CONTEXT_LEN = 2048  # a config.json that names no context length


class ModelConfig:
    def __init__(
        self,
        model_path: str,
        context_length: int | None = None,
        dtype: str | torch.dtype = "auto",
        revision: str | None = None,
        trust_remote_code: bool = False,
        longer_context_ok: bool = False,
    ) -> None:
        """`longer_context_ok`: a context_length past the model's is the caller's choice
        (a draft runs at its target's), not the operator's (refused unless allowed)."""
        self.model_path = str(resolve_model_path(model_path, revision))
        self.revision = revision
        self.raw = _with_hf_defaults(_read_json(Path(self.model_path) / "config.json"))
        self.trust_remote_code = trust_remote_code
        self._init_shape()
        self._init_moe()
        self._init_rope()
        # per layer: HF's layer type, and the sliding window it applies (a query sees that
        # many keys, itself included; None = full attention)
        self.layer_types: list[str] = _layer_types(self.raw, self.num_hidden_layers)
        self.layer_windows: list[int | None] = _layer_windows(self.raw, self.layer_types)
        self.dtype_name: str = _resolve_dtype_name(dtype, self.raw)
        context = _context_len(self.raw, context_length, longer_context_ok)
        self.context_len = _cap_to_sliding_window(self.raw, context)
        self.eos_token_ids = _eos_token_ids(Path(self.model_path), self.raw)
        self.sampling_defaults = _sampling_defaults(Path(self.model_path))

    @classmethod
    def from_server_args(cls) -> ModelConfig:
        """Build from the published `model` bag."""
        from sglang.srt.runtime_context import get_model

        bag = get_model()
        return cls(
            bag.model_path,
            context_length=bag.context_length,
            dtype=bag.dtype,
            revision=getattr(bag, "revision", None),
            trust_remote_code=getattr(bag, "trust_remote_code", False),
        )

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype_name)

    @cached_property
    def hf_config(self) -> Any:
        """The transformers config object (imports transformers and torch)."""
        return _load_hf_config(self.model_path, self.raw, self.trust_remote_code)

    def _init_shape(self) -> None:
        raw = self.raw
        archs = raw.get("architectures") or _ARCH_BY_MODEL_TYPE.get(raw.get("model_type"), [])
        self.architectures: list[str] = list(archs)
        self.architecture: str = archs[0] if archs else ""
        self.model_type: str = raw.get("model_type", "")
        self.vocab_size: int = int(raw["vocab_size"])
        self.hidden_size: int = int(raw["hidden_size"])
        self.intermediate_size: int = int(raw.get("intermediate_size", 4 * self.hidden_size))
        self.num_hidden_layers: int = int(raw["num_hidden_layers"])
        self.num_attention_heads: int = int(raw["num_attention_heads"])
        self.num_key_value_heads: int = int(
            raw.get("num_key_value_heads") or self.num_attention_heads
        )
        self.head_dim: int = int(
            raw.get("head_dim") or self.hidden_size // self.num_attention_heads
        )
        self.rms_norm_eps: float = float(raw.get("rms_norm_eps", 1e-6))
        self.hidden_act: str = raw.get("hidden_act", "silu")
        self.tie_word_embeddings: bool = bool(raw.get("tie_word_embeddings", False))
        self.attention_bias: bool = bool(raw.get("attention_bias", False))
        self.max_position_embeddings: int = int(raw.get("max_position_embeddings", 2048))

    def _init_moe(self) -> None:
        """Expert counts and sizes; num_experts is 0 for a dense model."""
        raw = self.raw
        self.num_experts: int = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
        self.num_experts_per_tok: int = int(raw.get("num_experts_per_tok") or 0)
        # Qwen-style configs size experts apart from the dense MLP; Mixtral uses intermediate_size
        self.moe_intermediate_size: int = int(
            raw.get("moe_intermediate_size") or self.intermediate_size
        )
        # renormalise the top-k router weights to sum to one (Mixtral always does)
        self.norm_topk_prob: bool = bool(raw.get("norm_topk_prob", self.model_type == "mixtral"))

    def _init_rope(self) -> None:
        """rope_theta + rope_scaling (None for plain rope), from either layout."""
        raw = self.raw
        params = dict(raw.get("rope_parameters") or {})
        scaling = raw.get("rope_scaling") or None
        self.rope_theta: float = float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.get("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        pretrained = raw.get("original_max_position_embeddings")
        if scaling is not None and scaling["rope_type"] in ("llama3", "yarn") and pretrained:
            # Phi-3 keeps it at the top level; transformers gives that one priority
            scaling["original_max_position_embeddings"] = pretrained
        self.rope_scaling: dict[str, Any] | None = scaling
        partial = raw.get("partial_rotary_factor") or params.get("partial_rotary_factor")
        if partial is not None and float(partial) != 1.0:
            logger.warning(
                "partial_rotary_factor=%s in config.json is ignored: %s rotates every head "
                "dimension, as transformers does", partial, self.architecture,
            )  # fmt: skip

    def get_num_kv_heads(self, tp_size: int) -> int:
        """KV heads held by one TP rank (replicated when there are fewer than ranks)."""
        return max(1, self.num_key_value_heads // tp_size)

    def __repr__(self) -> str:
        return (
            f"ModelConfig({self.architecture}, layers={self.num_hidden_layers}, "
            f"hidden={self.hidden_size}, heads={self.num_attention_heads}/"
            f"{self.num_key_value_heads}, head_dim={self.head_dim}, dtype=torch.{self.dtype_name}, "
            f"context_len={self.context_len})"
        )


# What transformers' config class of a model type fills in for a key config.json leaves
# out, where it differs from the fallbacks read elsewhere here (llama's: rope_theta
# 10000, rms_norm_eps 1e-6, no sliding window). Gemma 3's rope thetas: models/gemma3.py.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 4096},
    "mixtral": {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-5},
    "gemma2": {"sliding_window": 4096, "head_dim": 256, "query_pre_attn_scalar": 256,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {"sliding_window": 4096, "head_dim": 256, "query_pre_attn_scalar": 256,
                    "hidden_activation": "gelu_pytorch_tanh"},
}  # fmt: skip


def _with_hf_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json with its model type's transformers defaults for the keys it omits."""
    defaults = _HF_DEFAULTS.get(raw.get("model_type"), {})
    params = raw.get("rope_parameters") or {}
    missing = {
        key: value for key, value in defaults.items()
        if key not in raw and not (key == "rope_theta" and "rope_theta" in params)
    }  # fmt: skip
    return {**raw, **missing}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"model config not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot parse {path}: {e}") from e


def _load_hf_config(model_path: str, raw: dict[str, Any], trust_remote_code: bool):
    """The transformers config object; a plain PretrainedConfig for unknown model types."""
    from transformers import AutoConfig, PretrainedConfig

    try:
        return AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as e:
        logger.warning("AutoConfig could not read %s (%s); using the raw dict", model_path, e)
        return PretrainedConfig(**raw)


def _resolve_dtype_name(dtype: str | torch.dtype | None, raw: dict[str, Any]) -> str:
    """The torch attribute name of the dtype to run in (a torch.dtype passes through)."""
    if dtype is not None and not isinstance(dtype, str):  # a torch.dtype
        return str(dtype).removeprefix("torch.")
    if dtype in (None, "auto"):
        name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        return _DTYPES.get(str(name).replace("torch.", ""), "float32")
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _context_len(raw: dict[str, Any], override: int | None, longer_ok: bool) -> int:
    derived = model_context_len(raw) or DEFAULT_CONTEXT_LEN
    if override is None:
        return derived
    check_context_override(override, derived, longer_ok)
    if override > derived:
        logger.warning("context_length %d exceeds the model's %d", override, derived)
    return int(override)


def _active_window(raw: dict[str, Any]) -> int | None:
    """The sliding window HF applies to sliding layers (None: none, or not implemented)."""
    window = raw.get("sliding_window")
    if raw.get("model_type") in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return None
    if raw.get("model_type") not in WINDOWED_MODEL_TYPES or not window:
        return None
    return int(window)


def _layer_types(raw: dict[str, Any], num_layers: int) -> list[str]:
    """'sliding_attention' or 'full_attention' per layer: config.json's `layer_types`, else
    HF's default: every other layer (Gemma 2), five in six (Gemma 3), from
    `max_window_layers` on (Qwen2/Qwen3 with a window), all (Mistral with a window)."""
    model_type = raw.get("model_type")
    if model_type == "mistral":  # HF's Mistral ignores layer_types
        sliding = _active_window(raw) is not None
        return ["sliding_attention" if sliding else "full_attention"] * num_layers
    if raw.get("layer_types"):
        return list(raw["layer_types"][:num_layers])
    if model_type in ("gemma2", "gemma3_text"):
        period = 2 if model_type == "gemma2" else int(raw.get("sliding_window_pattern", 6))
        return [
            "sliding_attention" if (i + 1) % period else "full_attention" for i in range(num_layers)
        ]
    first = int(raw.get("max_window_layers", 28)) if _active_window(raw) else num_layers
    return ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]


def _layer_windows(raw: dict[str, Any], layer_types: list[str]) -> list[int | None]:
    window = _active_window(raw)
    return [window if t == "sliding_attention" else None for t in layer_types]


def _cap_to_sliding_window(raw: dict[str, Any], context_len: int) -> int:
    """Model types without sliding-window attention keep sequences inside the window."""
    capped = window_capped_context(raw, context_len)
    if capped < context_len:
        logger.warning(
            "sliding-window attention is not supported for %s; context length capped from "
            "%d to the window, %d tokens", raw.get("model_type"), context_len, capped,
        )  # fmt: skip
    return capped


# generation_config.json fields a request's unset sampling fields default to (SGLang's
# and vLLM's list)
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _sampling_defaults(model_dir: Path) -> dict[str, Any]:
    """The sampling fields the model's generation_config.json recommends."""
    gen_path = model_dir / "generation_config.json"
    if not gen_path.is_file():
        return {}
    gen = _read_json(gen_path)
    return {k: gen[k] for k in SAMPLING_DEFAULT_FIELDS if gen.get(k) is not None}


def _eos_token_ids(model_dir: Path, raw: dict[str, Any]) -> set[int]:
    """EOS ids from config.json and generation_config.json (either may be int or list)."""
    ids: set[int] = set()
    sources = [raw]
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        sources.append(_read_json(gen_path))
    for src in sources:
        eos = src.get("eos_token_id")
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(i) for i in eos)
    return ids
