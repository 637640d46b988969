"""Per-prompt values of a batched generate request, as SGLang's GenerateReqInput takes
them: an option is one value for every prompt or a list with one per prompt, and one
rid (or one per prompt) names each generation of prompts x n. Shared by the Engine and
the native /generate route, so both expand a batch the same way."""

from __future__ import annotations

import uuid
from typing import Any

from sglang.srt.sampling.param_types import InvalidParamError


def per_prompt(value: Any, count: int, name: str | None = None) -> list[Any]:
    """`value` for each of `count` prompts: a list is one per prompt (InvalidParamError
    naming `name` when its length differs), anything else is every prompt's."""
    if isinstance(value, list):
        if len(value) != count:
            what = f"{name}: " if name else ""
            raise InvalidParamError(f"{what}got {len(value)} entries for {count} prompts", name)
        return value
    return [value] * count


def check_prompt_count(count: int, prompt_param: str) -> None:
    """A prompt list (the field `prompt_param`) must hold a prompt."""
    if not count:
        raise InvalidParamError("the prompt list is empty", prompt_param)


def params_per_prompt(params: Any, count: int) -> list[Any]:
    """`sampling_params` for each prompt: one for all, or a list with one per prompt."""
    if isinstance(params, list) and len(params) != count:
        raise InvalidParamError(
            f"sampling_params has {len(params)} entries for {count} prompts; give one dict "
            "for all, or one per prompt",
            "sampling_params",
        )
    return per_prompt(params, count)


def check_same_n(samples: list[int]) -> None:
    """Every prompt of a batch asks for the same n (as SGLang, which fans out by one n)."""
    if len(set(samples)) > 1:
        raise InvalidParamError(
            "sampling_params: every prompt's n must be the same", "sampling_params"
        )


def option_per_prompt(name: str, value: Any, count: int) -> list[Any]:
    """A generate option's value for each prompt; token_ids_logprob is itself a list,
    so only a list of lists gives one per prompt."""
    if name == "token_ids_logprob" and not (value and isinstance(value[0], list)):
        return [value] * count
    return per_prompt(value, count, name)


def sample_rids(rid: Any, samples: list[int]) -> list[tuple[str, str | None]]:
    """(rid, parent rid) of each generation, prompt-major; `samples[i]` is prompt i's n.
    `rid`: None (fresh ids), one string, or one per prompt. Several generations under
    one rid are `<rid>-<k>` with that rid as their parent, which abort_request reaches;
    with no rid, a prompt's n > 1 samples share a fresh parent (the scheduler tells a
    request too large for its queue from a full queue by it)."""
    total = sum(samples)
    if rid is None:
        fresh = [uuid.uuid4().hex for _ in samples]
        return [
            (f"{r}-{k}", r) if n > 1 else (uuid.uuid4().hex, None)
            for r, n in zip(fresh, samples) for k in range(n)
        ]  # fmt: skip
    if not isinstance(rid, list):
        if total == 1:
            return [(rid, None)]
        return [(f"{rid}-{k}", rid) for k in range(total)]
    rids = per_prompt(rid, len(samples), "rid")
    return [
        (f"{r}-{k}", r) if n > 1 else (r, None) for r, n in zip(rids, samples)
        for k in range(n)
    ]  # fmt: skip
