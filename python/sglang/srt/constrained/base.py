"""The grammar backend interface: what the scheduler needs from a constraint library.

A request's constraint is a `GrammarKey` (kind, text). A backend compiles a key
once (the manager caches it) and makes a fresh `Grammar` (matcher state) per
request from the compiled form. Token masks are packed int32 bitmasks,
`[rows, ceil(vocab / 32)]`, bit `t % 32` of word `t // 32` set = token t allowed.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

# Kinds of constraint, each named by the request field that carries it.
JSON_SCHEMA, REGEX, EBNF, STRUCTURAL_TAG = "json_schema", "regex", "ebnf", "structural_tag"
CONSTRAINT_FIELDS = (JSON_SCHEMA, REGEX, EBNF, STRUCTURAL_TAG)
# json_schema text meaning "any JSON object" (OpenAI response_format json_object).
ANY_JSON_OBJECT = '{"type": "object"}'


class GrammarKey(NamedTuple):
    kind: str  # one of CONSTRAINT_FIELDS
    text: str


class InvalidGrammarError(ValueError):
    """The constraint does not compile; `param` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Grammar(abc.ABC):
    """One request's matcher: which tokens may come next, advanced token by token."""

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False if the grammar does not allow it."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]`."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete (its stop token was accepted)."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (speculative rejection)."""


class GrammarBackend(abc.ABC):
    name: str

    @abc.abstractmethod
    def compile(self, key: GrammarKey) -> Any:
        """The compiled constraint (thread-safe; may take a while). Raises
        InvalidGrammarError naming the field when the constraint is invalid."""

    @abc.abstractmethod
    def new_grammar(self, compiled: Any) -> Grammar:
        """A fresh matcher over a compiled constraint."""

    @abc.abstractmethod
    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """int32 [rows, words], all tokens allowed."""

    @abc.abstractmethod
    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """For each row r in `rows`, set logits[r] of tokens bitmask[r] disallows to -inf,
        in place (logits [bs, vocab], bitmask [bs, words]; other rows untouched)."""


def key_of(params: Any) -> GrammarKey | None:
    """The constraint a request's SamplingParams carries, or None."""
    for kind in CONSTRAINT_FIELDS:
        text = getattr(params, kind, None)
        if text is not None:
            return GrammarKey(kind, text)
    return None
