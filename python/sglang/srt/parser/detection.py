"""Guess the tool-call and reasoning parsers from a chat template's Jinja text.

The rules are tried in order, separately for each kind; the first whose
pattern occurs in the template wins. Patterns match the template source, so a
literal newline in a Jinja string is the two characters backslash and n.

Tool-call rules:
    <tool_call>             Qwen2.5 / Qwen3 / Hermes           -> qwen25
    [TOOL_CALLS]            Mistral                            -> mistral
    [func_name1(            pythonic instructions (Llama 3.2/4) -> pythonic
    <|python_tag|>          Llama 3.1 built-in tools            -> llama3
    "name": function name, "parameters"
                            Llama 3.1/3.2/3.3 JSON instructions -> llama3

Reasoning rules:
    <｜Assistant｜></think>  DeepSeek-V3.1 (thinking off closes it) -> deepseek-v3
    <｜Assistant｜><think>   DeepSeek-R1: the prompt opens <think>  -> deepseek-r1
    assistant\\n<think>      Qwen3-Thinking-2507 / QwQ: prompt opens it -> qwen3-thinking
    <think>                 Qwen3 hybrid: the model opens it       -> qwen3
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DetectionRule:
    kind: str  # "tool" or "reasoning"
    pattern: re.Pattern[str]
    parser: str
    family: str


def _rule(kind: str, pattern: str, parser: str, family: str) -> DetectionRule:
    return DetectionRule(kind, re.compile(pattern), parser, family)


_NEWLINE = r"(?:\\n|\n)"  # "\n" written in a Jinja string, or a real newline

DETECTION_RULES: tuple[DetectionRule, ...] = (
    _rule("tool", re.escape("<tool_call>"), "qwen25", "Qwen2.5 / Qwen3 / Hermes"),
    _rule("tool", re.escape("[TOOL_CALLS]"), "mistral", "Mistral"),
    _rule("tool", re.escape("[func_name1("), "pythonic", "Llama 3.2 / 4 pythonic"),
    _rule("tool", re.escape("<|python_tag|>"), "llama3", "Llama 3.1 built-in tools"),
    _rule("tool", r'"name"\s*:\s*function name,\s*"parameters"', "llama3", "Llama 3.x JSON"),
    _rule("reasoning", re.escape("<｜Assistant｜></think>"), "deepseek-v3", "DeepSeek-V3.1"),
    _rule("reasoning", re.escape("<｜Assistant｜><think>"), "deepseek-r1", "DeepSeek-R1"),
    _rule(
        "reasoning",
        re.escape("<|im_start|>assistant") + _NEWLINE + re.escape("<think>"),
        "qwen3-thinking",
        "Qwen3-Thinking / QwQ",
    ),
    _rule("reasoning", re.escape("<think>"), "qwen3", "Qwen3"),
)


def detect_parsers(chat_template: str | None) -> tuple[str | None, str | None]:
    """(tool_call_parser, reasoning_parser) for the template; None where nothing matched."""
    if not chat_template:
        return None, None
    return _first_match("tool", chat_template), _first_match("reasoning", chat_template)


def _first_match(kind: str, template: str) -> str | None:
    for rule in DETECTION_RULES:
        if rule.kind == kind and rule.pattern.search(template):
            return rule.parser
    return None
