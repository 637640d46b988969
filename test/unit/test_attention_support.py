"""Which attention backend resolution picks, and which explicit choices launch refuses,
with the device, the torch build and flashinfer's presence monkeypatched (no GPU here)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from sglang.srt.arg_groups import attention_support, resolvers
from sglang.srt.arg_groups.attention_support import (
    config_head_dim,
    default_attention_backend,
    flashinfer_unavailable_reason,
)
from sglang.srt.model_executor.model_runner import ModelRunner, RunnerSettings
from sglang.srt.server_args import ServerArgs, resolution_result

_real_find_spec = importlib.util.find_spec


@pytest.fixture
def gpu_packages(monkeypatch):
    """Pretend: flashinfer and triton installed, a CUDA (not ROCm) torch build."""
    installed = {"flashinfer": True, "triton": True}

    def find_spec(name, *args):
        if name in installed:
            return object() if installed[name] else None
        return _real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(attention_support, "is_rocm_build", lambda: False)
    return installed


def test_cpu_always_gets_torch_native(gpu_packages):
    assert default_attention_backend("cpu", "bfloat16", 128) == "torch_native"


def test_cuda_prefers_flashinfer_when_it_can_run(gpu_packages):
    assert default_attention_backend("cuda", "bfloat16", 128) == "flashinfer"
    assert default_attention_backend("cuda", "float16", 64) == "flashinfer"


@pytest.mark.parametrize(
    "kv_dtype, head_dim", [("float32", 128), ("bfloat16", 48), ("bfloat16", None)]
)
def test_cuda_falls_back_to_triton(gpu_packages, kv_dtype, head_dim):
    """float32, an odd head_dim, or a head_dim unknown at resolution: triton."""
    assert default_attention_backend("cuda", kv_dtype, head_dim) == "triton"


def test_cuda_without_flashinfer_or_on_rocm_gets_triton(gpu_packages, monkeypatch):
    gpu_packages["flashinfer"] = False
    assert default_attention_backend("cuda", "bfloat16", 128) == "triton"
    gpu_packages["flashinfer"] = True
    monkeypatch.setattr(attention_support, "is_rocm_build", lambda: True)
    assert default_attention_backend("cuda", "bfloat16", 128) == "triton"


def test_cuda_without_triton_or_flashinfer_gets_torch_native(gpu_packages):
    gpu_packages.update(flashinfer=False, triton=False)
    assert default_attention_backend("cuda", "bfloat16", 128) == "torch_native"


@pytest.mark.parametrize(
    "device, kv_dtype, head_dim, rocm, installed, says",
    [
        ("cpu", "bfloat16", 128, False, True, "runs on cuda only, not cpu"),
        ("cuda", "bfloat16", 128, True, True, "not ROCm"),
        ("cuda", "bfloat16", 128, False, False, "flashinfer package is not installed"),
        ("cuda", "float32", 128, False, True, "float16/bfloat16, not float32"),
        ("cuda", "bfloat16", 96, False, True, "head_dim 96"),
    ],
)
def test_flashinfer_reasons(gpu_packages, monkeypatch, device, kv_dtype, head_dim, rocm, installed, says):  # fmt: skip
    gpu_packages["flashinfer"] = installed
    monkeypatch.setattr(attention_support, "is_rocm_build", lambda: rocm)
    assert says in flashinfer_unavailable_reason(device, kv_dtype, head_dim)


def test_head_dim_from_config():
    assert config_head_dim({"hidden_size": 1024, "num_attention_heads": 16}) == 64
    assert config_head_dim({"hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128}) == 128
    assert config_head_dim({"text_config": {"hidden_size": 512, "num_attention_heads": 4}}) == 128
    assert config_head_dim(None) is None


def _checkpoint(tmp_path, dtype: str, head_dim: int = 128) -> str:
    config = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "head_dim": head_dim,
              "num_attention_heads": 16, "max_position_embeddings": 4096, "torch_dtype": dtype}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "dtype, backend", [("bfloat16", "flashinfer"), ("float16", "flashinfer"), ("float32", "triton")]
)
def test_resolution_on_cuda_reads_the_checkpoint(gpu_packages, tmp_path, dtype, backend):
    """dtype auto keeps the checkpoint's dtype on cuda, and the backend follows it."""
    sa = ServerArgs(model_path=_checkpoint(tmp_path, dtype), device="cuda").resolve_once()
    assert resolution_result(sa, "dtype") == dtype
    assert resolution_result(sa, "attention_backend") == backend


