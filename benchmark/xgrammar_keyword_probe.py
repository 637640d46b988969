"""Which JSON Schema keywords xgrammar enforces: each schema is compiled and asked
whether a document that breaks it is accepted ("violating accepted=True": the
keyword compiles to nothing). Feeds constrained/json_schema_support.IGNORED_KEYWORDS
and xgrammar_backend.json_strings_without_controls (the "maxLength_raw_control" case).

    python benchmark/xgrammar_keyword_probe.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json

import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

_INTS = {"a": {"type": "integer"}, "b": {"type": "integer"}}
# keyword -> (schema, a document that breaks it)
CASES: dict[str, tuple[dict, str]] = {
    "not": ({"not": {"type": "string"}}, '"a"'),
    "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 100}]}, "5"),
    "allOf1": ({"allOf": [{"type": "integer"}]}, '"x"'),
    "if": ({"type": "object", "properties": _INTS,
            "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, '{"a": 1}'),
    "dependentRequired": ({"type": "object", "properties": _INTS,
                           "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    "dependentSchemas": ({"type": "object", "properties": _INTS,
                          "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}'),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    "minContains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5},
                     "minContains": 2}, "[5]"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "3"),
    "propertyNames": ({"type": "object", "additionalProperties": {"type": "integer"},
                       "propertyNames": {"pattern": "^a"}}, '{"b": 1}'),
    "patternProperties": ({"type": "object", "patternProperties": {"^a": {"type": "integer"}},
                           "additionalProperties": False}, '{"b": 1}'),
    "minProperties": ({"type": "object", "additionalProperties": {"type": "integer"},
                       "minProperties": 2}, '{"a": 1}'),
    "maxProperties": ({"type": "object", "additionalProperties": {"type": "integer"},
                       "maxProperties": 1}, '{"a": 1, "b": 2}'),
    "unevaluatedProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                               "unevaluatedProperties": False}, '{"a": 1, "b": 2}'),
    "oneOf": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true"),
    "minItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]"),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 5}, "5"),
    "format": ({"type": "string", "format": "email"}, '"abc"'),
    "minLength": ({"type": "string", "minLength": 3}, '"a"'),
    "const": ({"const": 3}, "4"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
                    '["x"]'),
    "required_noprops": ({"type": "object", "required": ["a"]}, "{}"),
    "multipleOf_number": ({"type": "number", "multipleOf": 0.5}, "3.1"),
    "multipleOf_number_int": ({"type": "number", "multipleOf": 2}, "3"),
    "multipleOf_int_frac": ({"type": "integer", "multipleOf": 1.5}, "2"),
    "multipleOf_untyped": ({"multipleOf": 2}, "3"),
    "dependencies": ({"type": "object", "properties": _INTS,
                      "dependencies": {"a": ["b"]}}, '{"a": 1}'),
    "oneOf_overlap": ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    "oneOf_overlap_obj": ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                     {"type": "object", "properties": {"b": {"type": "integer"}}}]},
                          "{}"),
    "ref_remote": ({"$ref": "http://example.com/x.json"}, '"anything"'),
    # JSON allows U+0000-U+001F in a string only escaped
    "maxLength_raw_control": ({"type": "string", "maxLength": 5}, '"a\x1e"'),
    "string_raw_control": ({"type": "string"}, '"a\x1e"'),
}  # fmt: skip


def probe() -> list[str]:
    lines = [f"xgrammar {importlib.metadata.version('xgrammar')}"]
    for name, (schema, bad) in CASES.items():
        try:
            grammar = xgr.Grammar.from_json_schema(json.dumps(schema))
            lines.append(f"{name:24s} violating accepted={accepts(grammar, bad)}")
        except Exception as exc:  # a keyword the compiler itself refuses
            lines.append(f"{name:24s} compile error {type(exc).__name__}: {str(exc)[:80]}")
    return lines


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("\n".join(probe()))


if __name__ == "__main__":
    main()
