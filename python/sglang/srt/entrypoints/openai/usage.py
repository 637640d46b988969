"""Token accounting of a response over its choices.

Choices are laid out prompt-major: choice `i * n + j` is sample j of prompt i.
A prompt is counted once however many samples it has (its first choice speaks
for it); completion tokens are summed over every choice.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.entrypoints.openai.protocol import PromptTokensDetails, UsageInfo


def usage_of(metas: list[dict[str, Any]], n: int) -> UsageInfo:
    """`metas[k]` is choice k's (final) meta_info."""
    prompt_metas = metas[::n]
    prompt_tokens = sum(int(m.get("prompt_tokens", 0)) for m in prompt_metas)
    cached_tokens = sum(int(m.get("cached_tokens", 0)) for m in prompt_metas)
    completion_tokens = sum(int(m.get("completion_tokens", 0)) for m in metas)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def finish_reason_of(meta: dict[str, Any]) -> tuple[str | None, int | str | None]:
    """OpenAI's `finish_reason` ("stop" / "length" / "abort") and SGLang's `matched_stop`."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None, None
    return reason.get("type"), reason.get("matched")