def test_resolution_on_cpu_runs_half_checkpoints_in_float32(gpu_packages, tmp_path, monkeypatch):
    monkeypatch.setattr(resolvers, "cpu_native_half_flags", lambda dtype: "")  # no fast bf16
    sa = ServerArgs(model_path=_checkpoint(tmp_path, "bfloat16"), device="cpu").resolve_once()
    assert resolution_result(sa, "dtype") == "float32"
    assert resolution_result(sa, "attention_backend") == "torch_native"


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"device": "cpu"}, "cannot run on cpu"),
        ({"device": "cuda", "dtype": "float32"}, "not float32"),
        ({"device": "cuda", "kv_cache_dtype": "float32"}, "not float32"),
    ],
)
def test_explicit_flashinfer_that_cannot_run_fails_at_launch(gpu_packages, tmp_path, fields, says):
    args = {"model_path": _checkpoint(tmp_path, "bfloat16"), "attention_backend": "flashinfer"}
    with pytest.raises(ValueError, match=rf"attention_backend='flashinfer'.*{says}"):
        ServerArgs(**args, **fields).resolve_once()


def test_explicit_flashinfer_on_an_unsupported_head_dim_fails(gpu_packages, tmp_path):
    path = _checkpoint(tmp_path, "bfloat16", head_dim=80)
    with pytest.raises(ValueError, match="head_dim 80"):
        ServerArgs(model_path=path, device="cuda", attention_backend="flashinfer").resolve_once()


def test_explicit_flashinfer_on_cuda_is_accepted(gpu_packages, tmp_path):
    sa = ServerArgs(
        model_path=_checkpoint(tmp_path, "bfloat16"), device="cuda", attention_backend="flashinfer"
    ).resolve_once()
    assert resolution_result(sa, "attention_backend") == "flashinfer"


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_runs_on_cpu_and_is_refused_on_gpus(gpu_packages, tmp_path, kv):
    path = _checkpoint(tmp_path, "bfloat16")
    sa = ServerArgs(model_path=path, device="cpu", kv_cache_dtype=kv).resolve_once()
    assert resolution_result(sa, "kv_cache_dtype") == kv
    with pytest.raises(
        ValueError, match=rf"kv_cache_dtype='{kv}' is not accepted on cuda.*cpu only"
    ):
        ServerArgs(model_path=path, device="cuda", kv_cache_dtype=kv).resolve_once()


_FP8_TORCH_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _runner_on(device: str, kv_cache_dtype: str, backend: str = "torch_native") -> ModelRunner:
    """A runner with only the settings the KV dtype rule reads (no model load)."""
    runner = ModelRunner.__new__(ModelRunner)
    runner.settings = RunnerSettings(
        device=device, attention_backend=None, load_format="auto", kv_cache_dtype=kv_cache_dtype
    )
    runner.device = torch.device(device)
    runner.attention_backend_name = backend
    return runner


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_under_device_auto_is_refused_by_a_gpu_runner(kv):
    """--device auto passes launch validation (the device is not known yet); the runner,
    on the resolved device, refuses before it sizes a pool the GPU kernels cannot read."""
    assert _runner_on("cpu", kv).kv_cache_dtype == _FP8_TORCH_DTYPES[kv]
    with pytest.raises(ValueError, match=rf"kv_cache_dtype='{kv}' is not accepted on cuda"):
        _ = _runner_on("cuda", kv).kv_cache_dtype


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_is_refused_with_an_attention_backend_that_cannot_read_it(
    gpu_packages, tmp_path, monkeypatch, kv
):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton itself may run on cpu here
    path = _checkpoint(tmp_path, "bfloat16")
    draft = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": path}
    for field, extra in (("attention_backend", {}), ("speculative_draft_attention_backend", draft)):
        with pytest.raises(ValueError, match=rf"{field}='triton'.*only torch_native"):
            ServerArgs(
                model_path=path, device="cpu", kv_cache_dtype=kv, **{field: "triton"}, **extra
            ).resolve_once()
    with pytest.raises(ValueError, match=r"attention backend 'triton'.*only torch_native"):
        _ = _runner_on("cpu", kv, backend="triton").kv_cache_dtype
