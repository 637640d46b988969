"""Pythonic calls (Llama 3.2/4 pythonic templates, several small models):

    [get_weather(city="Paris"), get_time(zone="CET")]

A `[` not followed by `name(` is text, so `[1, 2]` or `[see above]` pass through.
"""

from __future__ import annotations

import re

from sglang.srt.parser.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.parser.function_call.python_call import PythonCallReader, is_call_start
from sglang.srt.parser.function_call.region_scanner import RegionFormat

PYTHONIC_FORMAT = RegionFormat(
    bot_token="[",
    open_token=None,
    separator=",",
    close_token="]",
    bare_start=False,
    starts_call=is_call_start,
    new_reader=PythonCallReader,
)

_CALL_LIST_START = re.compile(r"\[\s*[A-Za-z_]\w*\(")


class PythonicDetector(BaseFormatDetector):
    format = PYTHONIC_FORMAT

    def has_tool_call(self, text: str) -> bool:
        return _CALL_LIST_START.search(text) is not None
