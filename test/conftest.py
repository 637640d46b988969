"""Session-wide fixtures: tiny HF checkpoints built once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# test/gpu needs a CUDA device: without one it is not collected at all (rather than
# collected and skipped); scripts/gpu_check.sh runs it on a GPU machine
collect_ignore = [] if torch.cuda.is_available() else ["gpu"]


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (test/gpu/, collected only when torch sees one)"
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


@pytest.fixture
def onednn_bf16(monkeypatch) -> Callable[[str], None]:
    """onednn_bf16("on" | "off"): set SGLANG_CPU_ONEDNN_BF16 for this test, so a test of
    either bf16 routing (oneDNN's GEMM past a few rows, as on AMX CPUs, or our bf16 dot
    product) runs it whatever CPU the suite is on; the choice is read once per process,
    so its cache is cleared on both sides of the test."""
    from sglang.srt.layers import cpu_kernels

    def choose(value: str) -> None:
        monkeypatch.setenv("SGLANG_CPU_ONEDNN_BF16", value)
        cpu_kernels.onednn_bf16_gemm.cache_clear()

    yield choose
    cpu_kernels.onednn_bf16_gemm.cache_clear()  # before monkeypatch restores the variable
