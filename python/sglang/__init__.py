"""An SGLang-compatible LLM inference server.

`import sglang` stays light: the Engine (and torch with it) loads on first use, and
RayEngine (and ray, an optional extra) likewise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Engine", "RayEngine", "__version__"]

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.entrypoints.ray_engine import RayEngine


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    if name == "RayEngine":
        from sglang.srt.entrypoints.ray_engine import RayEngine

        return RayEngine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
