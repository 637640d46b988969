"""Picking and building the grammar backend named by --grammar-backend."""

from __future__ import annotations

import importlib.util
from typing import Any

from sglang.srt.constrained.base import GrammarBackend

IMPLEMENTED_BACKENDS = ("xgrammar",)


class GrammarBackendUnavailable(RuntimeError):
    """The backend could not be imported or initialised (the server runs without it)."""


def check_grammar_backend(name: str, tokenizer: Any) -> None:
    """Raise GrammarBackendUnavailable when `name` cannot run here, without importing it:
    the backend itself is built on the first constrained request (GrammarManager)."""
    if name not in IMPLEMENTED_BACKENDS:
        raise GrammarBackendUnavailable(f"grammar backend {name!r} is not implemented")
    if tokenizer is None:
        raise GrammarBackendUnavailable("the server runs without a tokenizer")
    if importlib.util.find_spec(name) is None:
        raise GrammarBackendUnavailable(f"ModuleNotFoundError: No module named {name!r}")


def create_grammar_backend(
    name: str, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool
) -> GrammarBackend:
    check_grammar_backend(name, tokenizer)
    try:
        # Local import: xgrammar (~30 MiB resident) is loaded only by a process that
        # compiles a grammar, when the first constrained request arrives.
        from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, any_whitespace)
    except Exception as exc:  # ImportError, a tokenizer xgrammar cannot read, ...
        raise GrammarBackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
