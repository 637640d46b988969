"""The `model` namespace: which checkpoint, tokenizer and numerics."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16", "half", "float")
LOAD_FORMAT_CHOICES = ("auto", "safetensors", "pt", "dummy")
TOKENIZER_MODE_CHOICES = ("auto", "slow")


@dataclass(kw_only=True)
class ModelArgs:
    _NS_PATH = "model"

    model_path: str | None = arg(
        None,
        "Local checkpoint directory or hub id. Default: the bundled demo model, if installed.",
    )
    tokenizer_path: str | None = arg(None, "Tokenizer directory or hub id. Default: model path.")
    tokenizer_mode: str = arg(
        "auto",
        "Tokenizer mode: 'auto' uses the fast tokenizer.",
        choices=TOKENIZER_MODE_CHOICES,
        unsupported="tokenizer modes",
    )
    skip_tokenizer_init: bool = arg(
        False, "Do not load a tokenizer; requests carry input_ids and return output_ids."
    )
    trust_remote_code: bool = arg(False, "Allow custom model code from the hub.")
    is_embedding: bool = arg(
        False,
        "Serve the model as an embedding model (last-token pooling, L2-normalised): "
        "/v1/embeddings and Engine.encode answer; generation requests are refused.",
    )
    dtype: str = arg(
        "auto",
        "Weight and activation dtype. 'auto' takes config.json's dtype; on cpu a bf16/fp16 "
        "checkpoint runs in float32 unless the CPU has AMX bf16/fp16 matmuls "
        "(amx_bf16, amx_fp16) or, for bf16 on AMD, the AVX-512 bf16 dot product (avx512_bf16).",
        choices=DTYPE_CHOICES,
    )
    context_length: int | None = arg(
        None, "Maximum context length (tokens). Default: from config.json."
    )
    load_format: str = arg(
        "auto",
        "Weight format; 'dummy' initializes random weights without reading files.",
        choices=LOAD_FORMAT_CHOICES,
    )
    revision: str | None = arg(None, "Hub revision (branch, tag or commit) of the model.")
