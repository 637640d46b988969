"""Chat templates: load an override (`--chat-template FILE`) and render messages.

The tokenizer's own template is the default. Rendering goes through the
tokenizer's `apply_chat_template` with `tokenize=False`; the caller tokenizes the
rendered text with `add_special_tokens=False`, since the template already writes
any special tokens the model expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ChatTemplateError(ValueError):
    """The request's messages cannot be rendered (no template, bad content)."""


def load_chat_template(value: str | None) -> str | None:
    """`value` is a Jinja file path or an inline template; None keeps the tokenizer's."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{%" in value or "{{" in value:
        return value
    raise FileNotFoundError(f"chat template file not found: {value}")


def message_text(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of text parts) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = part.get("type")
        if part_type != "text":
            raise ChatTemplateError(f"content part type {part_type!r} is not supported")
        texts.append(part.get("text") or "")
    return "".join(texts)


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plain `{"role", "content", ...}` dicts; "developer" is a system message."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if v is not None}
        item["role"] = "system" if message["role"] == "developer" else message["role"]
        item["content"] = message_text(message.get("content"))
        out.append(item)
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template: str | None = None,
    *,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    extra_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for `messages` (opening the assistant turn unless continuing)."""
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("the model has no chat template; start with --chat-template FILE")
    kwargs: dict[str, Any] = dict(extra_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(
        normalize_messages(messages),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=not continue_final_message,
        continue_final_message=continue_final_message,
        **kwargs,
    )
