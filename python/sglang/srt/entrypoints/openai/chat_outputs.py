"""What a chat choice's text means: reasoning, content and tool calls.

A `ChatOutputPlan` is fixed per request from the engine's parsers (what the
TokenizerManager reports in effect: a flag, or detected from the chat template)
and the request (`tools`, `tool_choice`, `separate_reasoning`, `stream_reasoning`,
`chat_template_kwargs`). The text is read in two steps, in the order the model
writes it:

    text -> reasoning parser -> reasoning_content | rest
    rest -> tool calls ("auto": the tool-call parser; "required" / named: the
            grammar-shaped JSON array) | content

The same plan serves the final response (`parse_final`) and a stream
(`ChoiceOutputStream`, one per choice).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessageOut,
    DeltaMessage,
    FunctionCall,
    ToolCall,
)
from sglang.srt.parser.chat_template import message_text
from sglang.srt.parser.function_call import (
    ConstrainedCallStream,
    FunctionCallParser,
    check_tool_choice,
    parse_constrained_calls,
    tool_call_schema,
)
from sglang.srt.parser.function_call.strict_calls import strict_tools_tag
from sglang.srt.parser.reasoning_parser import ReasoningParser, reasoning_format

ToolMode = Literal["none", "auto", "constrained"]
# Hybrid reasoning parsers and the chat_template_kwargs switch that turns thinking
# on or off, with its default (as SGLang reads a request).
THINKING_SWITCH = {
    "qwen3": ("enable_thinking", True),
    "glm45": ("enable_thinking", True),
    "deepseek-v3": ("thinking", False),
}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ChatOutputPlan:
    reasoning_parser: str | None = None  # None: no split
    force_reasoning: bool | None = None  # None: the parser's own default
    stream_reasoning: bool = True
    tool_mode: ToolMode = "none"
    tool_call_parser: str | None = None  # "auto" with no parser: the text is content
    tools: tuple[dict[str, Any], ...] = ()
    single_call: bool = False  # parallel_tool_calls false: calls after the first are dropped
    # the request's grammar starts after the think block (GenerateReqInput.require_reasoning)
    grammar_after_reasoning: bool = False

    def kept_calls(self, items: Any) -> list[Any]:
        """The parsed call items to send: the first call's only under single_call."""
        return [i for i in items if not self.single_call or i.tool_index == 0]

    @property
    def parses_calls(self) -> bool:
        return self.tool_mode == "constrained" or (
            self.tool_mode == "auto" and self.tool_call_parser is not None
        )

    def parse_final(self, text: str) -> ChatMessageOut:
        reasoning, rest = self._split_reasoning(text)
        calls, content = self._parse_calls(rest)
        if (calls or reasoning) and not content:  # as SGLang: no answer text is a null
            content = None
        return ChatMessageOut(content=content, reasoning_content=reasoning, tool_calls=calls)

    def _split_reasoning(self, text: str) -> tuple[str | None, str]:
        if self.reasoning_parser is None:
            return None, text
        return self.reasoning(stream=False).parse_non_stream(text)

    def _parse_calls(self, text: str) -> tuple[list[ToolCall] | None, str]:
        items, content = parse_calls(self, text)
        if not items:
            return None, content
        return [_full_call(item) for item in items], content

    def reasoning(self, stream: bool) -> ReasoningParser:
        return ReasoningParser(
            self.reasoning_parser,
            stream_reasoning=self.stream_reasoning if stream else False,
            force_reasoning=self.force_reasoning,
        )

    def call_parser(self) -> FunctionCallParser:
        return FunctionCallParser(list(self.tools), self.tool_call_parser)


def parse_calls(plan: ChatOutputPlan, text: str) -> tuple[list[Any], str]:
    """(ToolCallItems with full arguments, content) of the text after reasoning."""
    if plan.tool_mode == "constrained":
        # read as a stream reads it, so both answers agree (constrained_reader.py)
        items = parse_constrained_calls(text, list(plan.tools))
        return items, "" if items else text  # no call at all (cut short): the text
    if not plan.parses_calls:
        return [], text
    normal_text, items = plan.call_parser().parse_non_stream(text)
    return plan.kept_calls(items), normal_text


def _full_call(item: Any) -> ToolCall:
    return ToolCall(
        id=new_call_id(),
        index=item.tool_index,
        type="function",
        function=FunctionCall(name=item.name, arguments=item.parameters),
    )


# --- the plan of a request -------------------------------------------------------------------


