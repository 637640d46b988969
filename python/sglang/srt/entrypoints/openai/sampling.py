"""From an OpenAI request's sampling fields to SGLang's `sampling_params` dict."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from sglang.srt.constrained.base import ANY_JSON_OBJECT
from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.protocol import ResponseFormat, SamplingFields
from sglang.srt.sampling.param_types import SEED_RANGE, InvalidParamError
from sglang.srt.sampling.sampling_params import SamplingParams


def constraint_params(request: SamplingFields) -> dict[str, str]:
    """The native constraint field (json_schema / regex / ebnf / structural_tag) the
    request asks for, from SGLang's extra fields or OpenAI's `response_format`."""
    given = {name: getattr(request, name) for name in ("regex", "json_schema", "ebnf")}
    given = {name: text for name, text in given.items() if text is not None}
    fmt = request.response_format
    if fmt is not None and fmt.type != "text":
        if given:
            raise APIError(
                f"response_format and {next(iter(given))} are mutually exclusive",
                param="response_format",
            )
        given = _from_response_format(fmt)
    return given


def _from_response_format(fmt: ResponseFormat) -> dict[str, str]:
    if fmt.type == "json_object":
        return {"json_schema": ANY_JSON_OBJECT}
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if not isinstance(spec, dict):
            raise APIError(
                "response_format json_schema needs a json_schema object: "
                '{"name": ..., "schema": {...}}',
                param="response_format.json_schema",
            )
        schema = spec.get("schema")
        if schema is None:
            return {"json_schema": ANY_JSON_OBJECT}
        if not isinstance(schema, dict):
            raise APIError(
                "response_format.json_schema.schema must be a JSON object",
                param="response_format.json_schema.schema",
            )
        return {"json_schema": json.dumps(schema)}
    extra = fmt.model_extra or {}
    if not isinstance(extra.get("structures"), list) or not isinstance(extra.get("triggers"), list):
        raise APIError(
            "response_format structural_tag needs `structures` "
            '([{"begin", "schema", "end"}]) and `triggers` (a list of strings)',
            param="response_format",
        )
    return {"structural_tag": json.dumps(extra)}


def openai_param(request: SamplingFields, native_path: str) -> str:
    """The request field a runtime error on native `sampling_params.<name>` is about."""
    name = native_path.removeprefix("sampling_params.")
    if name in ("json_schema", "structural_tag") and request.response_format is not None:
        return "response_format"
    if name == "json_schema" and _calls_constrained(request):  # the calls' schema
        return "tools"
    if name == "structural_tag":  # not response_format's: strict tools' (chat "auto")
        return "tools"
    if name in ("text", "input_ids"):  # the prompt the route built them from
        return "messages" if hasattr(request, "messages") else "prompt"
    return _OPENAI_NAMES.get(name, name)


def _calls_constrained(request: SamplingFields) -> bool:
    """A chat request whose tool calls are forced (tool_choice "required" or a named
    function): its json_schema is built from `tools`."""
    choice = getattr(request, "tool_choice", None)
    return bool(getattr(request, "tools", None)) and choice not in (None, "auto", "none")


def openai_message(message: str, param_of: Callable[[str], str] | None = None) -> str:
    """A runtime error's message with the OpenAI names of the native fields it cites
    (`param_of` names a `sampling_params.<name>` path as the request's field)."""
    if param_of is not None:
        message = _NATIVE_PATH.sub(lambda m: param_of(m.group(0)), message)
    for native, name in _OPENAI_NAMES.items():
        message = message.replace(native, name)
    return message


_NATIVE_PATH = re.compile(r"\bsampling_params\.\w+")


# OpenAI field names of the native sampling fields they map to (errors name the former).
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def check_choice_params(
    params: dict[str, Any], vocab_size: int | None, param_of: Callable[[str], str]
) -> None:
    """The native rules (cross-field, vocabulary) on the translated dict, so the
    OpenAI routes refuse exactly what /generate refuses; errors use the request's names
    (`param_of`: openai_param of the request)."""
    try:
        SamplingParams.from_dict(params).verify(vocab_size)
    except InvalidParamError as exc:
        native = (exc.param or "").split(".")[0]
        param = param_of(native) if native else None
        message = openai_message(str(exc), param_of)
        if native and param and message.startswith(native + " "):  # "json_schema nests ..."
            message = param + message[len(native) :]
        raise APIError(message, param=param, code="invalid_value") from None


def sampling_params(request: SamplingFields, max_new_tokens: int | None) -> dict[str, Any]:
    """The per-choice sampling dict (n = 1: the serving layer fans out choices)."""
    # the fields a model's generation_config.json may set defaults for go only when the
    # request set them (--sampling-defaults: the TokenizerManager fills in the rest)
    given = request.model_fields_set
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": request.min_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k if "top_k" in given else None,
        "min_p": request.min_p if "min_p" in given else None,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty if "repetition_penalty" in given else None,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "ignore_eos": request.ignore_eos,
        "skip_special_tokens": request.skip_special_tokens,
        "no_stop_trim": request.no_stop_trim or request.include_stop_str_in_output,
        "logit_bias": request.logit_bias,
        "seed": request.seed,
        **constraint_params(request),
    }
    return {key: value for key, value in params.items() if value is not None}


def for_choice(params: dict[str, Any], choice_idx: int) -> dict[str, Any]:
    """Choice j of a seeded request samples with seed + j, so n > 1 choices differ
    yet the whole response is reproducible."""
    seed = params.get("seed")
    if type(seed) is not int or choice_idx == 0:  # None: unseeded; not an int: refused later
        return params
    seed += choice_idx
    if seed > SEED_RANGE[1]:  # past the top of the range: wrap to the bottom, still distinct
        seed -= 1 << 64
    return {**params, "seed": seed}
