"""The small trained demo model pair shipped with the package (see README.md here)."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent


def demo_target_path() -> Path | None:
    """The bundled target checkpoint, or None when this install has none."""
    path = DEMO_DIR / "target"
    return path if (path / "config.json").is_file() else None


def demo_draft_path() -> Path | None:
    """The bundled draft checkpoint (same tokenizer as the target), or None."""
    path = DEMO_DIR / "draft"
    return path if (path / "config.json").is_file() else None
