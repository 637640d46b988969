"""FunctionCallParser: the tool-call parser a chat response uses, by name.

One instance per response: streaming state lives in it. Call
`parse_stream_chunk` with each text delta, then `finish_stream` once at the
end to release text held back as a possible call marker.
"""

from __future__ import annotations

from sglang.srt.parser.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.parser.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.parser.function_call.hermes_detector import HermesDetector
from sglang.srt.parser.function_call.llama32_detector import Llama32Detector
from sglang.srt.parser.function_call.mistral_detector import MistralDetector
from sglang.srt.parser.function_call.pythonic_detector import PythonicDetector

DETECTORS: dict[str, type[BaseFormatDetector]] = {
    "qwen25": HermesDetector,
    "qwen3": HermesDetector,
    "hermes": HermesDetector,
    "llama3": Llama32Detector,
    "mistral": MistralDetector,
    "pythonic": PythonicDetector,
}
TOOL_CALL_PARSER_NAMES = tuple(DETECTORS)


def detector_class(parser_name: str) -> type[BaseFormatDetector]:
    try:
        return DETECTORS[parser_name]
    except KeyError:
        choices = ", ".join(TOOL_CALL_PARSER_NAMES)
        raise ValueError(
            f"unknown tool call parser {parser_name!r}; choose one of: {choices}"
        ) from None


class FunctionCallParser:
    """Splits model output into normal text and calls to the request's `tools`.

    `tools` are OpenAI tool dicts; a call to a function not among them is not a
    call, and its text stays in the normal text.
    """

    def __init__(self, tools: list[dict] | None, parser_name: str) -> None:
        self.tools = list(tools or [])
        self._detector = detector_class(parser_name)()

    def has_tool_call(self, text: str) -> bool:
        return self._detector.has_tool_call(text)

    def parse_non_stream(self, text: str) -> tuple[str, list[ToolCallItem]]:
        result = self._detector.detect_and_parse(text, self.tools)
        return result.normal_text, result.calls

    def parse_stream_chunk(self, delta: str) -> StreamingParseResult:
        return self._detector.parse_streaming_increment(delta, self.tools)

    def finish_stream(self) -> StreamingParseResult:
        return self._detector.finish_streaming()
