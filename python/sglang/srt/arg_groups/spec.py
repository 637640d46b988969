"""The `spec` namespace: speculative decoding (STANDALONE draft model, NGRAM lookup)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg
from sglang.srt.arg_groups.exec_ import ATTENTION_BACKEND_CHOICES
from sglang.srt.arg_groups.model import LOAD_FORMAT_CHOICES

SPECULATIVE_ALGORITHM_CHOICES = ("STANDALONE", "EAGLE", "NGRAM")
DRAFT_MODEL_ALGORITHMS = ("STANDALONE", "EAGLE")
SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT = 16  # measured: benchmark/bench_speculative.py (RESULTS.md)


@dataclass(kw_only=True)
class SpecArgs:
    _NS_PATH = "spec"

    speculative_algorithm: str | None = arg(
        None,
        "Speculative decoding: STANDALONE (a small draft model of the same tokenizer) or "
        "NGRAM (lookup in the request's own tokens). Default: off.",
        choices=SPECULATIVE_ALGORITHM_CHOICES,
        unsupported="EAGLE drafting (an EAGLE draft head)",
        unsupported_values=("EAGLE",),
    )
    speculative_draft_model_path: str | None = arg(
        None, "Draft checkpoint (STANDALONE). Default: the bundled demo draft, if installed."
    )
    speculative_num_steps: int | None = arg(
        None, "Draft tokens proposed per verify round (STANDALONE and NGRAM). Default: 3."
    )
    speculative_num_draft_tokens: int | None = arg(
        None, "Tokens verified per round: num_steps + 1 (chain drafting). Default: num_steps + 1."
    )
    speculative_eagle_topk: int | None = arg(
        None, "Draft branching per step; only 1 (chain drafting) is implemented. Default: 1."
    )
    speculative_draft_attention_backend: str | None = arg(
        None,
        "Attention backend of the draft runner. Default: the target's.",
        choices=ATTENTION_BACKEND_CHOICES,
    )
    speculative_draft_load_format: str | None = arg(
        None,
        "Weight format of the draft. Default: the target's load format.",
        choices=LOAD_FORMAT_CHOICES,
    )
    speculative_ngram_min_match_window_size: int = arg(
        1, "NGRAM: shortest suffix of a request's tokens that may match earlier tokens."
    )
    speculative_ngram_max_match_window_size: int = arg(
        12, "NGRAM: longest suffix tried first (the longest match proposes)."
    )
    speculative_disable_by_batch_size: int = arg(
        SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT,
        "Decode without drafting while more requests than this are running (verifying "
        "costs more than it saves in large batches). Default 16: on a 2-core CPU with the "
        "demo pair NGRAM gains 1.0-1.3x at 16 running requests and loses 10-17% at 64 "
        "(benchmark/bench_speculative.py).",
    )
