"""The xgrammar backend: JSON schema, any-JSON, regex, EBNF and structural tags.

xgrammar compiles a constraint against the tokenizer's vocabulary once; a
`GrammarMatcher` per request then fills a packed token bitmask per step in
microseconds, and applying the mask is one in-place op over the constrained rows.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import torch
import xgrammar as xgr
from xgrammar.structural_tag import GrammarFormat, JSONSchemaFormat, TagFormat

from sglang.srt.constrained.base import (
    ANY_JSON_OBJECT,
    EBNF,
    JSON_SCHEMA,
    REGEX,
    STRUCTURAL_TAG,
    Grammar,
    GrammarBackend,
    GrammarKey,
    InvalidGrammarError,
)
from sglang.srt.constrained.json_schema_support import unsupported_feature
from sglang.srt.sampling.param_types import first_error

# Longest whitespace run allowed between JSON tokens (with free whitespace on): room for
# pretty-printing several levels deep, yet a weak model cannot fill its whole output
# with newlines (unbounded, the demo model did, until max_tokens).
MAX_JSON_WHITESPACE = 16


class XGrammarGrammar(Grammar):
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        any_whitespace: bool = True,
    ) -> None:
        """`vocab_size` is the model's (logits width), which may exceed the tokenizer's."""
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids or None
        )
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        # One compile thread each: the manager runs compiles on its own worker.
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, key: GrammarKey) -> xgr.CompiledGrammar:
        try:
            return self._compile(key)
        except InvalidGrammarError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError with the parser's message
            raise InvalidGrammarError(f"invalid {key.kind}: {_first_line(exc)}", key.kind) from None

    def _compile(self, key: GrammarKey) -> xgr.CompiledGrammar:
        if key.kind == JSON_SCHEMA:
            _refuse_unenforceable(key)
            # Any object: not strict, so it may hold any properties (strict mode would
            # default additionalProperties to false: only "{}").
            grammar = xgr.Grammar.from_json_schema(
                key.text,
                any_whitespace=self.any_whitespace,
                max_whitespace_cnt=MAX_JSON_WHITESPACE if self.any_whitespace else None,
                strict_mode=key.text != ANY_JSON_OBJECT,
            )
            return self.compiler.compile_grammar(json_strings_without_controls(str(grammar)))
        if key.kind == REGEX:
            return self.compiler.compile_regex(key.text)
        if key.kind == EBNF:
            return self.compiler.compile_grammar(key.text)
        if key.kind == STRUCTURAL_TAG:
            return self._compile_structural_tag(key.text)
        raise InvalidGrammarError(f"unknown constraint kind {key.kind!r}", key.kind)

    def _compile_structural_tag(self, text: str) -> xgr.CompiledGrammar:
        """SGLang's form {"structures": [{"begin", "schema", "end"}], "triggers": [...]},
        or xgrammar's own structural-tag JSON ({"type": "structural_tag", "format": ...}).
        Their JSON parts get the whitespace rule json_schema has (--constrained-json-
        disable-any-whitespace, else runs of at most MAX_JSON_WHITESPACE)."""
        spec = json.loads(text)
        if isinstance(spec, dict) and "structures" in spec:
            tag = _from_sglang_form(spec)
        else:
            try:
                tag = xgr.StructuralTag.model_validate(spec)
            except pydantic.ValidationError as exc:
                raise InvalidGrammarError(
                    f"invalid structural_tag: {first_error(exc)}", STRUCTURAL_TAG
                ) from None
        grammar = xgr.Grammar.from_structural_tag(_with_json_whitespace(tag, self.any_whitespace))
        return self.compiler.compile_grammar(json_strings_without_controls(str(grammar)))

    def new_grammar(self, compiled: xgr.CompiledGrammar) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(compiled))  # rollback is unlimited

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)


# xgrammar 0.2.9 writes a string with minLength / maxLength as characters of this
# class, which admits raw control characters (JSON allows them only escaped, and
# json.loads refuses them): one tab or U+001E and the output is not JSON. Its plain
# strings exclude them (basic_string_sub); the length-limited ones are made to too.
_LENGTH_LIMITED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_STRING_CHAR = '[^\\0-\\x1f\\"\\\\]'


def json_strings_without_controls(ebnf: str) -> str:
    """xgrammar's EBNF for a JSON schema with length-limited strings held to JSON's
    characters (no raw U+0000-U+001F)."""
    return ebnf.replace(_LENGTH_LIMITED_CHAR, _JSON_STRING_CHAR)


def _from_sglang_form(spec: dict[str, Any]) -> xgr.StructuralTag:
    """SGLang's structural tag, its shape checked (400s naming why; the schemas are
    checked with every form's, _with_json_whitespace)."""
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammarError("invalid structural_tag: 'structures' must be a non-empty list",
                                  STRUCTURAL_TAG)  # fmt: skip
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGrammarError("invalid structural_tag: 'triggers' must be a list of non-empty "
                                  "strings", STRUCTURAL_TAG)  # fmt: skip
    items = []
    for i, structure in enumerate(structures):
        where = f"invalid structural_tag: structures[{i}]"
        if not isinstance(structure, dict) or not all(
            isinstance(structure.get(k), str) for k in ("begin", "end")
        ):
            raise InvalidGrammarError(f"{where} needs string 'begin' and 'end'", STRUCTURAL_TAG)
        schema = structure.get("schema")
        if not isinstance(schema, (dict, bool)):
            raise InvalidGrammarError(f"{where} needs a JSON schema object 'schema'",
                                      STRUCTURAL_TAG)  # fmt: skip
        items.append(xgr.StructuralTagItem(begin=structure["begin"], schema=json.dumps(schema),
                                           end=structure["end"]))  # fmt: skip
    return xgr.StructuralTag.from_legacy_structural_tag(items, triggers)


