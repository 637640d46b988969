"""The JSON Schema keywords the grammar backend cannot enforce, found before compiling.

xgrammar (0.2.x) compiles some keywords to nothing: an output can then break the
schema while finishing with "stop". A request whose schema uses one is refused (400
naming the field) rather than served output that does not validate. Measured on
xgrammar 0.2.9 by compiling each keyword and asking whether a violating document
is accepted (benchmark/RESULTS.md): `not`, `allOf` of several schemas, `if` /
`then` / `else`, `dependentRequired`, `dependentSchemas`, `uniqueItems` and
`contains` are ignored; an object in strict mode (no `additionalProperties`) that
`requires` a property it does not define only accepts `{}`. Also ignored: draft-7's
`dependencies`, `multipleOf` anywhere but on an integer by an integer, a `$ref` to
another document, and `oneOf` beyond `anyOf` (an output matching two branches passes):
a `oneOf` is served only when its branches cannot overlap (distinct types, or distinct
`const` / `enum` values, on themselves or on a required property, as a discriminated
union has).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import ROUND_CEILING, Decimal
from typing import Any

from sglang.srt.constrained.string_keywords import string_reason

IGNORED_KEYWORDS = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "uniqueItems",
    "contains",
    "dependencies",  # draft 7's dependentRequired / dependentSchemas
)
# keywords whose value is one subschema / a list of them / a name -> subschema map
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
        "propertyNames", "unevaluatedProperties", "additionalItems")  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def unsupported_feature(schema: Any) -> str | None:
    """Why `schema` cannot be enforced (the first reason, with its JSON path), or None."""
    for path, node in _subschemas(schema, "$"):
        reason = _node_reason(node, schema)
        if reason is not None:
            return f"{reason} at {path}"
    return None


def _node_reason(node: dict[str, Any], root: Any) -> str | None:
    for keyword in IGNORED_KEYWORDS:
        if keyword in node and not (keyword == "uniqueItems" and node[keyword] is False):
            return f"{keyword!r} is not enforced by the grammar backend"
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "'allOf' of several schemas is not enforced by the grammar backend"
    if "multipleOf" in node and not _integer_multiple(node):
        return "'multipleOf' is enforced only on an integer, by an integer"
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"'$ref' to another document ({ref!r}) is not resolved"
    one_of = node.get("oneOf")
    if isinstance(one_of, list) and not _pairwise_disjoint(one_of, root):
        return "'oneOf' whose branches may overlap is enforced as 'anyOf'"
    values, kinds = _values(node), _kinds(node)
    if values is not None and kinds is not None and not all(_fits(v, node) for v in values):
        # the backend allows every listed value, ignoring `type`
        return "'enum'/'const' lists a value that its 'type' does not allow"
    reason = string_reason(node) or _number_range_reason(node)
    if reason is not None:
        return reason
    required = node.get("required")
    if isinstance(required, list) and "additionalProperties" not in node:
        defined = node.get("properties") or {}
        missing = [name for name in required if name not in defined]
        if missing:  # strict mode: undeclared properties are not allowed
            return f"'required' names {missing} that 'properties' does not define"
    return None


def _number_range_reason(node: dict[str, Any]) -> str | None:
    """xgrammar writes a bounded number with at most 6 decimals: a range holding no such
    number compiles to an empty value (invalid JSON that ends with "stop")."""
    types = node.get("type")
    if "number" not in (types if isinstance(types, list) else [types]):
        return None
    low, low_open = _bound(node, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(node, "maximum", "exclusiveMaximum", min)
    if low is None or high is None or low > high:  # an empty range: the backend's 400
        return None
    step = Decimal("0.000001")
    first = (low / step).to_integral_value(rounding=ROUND_CEILING) * step
    if low_open and first == low:
        first += step
    if first < high or (first == high and not high_open):
        return None
    return (
        f"a 'number' range ({low:f} to {high:f}) holding no value of at most 6 decimals is not "
        "enforced by the grammar backend"
    )


def _bound(node: dict[str, Any], closed: str, opened: str, pick) -> tuple[Decimal | None, bool]:
    """The tighter of the closed and the open bound (draft 6+ numbers), and if it is open."""
    found = []
    for name, is_open in ((closed, False), (opened, True)):
        value = node.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            found.append((Decimal(repr(value)), is_open))
    if not found:
        return None, False
    value = pick(v for v, _ in found)
    return value, any(is_open for v, is_open in found if v == value)


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


def _integer_multiple(node: dict[str, Any]) -> bool:
    value = node["multipleOf"]
    return node.get("type") == "integer" and isinstance(value, int) and not isinstance(value, bool)


def _pairwise_disjoint(branches: list[Any], root: Any) -> bool:
    resolved = [_resolve(branch, root) for branch in branches]
    return all(
        _disjoint(a, b) for i, a in enumerate(resolved) for b in resolved[i + 1 :]
    )


def _disjoint(a: Any, b: Any) -> bool:
    """Whether no JSON document can match both branches (judged conservatively)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    kinds_a, kinds_b = _kinds(a), _kinds(b)
    if kinds_a is not None and kinds_b is not None and not kinds_a & kinds_b:
        return True
    values_a, values_b = _values(a), _values(b)
    if values_a is not None and values_b is not None and not _overlap(values_a, values_b):
        return True
    return _discriminated(a, b)


def _discriminated(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Both require a property whose const / enum values differ (a discriminated union)."""
    required = set(_list(a.get("required"))) & set(_list(b.get("required")))
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    for name in required:
        values_a = _values(props_a.get(name)) if isinstance(props_a, dict) else None
        values_b = _values(props_b.get(name)) if isinstance(props_b, dict) else None
        if values_a is not None and values_b is not None and not _overlap(values_a, values_b):
            return True
    return False


# JSON Schema's types as sets of JSON values: an integer is a number
_KIND = {"integer": "number", "number": "number", "string": "string", "boolean": "boolean",
         "null": "null", "array": "array", "object": "object"}  # fmt: skip


def _kinds(node: dict[str, Any]) -> set[str] | None:
    """The JSON value kinds `node` can match, or None when not bounded by its `type`."""
    types = node.get("type")
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not all(name in _KIND for name in names):
        return None
    return {_KIND[name] for name in names}


def _fits(value: Any, node: dict[str, Any]) -> bool:
    """Whether the JSON value is of a type `node` allows (an integer: a whole number)."""
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, (int, float)):
        return "number" in types or ("integer" in types and float(value).is_integer())
    return _JSON_KIND.get(type(value)) in types


_JSON_KIND = {str: "string", type(None): "null", list: "array", dict: "object"}


def _values(node: Any) -> list[Any] | None:
    """The only values `node` allows (its `const` or `enum`), or None."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return [node["const"]]
    enum = node.get("enum")
    return enum if isinstance(enum, list) else None


def _overlap(a: list[Any], b: list[Any]) -> bool:
    # JSON equality: 1 == 1.0, but true is not 1
    return any(x == y and isinstance(x, bool) == isinstance(y, bool) for x in a for y in b)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resolve(node: Any, root: Any, depth: int = 0) -> Any:
    """`node`, or what its local `$ref` ("#/$defs/x") points to (unresolved: itself)."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/") or depth > 16:
        return node
    target = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        elif isinstance(target, dict) and part in target:
            target = target[part]
        else:
            return node
    return _resolve(target, root, depth + 1)
