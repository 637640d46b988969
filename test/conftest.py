"""Session-wide fixtures: tiny HF checkpoints built once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (test/gpu/); skipped when torch sees none"
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Callable[[str], Path]:
    """Factory: tiny_model_dir(arch) -> a checkpoint dir for llama / qwen2 / qwen3 (cached)."""
    from sglang.test.make_tiny_model import make_tiny_model

    built: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in built:
            built[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"))
        return built[arch]

    return build


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen3")
