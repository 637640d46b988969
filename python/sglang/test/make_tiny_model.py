"""Build a tiny random-weight HF checkpoint (Llama / Qwen2 / Qwen3) for tests and demos.

    python -m sglang.test.make_tiny_model --arch llama --out /tmp/tiny-llama

Writes config.json, model.safetensors (float32, seeded), generation_config.json
and the tokenizer files (a byte-level BPE trained on Python's own sources; the
trained tokenizer is cached on disk so building several archs is quick).
"""

from __future__ import annotations

import argparse
import functools
import logging
import tempfile
from pathlib import Path

from sglang.test.corpus import EOS_TOKEN, PAD_TOKEN, save_tokenizer_files, train_tokenizer

logger = logging.getLogger(__name__)

ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "gemma2",
    "gemma3",
    "qwen2_swa",
    "mistral_swa",
)
VOCAB_SIZE = 8192
MAX_POSITIONS = 4096
_SHAPE = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
# MoE: 8 experts, top-2, 2 layers (expert FFNs narrower than the dense one)
_MOE_SHAPE = dict(num_hidden_layers=2, num_experts_per_tok=2)
# sliding-window archs (gemma2, gemma3, qwen2_swa, mistral_swa): a window short prompts already exceed
SLIDING_WINDOW = 16
_TOKENIZER_CACHE = Path(tempfile.gettempdir()) / "sglang_tiny_tokenizer"


@functools.lru_cache(maxsize=2)
def cached_tokenizer(vocab_size: int = VOCAB_SIZE):
    """The trained tokenizer, trained once per machine (cached in the temp dir)."""
    from tokenizers import Tokenizer

    path = _TOKENIZER_CACHE / f"v1-{vocab_size}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tokenizer = train_tokenizer(vocab_size=vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{id(tokenizer)}")
    tokenizer.save(str(tmp))
    tmp.replace(path)  # atomic: concurrent builders never see a half-written file
    return tokenizer


def make_config(arch: str, vocab_size: int, eos_id: int, pad_id: int):
    """A transformers config object for `arch` with the tiny shape."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        _SHAPE,
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=0.05,
    )
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1000000.0)
    if arch == "qwen3":
        # an explicit head_dim that differs from hidden_size / num_heads
        return Qwen3Config(**common, head_dim=128, rope_theta=1000000.0)
    if arch in ("qwen3_moe", "mixtral"):
        return _make_moe_config(arch, {**common, **_MOE_SHAPE})
    if arch in ("gemma2", "gemma3", "qwen2_swa", "mistral_swa"):
        return _make_sliding_config(arch, common)
    raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")


def _make_moe_config(arch: str, common: dict):
    from transformers import MixtralConfig, Qwen3MoeConfig

    if arch == "qwen3_moe":  # norm_topk_prob off (HF's default): raw softmax weights
        return Qwen3MoeConfig(
            **common,
            head_dim=64,
            num_experts=8,
            moe_intermediate_size=128,
            norm_topk_prob=False,
            rope_theta=1000000.0,
        )
    # Mixtral: experts use intermediate_size; top-k weights always renormalised
    return MixtralConfig(**{**common, "intermediate_size": 128}, num_local_experts=8)


def _make_sliding_config(arch: str, common: dict):
    from transformers import Gemma2Config, Gemma3TextConfig, MistralConfig, Qwen2Config

    if arch == "mistral_swa":  # every layer slides
        return MistralConfig(**common, rope_theta=10000.0, sliding_window=SLIDING_WINDOW)
    if arch == "qwen2_swa":  # layers from max_window_layers on slide
        return Qwen2Config(
            **common,
            rope_theta=1000000.0,
            use_sliding_window=True,
            sliding_window=SLIDING_WINDOW,
            max_window_layers=2,
        )
    # query scale 1/sqrt(32), not 1/sqrt(head_dim); tied embeddings, as Gemma ships
    gemma = dict(
        common,
        head_dim=64,
        query_pre_attn_scalar=32,
        sliding_window=SLIDING_WINDOW,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    )
    if arch == "gemma2":  # sliding / global alternate; caps small enough to bend the scores
        return Gemma2Config(
            **gemma, attn_logit_softcapping=2.0, final_logit_softcapping=5.0, rope_theta=10000.0
        )
    return Gemma3TextConfig(
        **gemma,
        layer_types=["sliding_attention"] * 2 + ["full_attention", "sliding_attention"],
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
    )


def _randomize_norms(model) -> None:
    """Gemma's norms scale by 1 + weight and HF initialises the weight to 0: make it count."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3)


def make_tiny_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write the checkpoint for `arch` into `out_dir`; returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    tokenizer = cached_tokenizer()
    eos_id, pad_id = tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(PAD_TOKEN)
    config = make_config(arch, tokenizer.get_vocab_size(), eos_id, pad_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if arch.startswith("gemma"):
        _randomize_norms(model)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False).save_pretrained(out)
    save_tokenizer_files(tokenizer, out, model_max_length=MAX_POSITIONS)
    logger.info("wrote tiny %s checkpoint to %s", arch, out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHS, default="llama")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    make_tiny_model(args.arch, args.out, args.seed)


if __name__ == "__main__":
    main()
