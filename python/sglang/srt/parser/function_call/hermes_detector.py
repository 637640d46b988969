"""Hermes-style calls (Qwen2.5, Qwen3, Hermes 2/3):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One JSON object per block; several blocks may follow each other.
"""

from __future__ import annotations

from sglang.srt.parser.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.parser.function_call.json_call import JsonCallReader
from sglang.srt.parser.function_call.region_scanner import RegionFormat

HERMES_FORMAT = RegionFormat(
    bot_token="<tool_call>",
    open_token=None,
    separator=None,
    close_token="</tool_call>",
    bare_start=False,
    starts_call=lambda ch: ch == "{",
    new_reader=JsonCallReader,
    tail_to_close=True,
)


class HermesDetector(BaseFormatDetector):
    format = HERMES_FORMAT
