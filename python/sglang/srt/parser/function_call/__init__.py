"""Tool-call parsing: model output -> normal text + OpenAI tool calls."""

from sglang.srt.parser.function_call.constrained import check_tool_choice, tool_call_schema
from sglang.srt.parser.function_call.constrained_reader import (
    ConstrainedCallStream,
    parse_constrained_calls,
)
from sglang.srt.parser.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.parser.function_call.parser import TOOL_CALL_PARSER_NAMES, FunctionCallParser

__all__ = [
    "ConstrainedCallStream",
    "TOOL_CALL_PARSER_NAMES",
    "FunctionCallParser",
    "StreamingParseResult",
    "ToolCallItem",
    "check_tool_choice",
    "parse_constrained_calls",
    "tool_call_schema",
]
