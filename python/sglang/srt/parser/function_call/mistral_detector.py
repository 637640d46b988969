"""Mistral calls (v3 tokenizer format):

[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
"""

from __future__ import annotations

from sglang.srt.parser.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.parser.function_call.json_call import JsonCallReader
from sglang.srt.parser.function_call.region_scanner import RegionFormat

MISTRAL_FORMAT = RegionFormat(
    bot_token="[TOOL_CALLS]",
    open_token="[",
    separator=",",
    close_token="]",
    bare_start=False,
    starts_call=lambda ch: ch == "{",
    new_reader=JsonCallReader,
)


class MistralDetector(BaseFormatDetector):
    format = MISTRAL_FORMAT