def plan_output(
    request: ChatCompletionRequest,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    end_is_one_token: bool = False,
    prompt: str = "",
) -> ChatOutputPlan:
    """The plan for `request` on an engine with these parsers in effect;
    `end_is_one_token`: the reasoning end tag is one token of the model's tokenizer;
    `prompt`: the rendered prompt."""
    mode = tool_mode(request)
    # separate_reasoning only says whether the think block is split out of the content;
    # whether the model thinks (and a grammar waits for it) is the parser's, as SGLang
    reasoning = reasoning_parser if request.separate_reasoning else None
    force = _thinking(request, reasoning_parser)
    prefill_force = _continued_think_state(request, reasoning_parser, prompt)
    if prefill_force is not None:  # the continued message already opened or closed it
        force = prefill_force
    constrained = mode == "constrained" or shaped_from_first_token(request)
    # As SGLang: a model that thinks first reasons free, and any grammar (a structural
    # tag's triggers too) starts after its think block (constrained/reasoning_gate.py)
    has_grammar = constrained or uses_structural_tag(request, tool_call_parser)
    thinks = reasoning_parser is not None and force is not False
    after_reasoning = has_grammar and thinks and end_is_one_token
    if constrained and not after_reasoning:
        # The grammar shapes the output from its first token: no think block is open
        # unless the output itself writes one (a regex may)
        force = False
    return ChatOutputPlan(
        reasoning_parser=reasoning,
        force_reasoning=force,
        stream_reasoning=request.stream_reasoning,
        tool_mode=mode,
        tool_call_parser=tool_call_parser,
        tools=tuple(tool_dicts(request)),
        single_call=not request.parallel_tool_calls,
        grammar_after_reasoning=after_reasoning,
    )


def _thinking(request: ChatCompletionRequest, reasoning: str | None) -> bool | None:
    """A hybrid model's thinking switch as the request sets it (chat_template_kwargs;
    as the templates read it, a null is the default and any other value its truth);
    None where the parser's default stands."""
    if reasoning not in THINKING_SWITCH:
        return None
    key, default = THINKING_SWITCH[reasoning]
    value = (request.chat_template_kwargs or {}).get(key)
    return default if value is None else bool(value)


