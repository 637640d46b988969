"""detect_parsers on excerpts of real chat templates (the parts the rules read)."""

from __future__ import annotations

import pytest

from sglang.srt.parser.detection import DETECTION_RULES, detect_parsers
from sglang.srt.parser.function_call import TOOL_CALL_PARSER_NAMES
from sglang.srt.parser.reasoning_parser import REASONING_PARSER_NAMES

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- for tool_call in message.tool_calls %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = (
    QWEN25.replace("{%- if add_generation_prompt %}", "{%- if false %}")
    + r"""{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
)

QWEN3_THINKING_2507 = QWEN25.replace(
    "{{- '<|im_start|>assistant\\n' }}\n{%- endif %}",
    "{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}",
)

LLAMA31 = r"""{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
        {%- else %}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA32_JSON_ONLY = r"""{%- if tools is not none and not tools_in_user_message %}
    {{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA32_PYTHONIC = r"""{%- if tools is not none %}
    {{- "You are an expert in composing functions. Given a question and a set of possible functions, you need to make one or more function/tool calls.\n" }}
    {{- "If you decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n" }}
    {{- "You SHOULD NOT include any other text in the response.\n" }}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

MISTRAL_V3 = r"""{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {{- tool.function|tojson }}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST] " + message["content"] + "[/INST]" }}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {{- tool_call.function|tojson }}
        {%- endfor %}
        {{- "]" + eos_token }}
    {%- endif %}
{%- endfor %}
"""

DEEPSEEK_R1 = r"""{% set ns = namespace(is_first=false, is_tool=false, system_prompt='') %}
{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}
    {%- if message['role'] == 'assistant' and 'tool_calls' in message %}
        {{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
    {%- endif %}
    {%- if message['role'] == 'assistant' and message['content'] is not none %}
        {% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
        {{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}
"""

DEEPSEEK_V31 = r"""{%- for message in messages %}
  {%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}
{%- endfor %}
{% if add_generation_prompt and not ns.is_tool %}
  {%- if not thinking %}{{'<｜Assistant｜></think>'}}{%- else %}{{'<｜Assistant｜><think>'}}{%- endif %}
{% endif %}
"""

PLAIN_CHATML = r"""{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

CASES = [
    ("qwen2.5", QWEN25, ("qwen25", None)),
    ("qwen3", QWEN3, ("qwen25", "qwen3")),
    ("qwen3-thinking-2507", QWEN3_THINKING_2507, ("qwen25", "qwen3-thinking")),
    ("llama3.1", LLAMA31, ("llama3", None)),
    ("llama3.2-json", LLAMA32_JSON_ONLY, ("llama3", None)),
    ("llama3.2-pythonic", LLAMA32_PYTHONIC, ("pythonic", None)),
    ("mistral", MISTRAL_V3, ("mistral", None)),
    ("deepseek-r1", DEEPSEEK_R1, (None, "deepseek-r1")),
    ("deepseek-v3.1", DEEPSEEK_V31, (None, "deepseek-v3")),
    ("plain", PLAIN_CHATML, (None, None)),
    ("none", None, (None, None)),
    ("empty", "", (None, None)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_detect_parsers(case):
    _, template, expected = case
    assert detect_parsers(template) == expected


def test_every_rule_names_a_real_parser():
    for rule in DETECTION_RULES:
        names = TOOL_CALL_PARSER_NAMES if rule.kind == "tool" else REASONING_PARSER_NAMES
        assert rule.parser in names, rule
