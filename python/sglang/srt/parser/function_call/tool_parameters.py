"""A tool's `parameters`: the JSON schema of its arguments, which are a JSON object.

OpenAI refuses a function whose `parameters` is not an object schema (`{"type":
"array"}`, `{"type": "string"}`, ...) for every request; so do we, since every
call format carries the arguments as an object and a grammar forced to write
another value would make calls that parse as none. Accepted, as by OpenAI and
vLLM: no `parameters`, `{}`, and a schema without `"type"` (`{"properties":
...}`), which the grammar then holds to an object.
"""

from __future__ import annotations

from typing import Any

# how deep "$ref" / "anyOf" chains are followed before a schema is taken as it is
_MAX_DEPTH = 32
_BRANCH_KEYWORDS = ("anyOf", "oneOf", "allOf")


class ToolParametersError(ValueError):
    """A tool's `parameters` cannot describe arguments; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_tool_parameters(tools: list[dict] | None) -> None:
    """ToolParametersError naming `tools.N.function.parameters` of the first tool whose
    schema admits a value other than an object."""
    for index, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or function.get("parameters") is None:
            continue
        parameters = function["parameters"]
        problem = _non_object(parameters, parameters, 0)
        if problem is not None:
            raise ToolParametersError(
                f"the parameters of function {function.get('name')!r} must be a JSON "
                f'Schema of type "object", but {problem}',
                param=f"tools.{index}.function.parameters",
            )


def object_parameters(function: dict) -> dict:
    """The function's parameters schema, held to an object: `{"type": "object"}` when it
    has none, and `"type": "object"` added to one without a type."""
    parameters = function.get("parameters") or {}
    if "type" in parameters:
        return parameters
    return {"type": "object", **parameters}


def _non_object(schema: Any, root: dict, depth: int) -> str | None:
    """What in `schema` lets a value other than an object through, or None. Only what
    the schema states is judged: no "type" (or `true`) is taken as an object."""
    if not isinstance(schema, dict):
        return None if isinstance(schema, bool) else f"it is a {type(schema).__name__}"
    if depth > _MAX_DEPTH:
        return None
    declared = schema.get("type", "object")
    if declared != "object" and not (
        isinstance(declared, list) and declared and all(t == "object" for t in declared)
    ):
        return f"it has type {declared!r}"
    if "const" in schema and not isinstance(schema["const"], dict):
        return "its const is not an object"
    enum = schema.get("enum")
    if isinstance(enum, list) and not all(isinstance(value, dict) for value in enum):
        return "its enum holds a value that is not an object"
    if isinstance(schema.get("$ref"), str):
        problem = _non_object(_resolve(schema["$ref"], root), root, depth + 1)
        if problem is not None:
            return f"its $ref {schema['$ref']!r}: {problem}"
    for keyword in _BRANCH_KEYWORDS:
        branches = schema.get(keyword)
        for i, branch in enumerate(branches if isinstance(branches, list) else ()):
            problem = _non_object(branch, root, depth + 1)
            if problem is not None:
                return f"its {keyword} branch {i}: {problem}"
    return None


def _resolve(ref: str, root: dict) -> Any:
    """The schema a local "#/..." reference points at in `root`; `True` (any value: not
    judged) for one that does not resolve here."""
    if not ref.startswith("#"):
        return True
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True
    return node
