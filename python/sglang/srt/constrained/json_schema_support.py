"""The JSON Schema keywords the grammar backend cannot enforce, found before compiling.

xgrammar (0.2.x) compiles some keywords to nothing: an output can then break the
schema while finishing with "stop". A request whose schema uses one is refused (400
naming the field) rather than served output that does not validate. Measured on
xgrammar 0.2.9 by compiling each keyword and asking whether a violating document
is accepted (benchmark/RESULTS.md): `not`, `allOf` of several schemas, `if` /
`then` / `else`, `dependentRequired`, `dependentSchemas`, `uniqueItems` and
`contains` are ignored; an object in strict mode (no `additionalProperties`) that
`requires` a property it does not define only accepts `{}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

IGNORED_KEYWORDS = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "uniqueItems",
    "contains",
)
# keywords whose value is one subschema / a list of them / a name -> subschema map
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
        "propertyNames", "unevaluatedProperties", "additionalItems")  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def unsupported_feature(schema: Any) -> str | None:
    """Why `schema` cannot be enforced (the first reason, with its JSON path), or None."""
    for path, node in _subschemas(schema, "$"):
        reason = _node_reason(node)
        if reason is not None:
            return f"{reason} at {path}"
    return None


def _node_reason(node: dict[str, Any]) -> str | None:
    for keyword in IGNORED_KEYWORDS:
        if keyword in node and not (keyword == "uniqueItems" and node[keyword] is False):
            return f"{keyword!r} is not enforced by the grammar backend"
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "'allOf' of several schemas is not enforced by the grammar backend"
    required = node.get("required")
    if isinstance(required, list) and "additionalProperties" not in node:
        defined = node.get("properties") or {}
        missing = [name for name in required if name not in defined]
        if missing:  # strict mode: undeclared properties are not allowed
            return f"'required' names {missing} that 'properties' does not define"
    return None


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _ONE:
        yield from _subschemas(node.get(key), f"{path}.{key}")
    for key in _LIST:
        value = node.get(key)
        if isinstance(value, list):
            for i, child in enumerate(value):
                yield from _subschemas(child, f"{path}.{key}[{i}]")
    for key in _MAP:
        value = node.get(key)
        if isinstance(value, dict):
            for name, child in value.items():
                yield from _subschemas(child, f"{path}.{key}.{name}")
