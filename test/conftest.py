"""Session-wide fixtures: tiny HF checkpoints built once per test session."""

from __future__ import annotations

import logging
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


@pytest.fixture(autouse=True, scope="module")
def _sglang_log_level_per_module():
    """An Engine(log_level=...) sets the `sglang` logger's level in this process: each
    module starts from the default, so log-reading tests do not depend on the order."""
    yield
    logging.getLogger("sglang").setLevel(logging.NOTSET)


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
def amx_tiles() -> Callable[[bool], bool]:
    """amx_tiles(on) -> whether bf16 linears now take AMX tiles: turns the kernels' AMX
    path on or off for this test (SGLANG_CPU_AMX's switch), set back to the variable's
    value after. On a CPU without AMX it stays off, so a test of the other routing runs
    on any CPU."""
    from sglang.srt.environ import envs
    from sglang.srt.layers import cpu_kernels

    kernels = cpu_kernels.load()
    assert kernels is not None, "the CPU kernels must build here"

    def choose(on: bool) -> bool:
        kernels.use_amx_tiles(on)
        return kernels.amx_tiles()

    yield choose
    kernels.use_amx_tiles(envs.SGLANG_CPU_AMX.get())
