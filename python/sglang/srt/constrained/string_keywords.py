"""The JSON Schema string keywords xgrammar (0.2.9) would serve wrongly.

- A `pattern`'s literal characters are written into the JSON text unescaped: a
  literal control character, '"' or backslash outside a character class (or a
  class of control characters) makes the output invalid JSON. Negated classes and
  classes of other characters go through xgrammar's JSON-string regex, which
  leaves the characters JSON must escape out: those are safe.
- `minLength` / `maxLength` beside `pattern` or `format` are dropped. They are
  served when they cannot bind: the pattern's own length range lies within them,
  or, beside a `format`, minLength is at most 1 and maxLength at least the
  format's longest value (OPEN_FORMAT_MAX_LENGTH for open-ended formats such as
  uri or email: a cap of that size, as pydantic's HttpUrl has, is documented as
  not enforced).
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python's own regex parser: the pattern's structure and its length range
    from re import _constants as sre
    from re import _parser as sre_parse
except ImportError:  # Python < 3.11
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# maxLength at or above this beside an open-ended format (uri, email, ...) is not
# enforced but served: such a cap (pydantic's HttpUrl: 2083) does not bind in practice
OPEN_FORMAT_MAX_LENGTH = 256
_FORMAT_MAX_LENGTH = {"date": 10, "uuid": 36, "ipv4": 15, "ipv6": 45}
_JSON_ESCAPED = frozenset({0x22, 0x5C})  # '"' and '\'


def string_reason(node: dict[str, Any]) -> str | None:
    """Why a string node's keywords cannot be enforced, or None."""
    pattern = node.get("pattern")
    tree = _parse(pattern) if isinstance(pattern, str) else None
    if isinstance(pattern, str) and _writes_json_escapes(pattern, tree):
        return (
            "a 'pattern' with a literal control character, '\"' or '\\' is enforced on the "
            "JSON text, not on the string it encodes"
        )
    binding = _binding_length(node, tree)
    if binding is not None:
        shaped = "pattern" if "pattern" in node else "format"
        return f"{binding!r} together with {shaped!r} is not enforced by the grammar backend"
    return None


def _parse(pattern: str) -> Any:
    try:
        return sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        return None  # not Python's dialect: judged from its text


def _binding_length(node: dict[str, Any], tree: Any) -> str | None:
    """The first of minLength / maxLength that xgrammar would drop and that could bind."""
    if "pattern" not in node and "format" not in node:
        return None
    low, high = _implied_lengths(node, tree)
    min_length, max_length = node.get("minLength"), node.get("maxLength")
    if isinstance(min_length, int) and min_length > low:
        return "minLength"
    if isinstance(max_length, int) and (high is None or max_length < high):
        return "maxLength"
    return None


def _implied_lengths(node: dict[str, Any], tree: Any) -> tuple[int, int | None]:
    """(fewest, most) characters the pattern (or format) alone allows; None: no bound."""
    if "pattern" in node:
        if tree is None:
            return 0, None
        low, high = tree.getwidth()
        return low, high if high < sre.MAXREPEAT else None
    return 1, _FORMAT_MAX_LENGTH.get(node.get("format"), OPEN_FORMAT_MAX_LENGTH)


def _writes_json_escapes(pattern: str, tree: Any) -> bool:
    if tree is None:
        return _text_names_json_escapes(pattern)
    return _items_name_json_escapes(list(tree))


def _items_name_json_escapes(items: list[tuple[Any, Any]]) -> bool:
    for op, arg in items:
        if op is sre.LITERAL and (arg < 0x20 or arg in _JSON_ESCAPED):
            return True
        if op is sre.IN and _class_has_controls(arg):
            return True
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) or op is getattr(sre, "POSSESSIVE_REPEAT", None):
            if _items_name_json_escapes(list(arg[2])):
                return True
        elif op is sre.SUBPATTERN and _items_name_json_escapes(list(arg[-1])):
            return True
        elif op is sre.BRANCH and any(_items_name_json_escapes(list(b)) for b in arg[1]):
            return True
    return False


def _class_has_controls(members: list[tuple[Any, Any]]) -> bool:
    """A positive class naming a control character (a negated one never admits one)."""
    if members and members[0][0] is sre.NEGATE:
        return False
    for op, arg in members:
        if op is sre.LITERAL and arg < 0x20:
            return True
        if op is sre.RANGE and arg[0] < 0x20:
            return True
    return False


_CONTROL_ESCAPES = frozenset("nrtfvae0c")  # \n, \t, ... and \cX: control characters


def _text_names_json_escapes(pattern: str) -> bool:
    """For a pattern Python cannot parse: whether its text names a character JSON must
    escape (a control character, '"', '\\'), raw or by an escape (conservative)."""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            digits = {"x": 2, "u": 4}.get(escaped)
            if escaped in _CONTROL_ESCAPES or escaped in '"\\':
                return True
            if digits is not None and _needs_escape(pattern[i + 2 : i + 2 + digits]):
                return True
            i += 2
            continue
        if ord(char) < 0x20 or char == '"':
            return True
        i += 1
    return False


def _needs_escape(hex_digits: str) -> bool:
    try:
        code = int(hex_digits, 16)
    except ValueError:
        return False
    return code < 0x20 or code in _JSON_ESCAPED
