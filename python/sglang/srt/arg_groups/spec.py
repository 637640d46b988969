"""The `spec` namespace: speculative decoding (not implemented yet: every field refused)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg
from sglang.srt.arg_groups.exec_ import ATTENTION_BACKEND_CHOICES
from sglang.srt.arg_groups.model import LOAD_FORMAT_CHOICES

SPECULATIVE_ALGORITHM_CHOICES = ("STANDALONE", "EAGLE", "NGRAM")
DRAFT_MODEL_ALGORITHMS = ("STANDALONE", "EAGLE")
SPECULATIVE_ISSUE = "speculative decoding"


@dataclass(kw_only=True)
class SpecArgs:
    _NS_PATH = "spec"

    speculative_algorithm: str | None = arg(
        None,
        "Speculative decoding algorithm. Default: off.",
        choices=SPECULATIVE_ALGORITHM_CHOICES,
        unsupported=SPECULATIVE_ISSUE,
    )
    speculative_draft_model_path: str | None = arg(
        None,
        "Draft checkpoint. Default: the bundled demo draft, if installed.",
        unsupported=SPECULATIVE_ISSUE,
    )
    speculative_num_steps: int | None = arg(
        None, "Draft steps per verify. Default: 3.", unsupported=SPECULATIVE_ISSUE
    )
    speculative_num_draft_tokens: int | None = arg(
        None, "Tokens verified per step. Default: num_steps + 1.", unsupported=SPECULATIVE_ISSUE
    )
    speculative_eagle_topk: int | None = arg(
        None, "Draft branching per step. Default: 1.", unsupported=SPECULATIVE_ISSUE
    )
    speculative_draft_attention_backend: str | None = arg(
        None,
        "Attention backend of the draft runner. Default: the target's.",
        choices=ATTENTION_BACKEND_CHOICES,
        unsupported=SPECULATIVE_ISSUE,
    )
    speculative_draft_load_format: str | None = arg(
        None,
        "Weight format of the draft. Default: the target's load format.",
        choices=LOAD_FORMAT_CHOICES,
        unsupported=SPECULATIVE_ISSUE,
    )