def _with_json_whitespace(node: Any, any_whitespace: bool) -> Any:
    """`node` (a structural tag's part) with every JSON-schema part checked (a schema
    the backend cannot enforce is refused, as for json_schema) and given the whitespace
    rule json_schema has, unless it sets its own: runs of at most MAX_JSON_WHITESPACE,
    or none (the compact JSON of from_json_schema, as a grammar: a limit must be
    positive; XML-style parts allow single spaces). Without one a weak model may write
    whitespace until its length runs out."""
    if isinstance(node, JSONSchemaFormat):
        return _limited_json_part(node, any_whitespace, "a JSON schema of the structural_tag")
    if isinstance(node, TagFormat) and isinstance(node.content, JSONSchemaFormat):
        where = f"the JSON schema of {node.begin!r}"  # the tag a client knows it by
        return node.model_copy(
            update={"content": _limited_json_part(node.content, any_whitespace, where)}
        )
    if isinstance(node, pydantic.BaseModel):
        names = type(node).model_fields
        limited = {
            name: _with_json_whitespace(getattr(node, name), any_whitespace) for name in names
        }
        return node.model_copy(update=limited)
    if isinstance(node, list):
        return [_with_json_whitespace(item, any_whitespace) for item in node]
    return node


def _limited_json_part(part: JSONSchemaFormat, any_whitespace: bool, where: str) -> Any:
    reason = unsupported_feature(part.json_schema)
    if reason is not None:
        raise InvalidGrammarError(f"{where} cannot be enforced: {reason}", STRUCTURAL_TAG)
    if part.max_whitespace_cnt is not None:
        return part
    if any_whitespace or part.style != "json":
        limit = MAX_JSON_WHITESPACE if any_whitespace else 1
        return part.model_copy(update={"max_whitespace_cnt": limit})
    compact = xgr.Grammar.from_json_schema(json.dumps(part.json_schema), any_whitespace=False)
    return GrammarFormat(grammar=str(compact))


def _first_line(exc: Exception) -> str:
    """xgrammar's messages start with a '[time] file.cc:line:' prefix; keep the text."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "] " in text and ".cc:" in text:
        text = text.split(".cc:", 1)[1].split(": ", 1)[-1]
    return text


def _refuse_unenforceable(key: GrammarKey) -> None:
    """A schema the backend would compile but not enforce: refused, naming why."""
    if key.text == ANY_JSON_OBJECT:
        return
    try:
        schema = json.loads(key.text)
    except ValueError:
        return  # not JSON: the compiler's own error says so
    reason = unsupported_feature(schema)
    if reason is not None:
        raise InvalidGrammarError(f"the JSON schema cannot be enforced: {reason}", key.kind)
