"""Constrained tool calls: `tool_choice` "required" or a named function.

For these the server constrains the model's output with `tool_call_schema`, a
JSON array (at least one item) of `{"name": ..., "parameters": {...}}`, each
name paired with its own parameters schema through `anyOf`; the output is then
read back with `constrained_reader.parse_constrained_calls`. "auto" and "none" need
no schema.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.parser.function_call.tool_parameters import (
    check_tool_parameters,
    object_parameters,
)

ToolChoice = str | dict | None
_PLAIN_CHOICES = ("none", "auto", "required")


def check_tool_choice(tools: list[dict] | None, tool_choice: ToolChoice) -> None:
    """ValueError naming the problem when `tool_choice` cannot apply to `tools`, or a
    tool's parameters are no object schema (ToolParametersError, whatever the choice)."""
    check_tool_parameters(tools)
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if tool_choice == "required":
        if not tool_functions(tools):
            raise ValueError('tool_choice "required" needs at least one tool in "tools"')
        return
    name = _named_function(tool_choice)
    if name not in {f["name"] for f in tool_functions(tools)}:
        raise ValueError(f'tool_choice names function {name!r}, which is not in "tools"')


def tool_call_schema(tools: list[dict] | None, tool_choice: ToolChoice) -> dict | None:
    """The JSON schema the output must follow, or None when nothing is constrained."""
    check_tool_choice(tools, tool_choice)
    if tool_choice is None or tool_choice in ("none", "auto"):
        return None
    functions = tool_functions(tools)
    if tool_choice != "required":
        name = _named_function(tool_choice)
        functions = [f for f in functions if f["name"] == name]
    return {
        "type": "array",
        "minItems": 1,
        "items": {"anyOf": [_call_schema(f, i) for i, f in enumerate(functions)]},
    }


def _call_schema(function: dict, index: int) -> dict:
    """The schema of a call of `function`, the `index`-th branch of the array's items.
    Its parameters' local `$ref`s ("#/$defs/Loc", "#") are rebased onto where the
    parameters now sit, so a pydantic-made schema keeps its definitions."""
    base = f"#/items/anyOf/{index}/properties/parameters"
    parameters = _rebase_refs(object_parameters(function), base)
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [function["name"]]},
            "parameters": parameters,
        },
        "required": ["name", "parameters"],
    }


# keywords whose values are data, not schemas: a "$ref" key in them is no reference
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
# keywords whose values map names (which may be any word, "enum" too) to schemas
_NAME_MAPS = frozenset(("properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas"))  # fmt: skip


def _rebase_refs(node: Any, base: str) -> Any:
    """`node` with every local `$ref` ("#..." pointing into the parameters' own
    document) prefixed by `base`, the pointer to that document's new place."""
    if isinstance(node, list):
        return [_rebase_refs(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    rebased = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = base + value[1:]
        elif key in _DATA_KEYWORDS:
            rebased[key] = value
        elif key in _NAME_MAPS and isinstance(value, dict):
            rebased[key] = {name: _rebase_refs(sub, base) for name, sub in value.items()}
        else:
            rebased[key] = _rebase_refs(value, base)
    return rebased


def tool_functions(tools: list[dict] | None) -> list[dict]:
    functions = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            functions.append(function)
    return functions


def _named_function(tool_choice: Any) -> str:
    if isinstance(tool_choice, str):
        choices = ", ".join(repr(c) for c in _PLAIN_CHOICES)
        raise ValueError(f"tool_choice {tool_choice!r} is not one of {choices} or a function")
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    return name
