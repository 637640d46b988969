"""`strict: true` tools under tool_choice "auto": the model may call or not, but a call
it starts must follow its tool's parameters schema (OpenAI's strict mode; SGLang and
vLLM enforce it the same way). The output is constrained with a structural tag: once
the parser's call marker (the trigger) appears, the call's text is fixed up to its
arguments, which follow the schema, and its close. Non-strict tools in the same request
keep any JSON object as arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang.srt.parser.function_call.constrained import tool_functions
from sglang.srt.parser.function_call.hermes_detector import HermesDetector
from sglang.srt.parser.function_call.llama32_detector import Llama32Detector
from sglang.srt.parser.function_call.mistral_detector import MistralDetector
from sglang.srt.parser.function_call.parser import detector_class
from sglang.srt.parser.function_call.tool_parameters import object_parameters


@dataclass(frozen=True)
class StrictCallFormat:
    """How a parser's call is written around its arguments; `{name}` is the name's JSON."""

    trigger: str
    begin: str
    end: str


STRICT_CALL_FORMATS = {
    HermesDetector: StrictCallFormat(
        "<tool_call>", '<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>"
    ),
    # only calls opened with <|python_tag|> are held to the schema (a bare one is not)
    Llama32Detector: StrictCallFormat(
        "<|python_tag|>", '<|python_tag|>{{"name": {name}, "parameters": ', "}"
    ),
    MistralDetector: StrictCallFormat(
        "[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": {name}, "arguments": ', "}]"
    ),
}  # the pythonic format has no JSON arguments to hold to a schema: not enforced


def has_strict_tool(tools: list[dict] | None) -> bool:
    return any(f.get("strict") is True for f in tool_functions(tools))


def strict_tools_tag(tools: list[dict] | None, parser_name: str | None) -> dict[str, Any] | None:
    """The structural tag (SGLang's {"structures", "triggers"} form) holding the calls of
    `tools` to their schemas under "auto", or None: no strict tool, or a parser whose
    calls it cannot describe (no parser, pythonic)."""
    if not parser_name or not has_strict_tool(tools):
        return None
    fmt = STRICT_CALL_FORMATS.get(detector_class(parser_name))
    if fmt is None:
        return None
    structures = [
        {
            "begin": fmt.begin.format(name=json.dumps(f["name"])),
            "schema": object_parameters(f) if f.get("strict") is True else {"type": "object"},
            "end": fmt.end,
        }
        for f in tool_functions(tools)
    ]
    return {"structures": structures, "triggers": [fmt.trigger]}
