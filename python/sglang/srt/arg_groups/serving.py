"""The `serving` namespace: the HTTP front end and chat formatting."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg
from sglang.srt.parser.function_call.parser import TOOL_CALL_PARSER_NAMES
from sglang.srt.parser.reasoning_parser import REASONING_PARSER_NAMES

DETOKENIZER_MODES = ("auto", "process", "inline")
SAMPLING_DEFAULTS = ("model", "openai")


@dataclass(kw_only=True)
class ServingArgs:
    _NS_PATH = "serving"

    host: str = arg("127.0.0.1", "HTTP host to bind.")
    port: int = arg(30000, "HTTP port to bind.")
    api_key: str | None = arg(None, "Require this key as a Bearer token on every route but /health.")
    served_model_name: str | None = arg(
        None, "Model name reported by /v1/models. Default: model path."
    )
    chat_template: str | None = arg(
        None, "Chat template: a Jinja file (or inline Jinja text). Default: the tokenizer's."
    )
    reasoning_parser: str | None = arg(
        None,
        "Split the <think> part of chat output into reasoning_content. "
        "Default: detected from the chat template.",
        choices=REASONING_PARSER_NAMES,
    )
    tool_call_parser: str | None = arg(
        None,
        "Parse the model's tool calls (tool_choice auto) into message.tool_calls. "
        "Default: detected from the chat template.",
        choices=TOOL_CALL_PARSER_NAMES,
    )
    max_request_body_mb: int = arg(
        64,
        "Largest HTTP request body accepted, in MiB; a larger one is refused with a 413 "
        "before it is read whole (a body is parsed in memory, at several times its size).",
    )
    skip_server_warmup: bool = arg(False, "Skip the warmup request after start.")
    allow_auto_truncate: bool = arg(
        False,
        "A prompt longer than the context (or the KV pool) keeps its first tokens that fit, "
        "and max_new_tokens shrinks to the room left, instead of a 400; each cut is logged "
        "and usage counts the tokens kept.",
    )
    sampling_defaults: str = arg(
        "model",
        "What a request's unset sampling fields default to: the model's "
        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
        "as SGLang and vLLM do), or the API's (openai: temperature 1, top_p 1, no top_k, "
        "min_p or repetition penalty).",
        choices=SAMPLING_DEFAULTS,
    )
    detokenizer_mode: str = arg(
        "auto",
        "Where token ids become text: a detokenizer process between the scheduler and the "
        "HTTP front end (process), or the front end's TokenizerManager itself (inline: one "
        "process and one IPC hop fewer per streamed token, for few cores). Default: inline "
        "on CPU with dp_size 1 on one node, else process.",
        choices=DETOKENIZER_MODES,
    )
