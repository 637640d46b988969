"""From an OpenAI request's sampling fields to SGLang's `sampling_params` dict."""

from __future__ import annotations

from typing import Any

from sglang.srt.entrypoints.openai.errors import APIError, unsupported_structured_output
from sglang.srt.entrypoints.openai.protocol import SamplingFields
from sglang.srt.sampling.param_types import InvalidParamError
from sglang.srt.sampling.sampling_params import SamplingParams

DEFAULT_TEMPERATURE = 1.0


def reject_structured_output(request: SamplingFields) -> None:
    """Structured output is declared in the schema but not served yet: answer 400."""
    for name in ("regex", "json_schema", "ebnf"):
        if getattr(request, name) is not None:
            raise unsupported_structured_output(name)
    if request.response_format is not None and request.response_format.type != "text":
        raise unsupported_structured_output("response_format")


# OpenAI field names of the native sampling fields they map to (errors name the former).
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def check_choice_params(params: dict[str, Any], vocab_size: int | None) -> None:
    """The native rules (cross-field, vocabulary) on the translated dict, so the
    OpenAI routes refuse exactly what /generate refuses; errors use OpenAI names."""
    try:
        SamplingParams.from_dict(params).verify(vocab_size)
    except InvalidParamError as exc:
        native = (exc.param or "").split(".")[0]
        param = _OPENAI_NAMES.get(native, native) or None
        message = str(exc)
        for old, new in _OPENAI_NAMES.items():
            message = message.replace(old, new)
        raise APIError(message, param=param, code="invalid_value") from None


def sampling_params(request: SamplingFields, max_new_tokens: int | None) -> dict[str, Any]:
    """The per-choice sampling dict (n = 1: the serving layer fans out choices)."""
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": request.min_tokens,
        "temperature": DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "ignore_eos": request.ignore_eos,
        "skip_special_tokens": request.skip_special_tokens,
        "no_stop_trim": request.no_stop_trim,
        "logit_bias": request.logit_bias,
        "seed": request.seed,
    }
    return {key: value for key, value in params.items() if value is not None}


def for_choice(params: dict[str, Any], choice_idx: int) -> dict[str, Any]:
    """Choice j of a seeded request samples with seed + j, so n > 1 choices differ
    yet the whole response is reproducible."""
    if "seed" not in params or choice_idx == 0:
        return params
    return {**params, "seed": params["seed"] + choice_idx}
