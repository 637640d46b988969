"""A tiny SentencePiece-style tokenizer for tests: what Llama 2, Mistral and Gemma ship.

BPE with byte fallback (`<0x..>` tokens for bytes no piece covers) and `▁` for spaces
(Metaspace), or Unigram with transformers' clean-up pass (" ." -> "."). Their decoders
differ from byte-level BPE's: a run of byte tokens that is not valid UTF-8 as a whole
decodes to one U+FFFD per byte, and a piece's leading space depends on what precedes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from sglang.test.corpus import iter_corpus

BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]
SPECIAL = ["<unk>", "<s>", "</s>"]
_METASPACE = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}


def save_sentencepiece_tokenizer(
    out_dir: str | os.PathLike, kind: str = "bpe", vocab_size: int = 700
) -> int:
    """Write tokenizer.json + tokenizer_config.json into `out_dir`; the vocabulary size.
    kind: "bpe" (byte fallback, Mistral's layout) or "unigram" (with clean-up spaces)."""
    text = list(iter_corpus(max_bytes=200_000))
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIAL + BYTE_TOKENS,
                                          unk_token="<unk>", max_piece_length=8)  # fmt: skip
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL + BYTE_TOKENS,
                                      limit_alphabet=80)  # fmt: skip
    tok.train_from_iterator(text, trainer)
    spec = json.loads(tok.to_str())
    # byte tokens live in the vocabulary, not among the added tokens (as Llama's file)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in BYTE_TOKENS]
    spec["model"]["byte_fallback"] = True
    spec["normalizer"] = None
    spec["pre_tokenizer"] = dict(_METASPACE)
    spec["decoder"] = dict(_METASPACE)
    if kind == "bpe":  # Llama's decoder chain: byte fallback, fuse, one leading space off
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}  # fmt: skip
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizerFast" if kind == "bpe" else "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "legacy": False,
        "clean_up_tokenization_spaces": kind == "unigram",
        "model_max_length": 4096,
    }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.get_vocab_size()
