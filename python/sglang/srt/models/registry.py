"""Model classes by HF architecture name (`architectures[0]` of config.json)."""

from __future__ import annotations

import importlib

from torch import nn

_MODEL_MODULES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3")


def _build_registry() -> dict[str, type[nn.Module]]:
    registry: dict[str, type[nn.Module]] = {}
    for name in _MODEL_MODULES:
        module = importlib.import_module(f"sglang.srt.models.{name}")
        for cls in module.EntryClass:
            registry[cls.__name__] = cls
        registry.update(getattr(module, "EntryClassAliases", {}))
    return registry


class ModelRegistry:
    _models: dict[str, type[nn.Module]] | None = None

    @classmethod
    def models(cls) -> dict[str, type[nn.Module]]:
        if cls._models is None:
            cls._models = _build_registry()
        return cls._models

    @classmethod
    def supported_architectures(cls) -> list[str]:
        return sorted(cls.models())

    @classmethod
    def resolve(cls, architectures: list[str]) -> type[nn.Module]:
        """The class for the first supported name; ValueError listing the supported ones."""
        for arch in architectures:
            if arch in cls.models():
                return cls.models()[arch]
        raise ValueError(
            f"unsupported model architecture {architectures or '(none in config.json)'}; "
            f"supported: {', '.join(cls.supported_architectures())}"
        )
