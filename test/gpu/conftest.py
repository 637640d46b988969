"""GPU tests: marked `gpu`, skipped when torch sees no CUDA device (run by scripts/gpu_check.sh).

Run this directory on its own: test/unit/test_triton_*.py set TRITON_INTERPRET=1 at import,
which would make the Triton kernels run in the interpreter here too.
"""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if "test/gpu" not in str(item.fspath).replace(os.sep, "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available())"))
        elif os.environ.get("TRITON_INTERPRET"):
            item.add_marker(pytest.mark.skip(reason="TRITON_INTERPRET is set: run test/gpu alone"))
