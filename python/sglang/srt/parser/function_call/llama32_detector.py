"""Llama 3.1/3.2/3.3 JSON calls:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

The `<|python_tag|>` may be missing when the output opens with the object;
several calls are separated by `;`. ("arguments" is read as well.)
"""

from __future__ import annotations

from sglang.srt.parser.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.parser.function_call.json_call import JsonCallReader
from sglang.srt.parser.function_call.region_scanner import RegionFormat
from sglang.srt.parser.function_call.text_utils import JSON_WHITESPACE

LLAMA3_FORMAT = RegionFormat(
    bot_token="<|python_tag|>",
    open_token=None,
    separator=";",
    close_token=None,
    bare_start=True,
    starts_call=lambda ch: ch == "{",
    new_reader=JsonCallReader,
)


class Llama32Detector(BaseFormatDetector):
    format = LLAMA3_FORMAT

    def has_tool_call(self, text: str) -> bool:
        return self.format.bot_token in text or text.lstrip(JSON_WHITESPACE).startswith("{")
