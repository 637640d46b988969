"""The one definition of every sampling field's type and range.

`SamplingParams` (the native `sampling_params` dict of `/generate` and
`Engine.generate`) and the OpenAI request models build their fields from the
annotated types below, so a field has the same rule on every path. Every type
is strict: `"5"` is not an int, `1.5` is not an int, `"no"` is not a bool.

A rule violation is an `InvalidParamError` (a ValueError) naming the field; the
HTTP layer answers it with a 400 whose `param` is that field.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError, model_validator

# Caps, documented in docs/api.md ("Limits").
MAX_N = 128  # samples per prompt (`n`), on every path
MAX_TOP_LOGPROBS_NUM = 100  # native `top_logprobs_num` (also capped by the vocabulary)
MAX_OPENAI_TOP_LOGPROBS = 20  # OpenAI `logprobs` / `top_logprobs`, as the OpenAI API caps it
MAX_STOP_STRS = 64  # stop strings per request
MAX_STOP_STR_CHARS = 1024  # characters per stop string
MAX_STOP_TOKEN_IDS = 1024
MAX_TOKEN_IDS_LOGPROB = 1024  # native `token_ids_logprob` (ids listed at every position)
MAX_LOGIT_BIAS_ENTRIES = 1024
LOGIT_BIAS_LIMIT = 100.0  # |bias| <= 100, as OpenAI
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes


class InvalidParamError(ValueError):
    """A request field broke its rule; `param` names it (dotted JSON path)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _check_stop(value: Union[str, list[str], None]) -> Union[str, list[str], None]:
    stops = [value] if isinstance(value, str) else value or []
    if any(not s for s in stops):
        raise ValueError("stop strings must be non-empty")
    if any(len(s) > MAX_STOP_STR_CHARS for s in stops):
        raise ValueError(f"a stop string is at most {MAX_STOP_STR_CHARS} characters")
    return value


# One spelling per id (ASCII digits, no leading zero, no "-0"): "366" and "0366" were
# two keys of one token, their biases summed past the +-100 cap. Negative ids pass here
# to be refused by the vocabulary check, which names the range.
_TOKEN_ID_KEY = re.compile(r"0|-?[1-9][0-9]*")


def _check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    for key in value or {}:
        if not _TOKEN_ID_KEY.fullmatch(key):  # ASCII digits: str.isdigit admits "²", "５"
            raise ValueError(
                f"logit_bias keys must be token ids written as integers (no leading zero, "
                f"no sign on 0), got {key!r}"
            )
    return value


def strict(kind: Any, **rule: Any) -> Any:
    return Annotated[kind, Field(strict=True, **rule)]


NonNegInt = strict(int, ge=0)
Flag = strict(bool)
FLOAT32_MAX = 3.4028234663852886e38  # a larger temperature is inf in the float32 logits
Temperature = strict(float, ge=0.0, le=FLOAT32_MAX, allow_inf_nan=False)
TopP = strict(float, gt=0.0, le=1.0)
TopK = strict(int, ge=-1)  # -1 or 0: all tokens
MinP = strict(float, ge=0.0, le=1.0)
Penalty = strict(float, ge=-2.0, le=2.0)  # frequency / presence
RepetitionPenalty = strict(float, gt=0.0, le=2.0)
NumSamples = strict(int, ge=1, le=MAX_N)
Seed = strict(int, ge=SEED_RANGE[0], le=SEED_RANGE[1])
StopStrings = Annotated[
    Union[strict(str), Annotated[list[strict(str)], Field(max_length=MAX_STOP_STRS)], None],
    AfterValidator(_check_stop),
]
TokenIds = Annotated[list[NonNegInt], Field(max_length=MAX_STOP_TOKEN_IDS)]
LogitBias = Annotated[
    dict[strict(str), strict(float, ge=-LOGIT_BIAS_LIMIT, le=LOGIT_BIAS_LIMIT)],
    Field(max_length=MAX_LOGIT_BIAS_ENTRIES),
    AfterValidator(_check_logit_bias),
]
GrammarText = strict(str)
# Request-level fields (GenerateReqInput, /generate and the OpenAI `rid`).
RequestId = strict(str, min_length=1)
TopLogprobsNum = strict(int, ge=0, le=MAX_TOP_LOGPROBS_NUM)  # also <= the vocabulary
LogprobStartLen = strict(int, ge=-1)
LogprobTokenIds = Annotated[list[NonNegInt], Field(max_length=MAX_TOKEN_IDS_LOGPROB)]


