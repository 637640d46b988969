"""The `exec` namespace and its sub-namespaces: how a forward runs.

`exec` itself holds `random_seed`; kernels, graphs and feature backends live in
`exec.kernel`, `exec.graph` and `exec.features`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

ATTENTION_BACKEND_CHOICES = ("torch_native", "triton", "flashinfer")
SAMPLING_BACKEND_CHOICES = ("pytorch", "flashinfer")
FP8_KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")
# "bf16": SGLang's name for bfloat16 (resolved to it, source dtype_alias)
KV_CACHE_DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16", "bf16", *FP8_KV_DTYPES)
GRAMMAR_BACKEND_CHOICES = ("xgrammar", "outlines", "llguidance", "none")
CUDA_GRAPHS_ON_CPU = "CUDA graphs exist only on CUDA devices"


@dataclass(kw_only=True)
class ExecArgs:
    _NS_PATH = "exec"

    random_seed: int | None = arg(
        None, "Random seed. Default: an int chosen at resolution (shown in /server_info)."
    )


@dataclass(kw_only=True)
class ExecKernelArgs:
    _NS_PATH = "exec.kernel"

    attention_backend: str | None = arg(
        None,
        "Attention kernels. Default: torch_native on cpu; on cuda flashinfer when it is "
        "importable and the model runs in float16/bfloat16 with head_dim 64/128/256, else "
        "triton (ROCm: triton) when importable, else torch_native.",
        choices=ATTENTION_BACKEND_CHOICES,
    )
    sampling_backend: str | None = arg(
        None,
        "Sampling kernels. Default: pytorch.",
        choices=SAMPLING_BACKEND_CHOICES,
        unsupported="flashinfer sampling kernels",
        unsupported_values=("flashinfer",),
    )
    kv_cache_dtype: str = arg(
        "auto",
        "KV cache dtype; 'auto' follows the model dtype (on cpu, where dtype auto computes a "
        "bf16/fp16 checkpoint in float32, K/V stay in the checkpoint's dtype). fp8_e4m3 / "
        "fp8_e5m2 (cpu only): one byte per value, twice the tokens of a bf16 cache in the "
        "same memory; values past fp8's range saturate (no scales).",
        choices=KV_CACHE_DTYPE_CHOICES,
    )


@dataclass(kw_only=True)
class ExecGraphArgs:
    _NS_PATH = "exec.graph"

    disable_cuda_graph: bool = arg(
        False,
        "Do not capture CUDA graphs for decode (cuda, triton or flashinfer attention, "
        "tp_size 1); decode then always runs eagerly.",
        noop_on={"cpu": CUDA_GRAPHS_ON_CPU},
    )
    cuda_graph_max_bs: int | None = arg(
        None,
        "Largest decode batch captured in a CUDA graph; larger batches run eagerly. "
        "Default: 160, at most --max-running-requests.",
        noop_on={"cpu": CUDA_GRAPHS_ON_CPU},
    )
    enable_torch_compile: bool = arg(
        False,
        "Compile the model forward with torch.compile.",
        unsupported="torch.compile of the model forward",
    )


@dataclass(kw_only=True)
class ExecFeaturesArgs:
    _NS_PATH = "exec.features"

    grammar_backend: str | None = arg(
        None,
        "Constrained-decoding backend (json_schema, regex, ebnf, response_format, "
        "tool_choice required). Default: xgrammar; none turns constrained requests away "
        "with a 400.",
        choices=GRAMMAR_BACKEND_CHOICES,
        unsupported="constrained decoding with outlines or llguidance",
        unsupported_values=("outlines", "llguidance"),
    )
    constrained_json_disable_any_whitespace: bool = arg(
        False,
        "JSON-schema constraints allow no free whitespace (one space after ',' and ':', "
        "as json.dumps writes, nothing else): fewer tokens, and a weak model cannot "
        "wander in whitespace.",
    )
    num_threads: int | None = arg(
        None, "CPU intra-op threads for torch. Default: torch's own choice."
    )