def tool_dicts(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    return [tool.model_dump(exclude_none=True) for tool in request.tools or ()]


def choice_value(request: ChatCompletionRequest) -> str | dict[str, Any]:
    """`tool_choice` as sent; absent: "auto" with tools, else "none"."""
    if request.tool_choice is None:
        return "auto" if request.tools else "none"
    if isinstance(request.tool_choice, str):
        return request.tool_choice
    return request.tool_choice.model_dump()


def tool_mode(request: ChatCompletionRequest) -> ToolMode:
    choice = choice_value(request)
    if choice == "none":
        return "none"
    return "auto" if choice == "auto" else "constrained"


def check_tools(request: ChatCompletionRequest) -> None:
    """`tools` / `tool_choice` that cannot be served: a 400 naming the field."""
    if request.tools is None and request.tool_choice is None:
        return
    try:
        check_tool_choice(tool_dicts(request), choice_value(request))
    except ValueError as exc:  # a tool's own schema names its field (ToolParametersError)
        param = "tools" if request.tool_choice is None else "tool_choice"
        param = getattr(exc, "param", param)
        raise APIError(str(exc), param=param, code="invalid_value") from None
    if tool_mode(request) == "constrained" and has_own_grammar(request):
        raise APIError(
            "tool_choice 'required' or a named function is enforced with a grammar; it "
            "cannot be combined with response_format, json_schema, regex or ebnf",
            param="tool_choice",
            code="invalid_value",
        )


def _continued_think_state(
    request: ChatCompletionRequest, reasoning: str | None, prompt: str
) -> bool | None:
    """With continue_final_message: whether the output continues inside the think block.
    The assistant's prefill opened it and did not close it: True; closed it, or is
    answer text with no tag: False. An empty prefill continues where the template left
    the turn (`prompt` ends with it): after a think block it wrote and closed (Qwen3's
    `<think>\n\n</think>\n\n` for a last assistant turn): False; inside one it opened:
    True; else None (the parser's default stands)."""
    if reasoning is None or not request.continue_final_message:
        return None
    last = request.messages[-1]
    # a string or text parts (checked when the prompt rendered)
    text = message_text(last.model_dump()["content"]) if last.role == "assistant" else ""
    fmt = reasoning_format(reasoning)
    if not text.strip():
        tail = prompt.rstrip()
        if tail.endswith(fmt.end_tag):
            return False
        return True if tail.endswith(fmt.start_tag) else None
    opened, closed = text.rfind(fmt.start_tag), text.rfind(fmt.end_tag)
    return opened >= 0 and opened > closed


def shaped_from_first_token(request: ChatCompletionRequest) -> bool:
    """The request's own grammar constrains its output from the first token (regex,
    json_schema, ebnf, a JSON response_format); a structural tag leaves text free."""
    if any(getattr(request, name) is not None for name in ("regex", "json_schema", "ebnf")):
        return True
    fmt = request.response_format
    return fmt is not None and fmt.type in ("json_object", "json_schema")


def has_own_grammar(request: ChatCompletionRequest) -> bool:
    if any(getattr(request, name) is not None for name in ("regex", "json_schema", "ebnf")):
        return True
    return request.response_format is not None and request.response_format.type != "text"


def call_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema the calls must follow ("required": one or more calls; named:
    exactly one call of that function), else None."""
    if tool_mode(request) != "constrained":
        return None
    choice = choice_value(request)
    schema = tool_call_schema(tool_dicts(request), choice)
    if isinstance(choice, dict) or not request.parallel_tool_calls:
        schema = {**schema, "maxItems": 1}  # a named function is called once, as in SGLang
    return schema


def uses_structural_tag(request: ChatCompletionRequest, parser_name: str | None) -> bool:
    """The request's output is held by a structural tag (its own, or strict tools')."""
    fmt = request.response_format
    if fmt is not None and fmt.type == "structural_tag":
        return True
    return strict_calls_tag(request, parser_name) is not None


def strict_calls_tag(request: ChatCompletionRequest, parser_name: str | None) -> dict | None:
    """Under "auto", the structural tag that holds the calls of `strict: true` tools to
    their schemas (strict_calls.py), else None. An explicit response_format / grammar
    is the request's constraint instead (docs/api.md)."""
    if tool_mode(request) != "auto" or not request.tools or has_own_grammar(request):
        return None
    return strict_tools_tag(tool_dicts(request), parser_name)


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools the chat template shows the model: none under "none", only the named
    function under a named choice (as SGLang renders them)."""
    mode = tool_mode(request)
    if mode == "none" or not request.tools:
        return None
    tools = tool_dicts(request)
    choice = choice_value(request)
    if isinstance(choice, dict):
        return [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    return tools


# --- streaming -------------------------------------------------------------------------------


@dataclass
class ChoiceOutputStream:
    """One choice's stream: text deltas in, OpenAI delta messages out."""

    plan: ChatOutputPlan
    _reasoning: Any = None
    _calls: Any = None
    _ids: dict[int, str] = field(default_factory=dict)  # tool_index -> call id
    _call_text: str = ""  # forced calls' text so far (sent as content if no call came)

    def __post_init__(self) -> None:
        if self.plan.reasoning_parser is not None:
            self._reasoning = self.plan.reasoning(stream=True)
        if self.plan.tool_mode == "constrained":
            self._calls = ConstrainedCallStream(list(self.plan.tools))
        elif self.plan.parses_calls:
            self._calls = self.plan.call_parser()

    @property
    def made_calls(self) -> bool:
        return bool(self._ids)

    def feed(self, delta: str) -> list[DeltaMessage]:
        if self._reasoning is None:
            return self._deltas("", *self._read_calls(delta))
        reasoning, rest = self._reasoning.parse_stream_chunk(delta)
        return self._deltas(reasoning, *self._read_calls(rest))

    def finish(self) -> list[DeltaMessage]:
        """What the parsers held back (a possible tag or call marker) at the end."""
        reasoning, rest = self._reasoning.finish() if self._reasoning is not None else ("", "")
        content, items = self._read_calls(rest)
        if self._calls is not None and self.plan.tool_mode == "auto":
            held = self._calls.finish_stream()
            content = content + held.normal_text
            items = items + self.plan.kept_calls(held.calls)
        deltas = self._deltas(reasoning, content, items)
        if self.plan.tool_mode == "constrained" and not self._ids and self._call_text:
            # cut off (max_tokens) before a first call: the text, as without streaming
            deltas.append(DeltaMessage(content=self._call_text))
        return deltas

    def _read_calls(self, text: str) -> tuple[str, list[Any]]:
        if self._calls is None or not text:
            return text, []
        if self.plan.tool_mode == "constrained":
            self._call_text += text
            return "", self._calls.feed(text)
        result = self._calls.parse_stream_chunk(text)
        return result.normal_text, self.plan.kept_calls(result.calls)

    def _deltas(self, reasoning: str, content: str, items: list[Any]) -> list[DeltaMessage]:
        out = [DeltaMessage(reasoning_content=reasoning)] if reasoning else []
        if content:
            out.append(DeltaMessage(content=content))
        calls = [self._call_delta(item) for item in items]
        calls = [c for c in calls if c is not None]
        if calls:
            out.append(DeltaMessage(tool_calls=calls))
        return out

    def _call_delta(self, item: Any) -> ToolCall | None:
        """A call's first piece carries its id, type and name; later ones an argument fragment."""
        if item.name is not None:
            self._ids[item.tool_index] = new_call_id()
            function = FunctionCall(name=item.name, arguments=item.parameters or "")
            return ToolCall(index=item.tool_index, id=self._ids[item.tool_index],
                            type="function", function=function)  # fmt: skip
        if not item.parameters or item.tool_index not in self._ids:
            return None
        return ToolCall(index=item.tool_index, function=FunctionCall(arguments=item.parameters))
