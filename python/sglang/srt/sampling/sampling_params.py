"""Per-request sampling parameters (SGLang's names and defaults)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ConfigDict, PrivateAttr, ValidationError

from sglang.srt.sampling.param_types import (
    Flag,
    GrammarText,
    InvalidParamError,
    LogitBias,
    MinP,
    NonNegInt,
    NullTakesTheDefault,
    NumSamples,
    Penalty,
    RepetitionPenalty,
    Seed,
    StopStrings,
    Temperature,
    TokenIds,
    TopK,
    TopP,
    first_error,
)

_TOP_K_ALL = 1 << 30
# Deepest JSON nesting of a json_schema / structural_tag. xgrammar's compile time grows
# about as the cube of the depth (an array-of-array schema: 25 ms at depth 64, 0.13 s at
# 128, 0.9 s at 256, 46 s at 950, on 2 cores), and compiles run one at a time: a deeper
# schema would stall every constrained request behind it.
MAX_GRAMMAR_JSON_DEPTH = 128
_CONSTRAINT_FIELDS = (
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
)  # top_k = -1 means "all tokens"


class SamplingParamsSpec(NullTakesTheDefault):
    """The native `sampling_params` dict: types, ranges, no unknown keys."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: NonNegInt | None = 128
    min_new_tokens: NonNegInt = 0
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = -1
    min_p: MinP = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    stop: StopStrings = None
    stop_token_ids: TokenIds | None = None
    ignore_eos: Flag = False
    skip_special_tokens: Flag = True
    spaces_between_special_tokens: Flag = True
    no_stop_trim: Flag = False
    n: NumSamples = 1
    seed: Seed | None = None
    logit_bias: LogitBias | None = None
    json_schema: GrammarText | None = None
    regex: GrammarText | None = None
    ebnf: GrammarText | None = None
    structural_tag: GrammarText | None = None


class SamplingParams(SamplingParamsSpec):
    """A request's validated sampling parameters, as the scheduler uses them.

    The fields and their rules are SamplingParamsSpec's (one definition); building
    one validates it. `normalize()` then derives `stop_strs` and turns
    `stop_token_ids` into a set (assignments are not re-validated)."""

    _stop_strs: list[str] = PrivateAttr(default_factory=list)

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Build from a request's dict; a wrong key, type or range is an
        InvalidParamError naming the field."""
        if params is not None and not isinstance(params, dict):
            raise InvalidParamError("sampling_params must be an object", "sampling_params")
        try:
            return cls.model_validate(_listify(params or {}))
        except ValidationError as exc:
            raise first_error(exc) from None

    @property
    def stop_strs(self) -> list[str]:
        return self._stop_strs

    @property
    def ends_by_length_only(self) -> bool:
        """Whether only max_new_tokens (or the context length, or an abort) can end the
        request: EOS ignored, no stop strings or stop token ids, no grammar to finish."""
        return (
            self.ignore_eos
            and not self.stop
            and not self.stop_strs
            and not self.stop_token_ids
            and all(getattr(self, name) is None for name in _CONSTRAINT_FIELDS)
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def effective_top_k(self) -> int:
        # any k past the vocabulary means all tokens (and must fit an int64 tensor)
        return _TOP_K_ALL if self.top_k in (-1, 0) else min(self.top_k, _TOP_K_ALL)

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise InvalidParamError naming the first field that breaks a cross-field or
        vocabulary rule (each field's own rule held when this object was built)."""
        max_new = self.max_new_tokens
        if max_new is not None and self.min_new_tokens > max_new:
            raise InvalidParamError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens ({max_new})",
                "min_new_tokens",
            )
        self._verify_token_ids(vocab_size)
        self._verify_grammar()

    def _verify_token_ids(self, vocab_size: int | None) -> None:
        if vocab_size is None:
            return
        for key in self.logit_bias or {}:
            if not 0 <= int(key) < vocab_size:
                raise InvalidParamError(
                    f"logit_bias token id {key} is out of range [0, {vocab_size})", "logit_bias"
                )
        for token_id in self.stop_token_ids or ():
            if token_id >= vocab_size:
                raise InvalidParamError(
                    f"stop_token_ids: token id {token_id} is out of range [0, {vocab_size})",
                    "stop_token_ids",
                )

    def _verify_grammar(self) -> None:
        """At most one constraint; the JSON ones must parse (the rest is checked when the
        scheduler compiles them)."""
        given = [name for name in _CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise InvalidParamError(
                f"{', '.join(_CONSTRAINT_FIELDS)} are mutually exclusive (got {given})",
                given[1],
            )
        for name in ("json_schema", "structural_tag"):
            text = getattr(self, name)
            if text is None:
                continue
            too_deep = InvalidParamError(
                f"{name} nests more than {MAX_GRAMMAR_JSON_DEPTH} levels deep", name
            )
            try:
                value = json.loads(text)
            except RecursionError:  # nested past Python's recursion limit
                raise too_deep from None
            except ValueError as exc:
                raise InvalidParamError(f"{name} is not valid JSON: {exc}", name) from None
            if not isinstance(value, (dict, bool)):  # JSON Schema: an object or a boolean
                raise InvalidParamError(f"{name} must be a JSON object", name)
            if json_depth(value) > MAX_GRAMMAR_JSON_DEPTH:
                raise too_deep

    def normalize(self, tokenizer=None) -> None:
        """Turn `stop` into `stop_strs` and `stop_token_ids` into a set."""
        if self.stop is None:
            self._stop_strs = []
        elif isinstance(self.stop, str):
            self._stop_strs = [self.stop]
        else:
            self._stop_strs = list(self.stop)
        self.stop_token_ids = set(self.stop_token_ids or ())

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in SamplingParamsSpec.model_fields}
        if isinstance(out["stop_token_ids"], set):
            out["stop_token_ids"] = sorted(out["stop_token_ids"])
        return out


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, `[]` and `{}` are 1), walked
    without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _listify(params: dict[str, Any]) -> dict[str, Any]:
    """Python callers may pass a set or tuple of stop token ids / stop strings."""
    out = dict(params)
    for key in ("stop_token_ids", "stop"):
        if isinstance(out.get(key), (set, frozenset, tuple)):
            out[key] = sorted(out[key]) if key == "stop_token_ids" else list(out[key])
    bias = out.get("logit_bias")
    if isinstance(bias, dict):  # Python callers may key by int
        out["logit_bias"] = {
            str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v
            for k, v in bias.items()
        }
    return out