_NUM_SAMPLES = TypeAdapter(NumSamples)


def check_num_samples(value: Any, param: str = "n") -> None:
    """`n` where it is split off before SamplingParams sees it (the Engine's fan-out)."""
    try:
        _NUM_SAMPLES.validate_python(value)
    except ValidationError as exc:
        raise error_of(exc.errors()[0], param) from None


def first_error(exc: ValidationError, prefix: str = "") -> InvalidParamError:
    """The first pydantic error as an InvalidParamError named by its dotted path."""
    errors = exc.errors()
    if not errors:
        return InvalidParamError(str(exc), prefix.rstrip(".") or None)
    return error_of(most_telling_error(errors), prefix)


def most_telling_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the first error's field, the error of the union member the client meant: one
    that is not a type mismatch (65 stop strings are "at most 64 items", not the str
    member's "Input should be a valid string"), else the one deepest in the value
    (`input_ids: [[1], [2, [3]]]` is wrong at `input_ids.1.1`, not at the flat list
    member's `input_ids.0`); the first of equals."""
    field = _field_path(errors[0])[:1]
    same_field = [e for e in errors if _field_path(e)[:1] == field]
    return min(same_field, key=lambda e: (_is_type_mismatch(e), -len(_field_path(e))))


def _is_type_mismatch(error: dict[str, Any]) -> bool:
    return error.get("type", "").endswith("_type")


def _field_path(error: dict[str, Any]) -> list[str]:
    return [str(part) for part in error.get("loc", ()) if not _is_type_tag(part)]


def error_of(error: dict[str, Any], prefix: str = "") -> InvalidParamError:
    """One pydantic error dict (`loc`, `msg`, `type`) as an InvalidParamError."""
    loc = _field_path(error)
    param = prefix + ".".join(loc) if loc else prefix.rstrip(".") or None
    message = error.get("msg", "invalid value").removeprefix("Value error, ")  # a validator's
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    elif _is_huge_integer(error):
        message = "integer out of range (at most 64 bits)"
    return InvalidParamError(f"{param}: {message}" if param else message, param)


def _is_huge_integer(error: dict[str, Any]) -> bool:
    """An integer field given an integer literal past 64 bits: orjson reads such a
    literal as a float, which pydantic then calls "not a valid integer"."""
    value = error.get("input")
    return (
        error.get("type", "").startswith("int")
        and isinstance(value, float)
        and value.is_integer()
        and abs(value) >= 2.0**63
    )


_TYPE_TAGS = frozenset({"body", "str", "int", "float", "bool", "dict", "list", "none"})


def _is_type_tag(part: object) -> bool:
    """pydantic names union members and wrappers in the path; they are not fields."""
    if not isinstance(part, str):
        return False
    return (
        part in _TYPE_TAGS
        or "[" in part
        or part.startswith(("function-", "union", "constrained-"))  # constrained-str: a str with a rule
        or part[:1].isupper()  # a model member of a union (SamplingParamsSpec): fields are lower
    )


class NullTakesTheDefault(BaseModel):
    """OpenAI's reference marks `n`, `stream`, the penalties, `logprobs`, `echo`, ...
    nullable and clients (LangChain, LiteLLM) send explicit nulls: as in vLLM, a null
    means the field's default (SGLang's GenerateReqInput and SamplingParams declare
    their fields Optional too). A required field's null is still refused, and a field
    whose type holds None keeps it (`max_new_tokens: null` is "up to the context")."""

    @model_validator(mode="before")
    @classmethod
    def _null_takes_the_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaulted = _fields_null_defaults(cls)
        return {k: v for k, v in data.items() if v is not None or k not in defaulted}


@functools.cache
def _fields_null_defaults(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` whose null means their default: optional, with a default
    other than None, of a type that does not hold None."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if not field.is_required()
        and field.get_default(call_default_factory=True) is not None
        and not _holds_none(field.annotation)
    )


def _holds_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return any(_holds_none(arg) for arg in typing.get_args(annotation))
    if origin is Annotated:
        return _holds_none(typing.get_args(annotation)[0])
    return False
