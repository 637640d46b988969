"""A random-weight checkpoint in Qwen3-0.6B's exact shape, for benchmarks against other engines.

    .venv/bin/python benchmark/make_qwen3_shape_checkpoint.py --out /tmp/qwen3bench/qwen3-0.6b-shape
    .venv/bin/python benchmark/bench_vs_llamacpp.py --model-path /tmp/qwen3bench/qwen3-0.6b-shape \
        --gguf-type bf16 --concurrency 1 8 --num-prompts 8 --input-len 64 --output-len 32 --runs 1

Issue #13 asks for a realistic size next to the small demo model: Qwen3-0.6B's
architecture (28 layers, hidden 1024, MLP 3072, 16 query / 8 KV heads of 128, q/k
norms, tied 151,936-token embedding) at batch 1 and 8, against HF generate and
llama-server on the same weights. No real weights are downloaded: the weights are
seeded random normals (std `--init-std`), saved in bf16 like the released model.

The tokenizer is a byte-level BPE (GPT-2 split, the demo models' layout: the
specials <|endoftext|> <|im_start|> <|im_end|> at ids 0-2) trained here on
Python sources every install of this project has: the standard library
(with its tests) and the installed torch and transformers packages, read in sorted
order; about 30 s on 2 cores. It is trained to the full `vocab_size`
(151,936), so that every id a random model emits decodes to text in both servers:
with a smaller vocabulary (padded up to `vocab_size` with [PAD] ids, as llama.cpp's
converter does) most random-model tokens would decode to nothing, and
bench_serving, which times only chunks that carry text, would misreport TTFT and ITL.
`--tokenizer-vocab` trains a smaller one (ids past it are padding in the GGUF).

Writes config.json, model.safetensors, generation_config.json and the tokenizer
files (tokenizer.json, tokenizer_config.json with a ChatML template,
special_tokens_map.json) into `--out`.
"""

from __future__ import annotations

import argparse
import logging
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

from sglang.test.corpus import EOS_TOKEN, PAD_TOKEN, save_tokenizer_files, train_tokenizer_on

logger = logging.getLogger("make_qwen3_shape_checkpoint")

# Qwen/Qwen3-0.6B's config.json, except max_position_embeddings (40,960 there): a
# benchmark of short prompts needs no more, and it bounds what servers size for.
QWEN3_0_6B_SHAPE = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    hidden_act="silu",
    attention_bias=False,
)
MAX_POSITIONS = 4096


def corpus_documents() -> Iterator[str]:
    """Python sources of the stdlib (tests included), torch and transformers, sorted."""
    import torch
    import transformers

    roots = [Path(sysconfig.get_paths()["stdlib"])]
    roots += [Path(module.__file__).parent for module in (torch, transformers)]
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if {"site-packages", "dist-packages"} & set(path.relative_to(root).parts):
                continue
            try:
                yield path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def train_tokenizer(vocab_size: int):
    start_s = time.perf_counter()
    tokenizer = train_tokenizer_on(corpus_documents(), vocab_size=vocab_size)
    got = tokenizer.get_vocab_size()
    logger.info("trained a %d-token byte-level BPE in %.0f s", got, time.perf_counter() - start_s)
    if got < vocab_size:
        logger.warning("the corpus gave only %d of %d tokens; the rest are padding",
                       got, vocab_size)  # fmt: skip
    return tokenizer


def make_checkpoint(out_dir: Path, seed: int, init_std: float, tokenizer_vocab: int) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab_size = QWEN3_0_6B_SHAPE["vocab_size"]
    if not 0 < tokenizer_vocab <= vocab_size:
        raise ValueError(f"--tokenizer-vocab must be in 1..{vocab_size}")
    tokenizer = train_tokenizer(tokenizer_vocab)
    assert max(tokenizer.get_vocab().values()) < vocab_size
    eos_id, pad_id = tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(PAD_TOKEN)
    config = Qwen3Config(
        **QWEN3_0_6B_SHAPE,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)  # initialised in fp32, stored in bf16
    params = sum(p.numel() for p in model.parameters())
    logger.info("Qwen3 model with %.3f B parameters (embedding tied)", params / 1e9)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False).save_pretrained(
        out_dir
    )
    save_tokenizer_files(tokenizer, out_dir, model_max_length=MAX_POSITIONS)
    logger.info("wrote %s", out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="/tmp/qwen3bench/qwen3-0.6b-shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.02, help="initializer_range")
    parser.add_argument("--tokenizer-vocab", type=int, default=QWEN3_0_6B_SHAPE["vocab_size"],
                        help="tokens to train (default: all of vocab_size, no padding)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    make_checkpoint(Path(args.out), args.seed, args.init_std, args.tokenizer_vocab)


if __name__ == "__main__":
    main()
