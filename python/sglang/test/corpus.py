"""Training text every install has at hand, and a byte-level BPE tokenizer trained on it.

The corpus is Python's own standard-library sources (PSF License) plus the
`pydoc_data` topics, read in a sorted, deterministic order. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# A ChatML template (the layout Qwen models use); `add_generation_prompt` opens
# the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def stdlib_source_files() -> list[Path]:
    """Sorted .py files of the standard library (no site-packages, no tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if rel[0] in {"site-packages", "dist-packages", "test", "idlelib", "lib2to3"}:
            continue
        files.append(path)
    return sorted(files)


def pydoc_topics_text() -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def iter_corpus(max_bytes: int | None = None) -> Iterator[str]:
    """Yield documents (pydoc topics first, then stdlib files) up to `max_bytes`."""
    total_bytes = 0
    docs: Iterator[str] = _iter_documents()
    for doc in docs:
        if max_bytes is not None and total_bytes >= max_bytes:
            return
        total_bytes += len(doc.encode("utf-8"))
        yield doc


def _iter_documents(skip: frozenset[Path] = frozenset()) -> Iterator[str]:
    yield pydoc_topics_text()
    for path in stdlib_source_files():
        if path in skip:
            continue
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def train_tokenizer(vocab_size: int = 8192, max_bytes: int = 4_000_000):
    """Train a byte-level BPE `tokenizers.Tokenizer` on the corpus (deterministic)."""
    return train_tokenizer_on(iter_corpus(max_bytes), vocab_size)


def save_tokenizer_files(tokenizer, out_dir: str | os.PathLike, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json (with chat template), special_tokens_map.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    specials = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


# A fixed set of standard-library files the demo models never train on; the held-out
# loss in the demo model card and in its tests is measured on these (in this order).
HELDOUT_STDLIB_FILES = (
    "textwrap.py",
    "fractions.py",
    "heapq.py",
    "shlex.py",
    "calendar.py",
    "difflib.py",
    "json/decoder.py",
    "sched.py",
    "colorsys.py",
    "statistics.py",
    "graphlib.py",
    "netrc.py",
    "queue.py",
    "zipapp.py",
    "email/quoprimime.py",
)


def heldout_documents() -> list[str]:
    """The held-out stdlib files' text, in `HELDOUT_STDLIB_FILES` order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(root / rel).read_text(encoding="utf-8") for rel in HELDOUT_STDLIB_FILES]


def iter_train_documents() -> Iterator[str]:
    """The corpus of `iter_corpus` without the held-out files (pydoc topics first)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    yield from _iter_documents(frozenset(root / rel for rel in HELDOUT_STDLIB_FILES))


def train_tokenizer_on(documents, vocab_size: int = 8192):
    """Like `train_tokenizer`, but on the given documents (e.g. the train split only)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer
