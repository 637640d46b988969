"""Per-prompt values of a batched generate request, as SGLang's GenerateReqInput takes
them: an option is one value for every prompt or a list with one per prompt, and one
rid (or one per prompt) names each generation of prompts x n. Shared by the Engine and
the native /generate route, so both expand a batch the same way."""

from __future__ import annotations

import uuid
from typing import Any


def per_prompt(value: Any, count: int, name: str | None = None) -> list[Any]:
    """`value` for each of `count` prompts: a list is one per prompt (ValueError naming
    `name` when its length differs), anything else is every prompt's."""
    if isinstance(value, list):
        if len(value) != count:
            what = f"{name}: " if name else ""
            raise ValueError(f"{what}got {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def option_per_prompt(name: str, value: Any, count: int) -> list[Any]:
    """A generate option's value for each prompt; token_ids_logprob is itself a list,
    so only a list of lists gives one per prompt."""
    if name == "token_ids_logprob" and not (value and isinstance(value[0], list)):
        return [value] * count
    return per_prompt(value, count, name)


def sample_rids(rid: Any, samples: list[int]) -> list[tuple[str, str | None]]:
    """(rid, parent rid) of each generation, prompt-major; `samples[i]` is prompt i's n.
    `rid`: None (fresh ids), one string, or one per prompt. Several generations under
    one rid are `<rid>-<k>` with that rid as their parent, which abort_request reaches."""
    total = sum(samples)
    if rid is None:
        return [(uuid.uuid4().hex, None) for _ in range(total)]
    if not isinstance(rid, list):
        if total == 1:
            return [(rid, None)]
        return [(f"{rid}-{k}", rid) for k in range(total)]
    rids = per_prompt(rid, len(samples), "rid")
    return [
        (f"{r}-{k}", r) if n > 1 else (r, None) for r, n in zip(rids, samples)
        for k in range(n)
    ]  # fmt: skip
