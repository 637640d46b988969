"""arg_groups/cuda_probe: torch.cuda.is_available()'s answer without importing torch."""

from __future__ import annotations

import subprocess
import sys

from sglang.srt.arg_groups.cuda_probe import _assigned_string, cuda_available


def test_reads_torch_version_assignments():
    text = "cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\nxpu = \"x\"\n"
    assert _assigned_string(text, "cuda") == "12.8"
    assert _assigned_string(text, "hip") is None
    assert _assigned_string(text, "xpu") == "x"


def test_agrees_with_torch():
    import torch

    assert cuda_available() == torch.cuda.is_available()


def test_does_not_import_torch():
    code = (
        "import sys\nfrom sglang.srt.arg_groups.cuda_probe import cuda_available\n"
        "cuda_available()\nassert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
