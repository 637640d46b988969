"""Streaming detokenization cost per token, by tokenizer kind and output length.

    python benchmark/bench_detokenizer.py [--lengths 1000 4000] [--rounds 3]

One request streamed a token at a time through `IncrementalDetokenizer` (what the
detokenizer does for every running stream at every step), for:
- the demo model's byte-level BPE (no clean-up pass);
- a Unigram tokenizer whose decode runs transformers' clean-up pass (" ." -> ".");
- a byte-level BPE that sets `clean_up_tokenization_spaces` (as Llama 3's does), where
  transformers 5 skips the pass.
Prints the median ms per token over `--rounds` for each length, and checks that the
streamed text equals `tokenizer.decode(ids)`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer
from sglang.srt.managers.io_struct import DecodeParams
from sglang.test.sentencepiece_tokenizer import save_sentencepiece_tokenizer

DEMO = Path(__file__).resolve().parents[1] / "python" / "sglang" / "demo_models" / "target"
WORDS = "the dog ' s name , and the cat is n't here . where are you ? I 'm fine".split()


def tokenizers(workdir: Path) -> dict[str, object]:
    save_sentencepiece_tokenizer(workdir / "unigram", "unigram")
    flagged = AutoTokenizer.from_pretrained(str(DEMO))
    flagged.clean_up_tokenization_spaces = True
    return {
        "byte-level BPE (demo)": AutoTokenizer.from_pretrained(str(DEMO)),
        "Unigram, clean-up pass": AutoTokenizer.from_pretrained(str(workdir / "unigram")),
        "byte-level BPE, flag set (Llama 3)": flagged,
    }


def ms_per_token(tokenizer: object, ids: list[int]) -> float:
    detok, params, text = IncrementalDetokenizer(tokenizer), DecodeParams(stream=True), ""
    start = time.perf_counter()
    for i, token in enumerate(ids):
        finish = {"type": "length", "matched": None} if i == len(ids) - 1 else None
        text += detok.step(["r"], [[token]], [finish], [params])[0]
    elapsed = time.perf_counter() - start
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    return elapsed / len(ids) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    text = " ".join(random.Random(0).choice(WORDS) for _ in range(3 * max(args.lengths)))
    with tempfile.TemporaryDirectory() as tmp:
        for name, tokenizer in tokenizers(Path(tmp)).items():
            ids = tokenizer.encode(text, add_special_tokens=False)
            for length in args.lengths:
                times = [ms_per_token(tokenizer, ids[:length]) for _ in range(args.rounds)]
                print(f"{name:38s} {length:6d} tokens  {statistics.median(times):.3f} ms/token")


if __name__ == "__main__":
    main()
