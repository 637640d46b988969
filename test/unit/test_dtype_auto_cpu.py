"""dtype auto on cpu: a bf16/fp16 checkpoint keeps its dtype only where the CPU runs its
matmuls natively and faster than float32 (read from /proc/cpuinfo): AMX on any vendor, or
for bf16 the AVX-512 bf16 dot product on AMD; float32 elsewhere (an Intel Xeon with
avx512_bf16 but no AMX ran torch's bf16 linear slower than float32)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang.srt.arg_groups import resolvers

INTEL = "vendor_id\t: GenuineIntel\n"
AMD = "vendor_id\t: AuthenticAMD\n"
XEON_NO_BF16 = INTEL + "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
EPYC_BF16 = AMD + "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
EPYC_AVX2 = AMD + "flags\t\t: fpu sse2 avx2 fma f16c\n"
XEON_BF16_NO_AMX = INTEL + "flags\t\t: fpu avx512f avx512_bf16 avx512_fp16 avx512_vnni\n"
SPR_AMX = INTEL + "flags\t\t: fpu avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_fp16 amx_tile\n"


def _checkpoint(tmp_path: Path, dtype: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": dtype}))
    return str(tmp_path)


def _resolve(tmp_path, monkeypatch, dtype: str, cpuinfo: str, device: str = "cpu") -> str:
    return _decide(tmp_path, monkeypatch, dtype, cpuinfo, device)["dtype"]


def _decide(tmp_path, monkeypatch, dtype: str, cpuinfo: str, device: str = "cpu",
            kv_cache_dtype: str = "auto") -> dict:
    """What resolve_dtype declares for a checkpoint of `dtype` on a CPU with `cpuinfo`."""
    info = tmp_path / "cpuinfo"
    info.write_text(cpuinfo)
    real = resolvers.cpu_native_half_flags
    monkeypatch.setattr(resolvers, "cpu_native_half_flags", lambda d: real(d, info))
    c = SimpleNamespace(dtype="auto", model_path=_checkpoint(tmp_path, dtype), device=device,
                        kv_cache_dtype=kv_cache_dtype)
    _, decided = resolvers.resolve_dtype(c)
    return decided


@pytest.mark.parametrize(
    "checkpoint,cpuinfo,expected",
    [
        ("bfloat16", XEON_NO_BF16, "float32"),
        ("bfloat16", EPYC_BF16, "bfloat16"),  # Zen 4+: bf16 dot products beat float32
        ("float16", EPYC_BF16, "float32"),  # no fp16 matmuls there
        ("bfloat16", EPYC_AVX2, "float32"),  # Zen 1-3: no bf16 instructions
        ("bfloat16", XEON_BF16_NO_AMX, "float32"),  # Intel without AMX: float32 is faster
        ("float16", XEON_BF16_NO_AMX, "float32"),
        ("float16", SPR_AMX, "float16"),
        ("bfloat16", SPR_AMX, "bfloat16"),
        ("float32", SPR_AMX, "float32"),
        ("bfloat16", "", "float32"),  # no flags line (not x86): float32
    ],
)
def test_cpu_keeps_half_only_where_native_is_faster(
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


def test_the_log_names_what_was_looked_for():
    assert resolvers.native_half_flags_wanted("bfloat16") == "amx_bf16, or avx512_bf16 on AuthenticAMD"
    assert resolvers.native_half_flags_wanted("float16") == "amx_fp16"


@pytest.mark.parametrize(
    "checkpoint,cpuinfo,kv,expected",
    [
        ("bfloat16", EPYC_AVX2, "auto", "bfloat16"),  # widened compute, bf16 K/V
        ("float16", XEON_BF16_NO_AMX, "auto", "float16"),
        ("bfloat16", EPYC_AVX2, "float32", None),  # the operator's choice stands
        ("bfloat16", EPYC_BF16, "auto", None),  # native bf16: K/V follow the model dtype
        ("float32", EPYC_AVX2, "auto", None),
    ],
)
def test_widened_half_checkpoint_keeps_its_kv_dtype(
    tmp_path, monkeypatch, checkpoint, cpuinfo, kv, expected
):
    decided = _decide(tmp_path, monkeypatch, checkpoint, cpuinfo, kv_cache_dtype=kv)
    assert decided.get("kv_cache_dtype") == expected


def test_kv_dtype_is_declared_by_dtype_auto_and_explicit_float32_keeps_float32(
    tmp_path, monkeypatch
):
    """Through ServerArgs: the bf16 K/V show as dtype_auto's declaration; --dtype float32
    (the operator asking for float32) leaves K/V at the model dtype."""
    from sglang.srt.arg_groups.overrides import resolution_result, stash_of
    from sglang.srt.server_args import prepare_server_args

    monkeypatch.setattr(resolvers, "cpu_native_half_flags", lambda d: "")
    path = _checkpoint(tmp_path, "bfloat16")
    sa = prepare_server_args(["--model-path", path, "--device", "cpu"])
    sa.resolve_once()
    assert resolution_result(sa, "kv_cache_dtype") == "bfloat16"
    assert stash_of(sa).sources_of("kv_cache_dtype") == ["dtype_auto"]
    sa = prepare_server_args(["--model-path", path, "--device", "cpu", "--dtype", "float32"])
    sa.resolve_once()
    assert resolution_result(sa, "kv_cache_dtype") == "auto"


@pytest.mark.parametrize("alias,dtype", [("half", "float16"), ("float", "float32")])
def test_a_dtype_alias_resolves_to_the_dtype_that_runs(tmp_path, alias, dtype):
    """/server_info shows the resolution: float16, not the alias the operator typed."""
    from sglang.srt.arg_groups.overrides import resolution_result, stash_of
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", _checkpoint(tmp_path, "float32"), "--device",
                              "cpu", "--dtype", alias])  # fmt: skip
    sa.resolve_once()
    assert sa.dtype == alias  # the record keeps what was typed
    assert resolution_result(sa, "dtype") == dtype
    assert stash_of(sa).sources_of("dtype") == ["dtype_alias"]


def test_kv_cache_dtype_bf16_is_sglangs_name_for_bfloat16(tmp_path):
    # SGLang's --kv-cache-dtype choices name it bf16: it was an argparse error here
    from sglang.srt.arg_groups.overrides import resolution_result, stash_of
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", _checkpoint(tmp_path, "float32"), "--device",
                              "cpu", "--kv-cache-dtype", "bf16"])  # fmt: skip
    sa.resolve_once()
    assert resolution_result(sa, "kv_cache_dtype") == "bfloat16"
    assert stash_of(sa).sources_of("kv_cache_dtype") == ["dtype_alias"]
