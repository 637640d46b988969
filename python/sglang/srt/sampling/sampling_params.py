"""Per-request sampling parameters (SGLang's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_TOP_K_ALL = 1 << 30  # top_k = -1 means "all tokens"


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | set[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    stop_strs: list[str] = field(default_factory=list, repr=False)

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Build from a request's dict; an unknown key is a ValueError naming it."""
        params = dict(params or {})
        known = {f for f in cls.__dataclass_fields__ if f != "stop_strs"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        return cls(**params)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def effective_top_k(self) -> int:
        return _TOP_K_ALL if self.top_k in (-1, 0) else self.top_k

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the first invalid field."""
        for name, ok, rule in self._checks():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
        self._verify_logit_bias(vocab_size)
        self._verify_grammar()

    def _checks(self) -> list[tuple[str, bool, str]]:
        max_new = self.max_new_tokens
        return [
            ("temperature", self.temperature >= 0.0, "non-negative"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 0, "-1 (all) or >= 0"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 2.0, "in (0, 2]"),
            ("max_new_tokens", max_new is None or max_new >= 0, "non-negative"),
            ("min_new_tokens", self.min_new_tokens >= 0, "non-negative"),
            (
                "min_new_tokens",
                max_new is None or self.min_new_tokens <= max_new,
                "<= max_new_tokens",
            ),
            ("n", self.n >= 1, ">= 1"),
        ]

    def _verify_logit_bias(self, vocab_size: int | None) -> None:
        for key, value in (self.logit_bias or {}).items():
            try:
                token_id = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias key must be a token id, got {key!r}") from None
            if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                raise ValueError(f"logit_bias token id {token_id} is out of range")
            if not isinstance(value, (int, float)):
                raise ValueError(f"logit_bias value for {key!r} must be a number")

    def _verify_grammar(self) -> None:
        given = [g for g in (self.json_schema, self.regex, self.ebnf) if g is not None]
        if len(given) > 1:
            raise ValueError("json_schema, regex and ebnf are mutually exclusive")

    def normalize(self, tokenizer=None) -> None:
        """Turn `stop` into `stop_strs` and `stop_token_ids` into a set."""
        if self.stop is None:
            self.stop_strs = []
        elif isinstance(self.stop, str):
            self.stop_strs = [self.stop]
        else:
            self.stop_strs = list(self.stop)
        self.stop_token_ids = set(self.stop_token_ids or ())

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "stop_strs"}
        if isinstance(out["stop_token_ids"], set):
            out["stop_token_ids"] = sorted(out["stop_token_ids"])
        return out
