"""Picking and building the grammar backend named by --grammar-backend."""

from __future__ import annotations

from typing import Any

from sglang.srt.constrained.base import GrammarBackend

IMPLEMENTED_BACKENDS = ("xgrammar",)


class GrammarBackendUnavailable(RuntimeError):
    """The backend could not be imported or initialised (the server runs without it)."""


def create_grammar_backend(
    name: str, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool
) -> GrammarBackend:
    if name not in IMPLEMENTED_BACKENDS:
        raise GrammarBackendUnavailable(f"grammar backend {name!r} is not implemented")
    if tokenizer is None:
        raise GrammarBackendUnavailable("the server runs without a tokenizer")
    try:
        # Local import: xgrammar is loaded only by the processes that compile grammars.
        from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, any_whitespace)
    except Exception as exc:  # ImportError, a tokenizer xgrammar cannot read, ...
        raise GrammarBackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
