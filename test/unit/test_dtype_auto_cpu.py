"""dtype auto on cpu: a bf16/fp16 checkpoint keeps its dtype only where the CPU has
AMX matmuls for it (read from /proc/cpuinfo flags), float32 elsewhere: the AVX-512
bf16/fp16 dot products alone are slower than float32 through torch's linear."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang.srt.arg_groups import resolvers

XEON_NO_BF16 = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
EPYC_BF16 = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
XEON_BF16_NO_AMX = "flags\t\t: fpu avx512f avx512_bf16 avx512_fp16 avx512_vnni\n"
SPR_AMX = "flags\t\t: fpu avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_fp16 amx_tile\n"


def _checkpoint(tmp_path: Path, dtype: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": dtype}))
    return str(tmp_path)


def _resolve(tmp_path, monkeypatch, dtype: str, cpuinfo: str, device: str = "cpu") -> str:
    info = tmp_path / "cpuinfo"
    info.write_text(cpuinfo)
    real = resolvers.cpu_native_half_flags
    monkeypatch.setattr(resolvers, "cpu_native_half_flags", lambda d: real(d, info))
    c = SimpleNamespace(dtype="auto", model_path=_checkpoint(tmp_path, dtype), device=device)
    _, decided = resolvers.resolve_dtype(c)
    return decided["dtype"]


@pytest.mark.parametrize(
    "checkpoint,cpuinfo,expected",
    [
        ("bfloat16", XEON_NO_BF16, "float32"),
        ("bfloat16", EPYC_BF16, "float32"),  # avx512_bf16 without AMX: float32 is faster
        ("bfloat16", XEON_BF16_NO_AMX, "float32"),
        ("float16", XEON_BF16_NO_AMX, "float32"),
        ("float16", SPR_AMX, "float16"),
        ("bfloat16", SPR_AMX, "bfloat16"),
        ("float32", SPR_AMX, "float32"),
        ("bfloat16", "", "float32"),  # no flags line (not x86): float32
    ],
)
def test_cpu_keeps_half_only_with_amx(
    tmp_path, monkeypatch, checkpoint, cpuinfo, expected
):
    assert _resolve(tmp_path, monkeypatch, checkpoint, cpuinfo) == expected


def test_gpu_keeps_the_checkpoint_dtype(tmp_path, monkeypatch):
    assert _resolve(tmp_path, monkeypatch, "bfloat16", XEON_NO_BF16, "cuda") == "bfloat16"


def test_explicit_dtype_is_not_resolved(tmp_path):
    c = SimpleNamespace(dtype="bfloat16", model_path=_checkpoint(tmp_path, "float32"), device="cpu")
    assert resolvers.resolve_dtype(c) is None


def test_unreadable_cpuinfo_means_no_native_half(tmp_path):
    assert resolvers.cpu_native_half_flags("bfloat16", tmp_path / "missing") == ""
