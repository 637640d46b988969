"""`torch.cuda.is_available()` without importing torch, for the launcher.

The launcher resolves `--device auto` but never runs the model, and importing
torch costs it ~250 MB of RSS. The answer is the same as torch's: False unless
the installed torch was built with CUDA, then whether the CUDA driver sees a
device (honouring CUDA_VISIBLE_DEVICES, as cudaGetDeviceCount does). A ROCm
build asks torch itself.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from pathlib import Path

CUDA_SUCCESS = 0


def cuda_available() -> bool:
    build = torch_build_accelerators()
    if build.get("hip"):
        import torch

        return torch.cuda.is_available()
    return bool(build.get("cuda")) and cuda_device_count() > 0


def torch_build_accelerators() -> dict[str, str | None]:
    """{"cuda": version or None, "hip": ...} read from torch/version.py, not imported."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_py.read_text()
    except OSError:
        return {}
    return {key: _assigned_string(text, key) for key in ("cuda", "hip")}


def _assigned_string(text: str, name: str) -> str | None:
    """The string literal `name` is assigned in version.py, or None."""
    match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def cuda_device_count() -> int:
    """Devices the CUDA driver API reports (0 without a driver or device)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if libcuda.cuInit(0) != CUDA_SUCCESS:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuDeviceGetCount(ctypes.byref(count)) != CUDA_SUCCESS:
        return 0
    return count.value
