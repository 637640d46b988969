"""Chat templates: load an override (`--chat-template FILE`), render messages, and
detect the model's tool-call and reasoning parsers from its template.

The tokenizer's own template is the default. Rendering goes through the
tokenizer's `apply_chat_template` with `tokenize=False`; the caller tokenizes the
rendered text with `add_special_tokens=False`, since the template already writes
any special tokens the model expects.

Detection (`resolve_auto_parsers`) is a launcher-stage decision: it runs after
resolution and before the schedulers fork, and returns the config to launch with
(a derived variant; the caller's ServerArgs is never written). The launcher hands
`detected_parsers(...)` of that config to its TokenizerManager, which records it as
per-engine state: several Engines in one process each keep their own.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.meta

from sglang.srt.parser.detection import detect_parsers
from sglang.srt.parser.function_call.text_utils import has_lone_surrogate

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

DETECT_SOURCE = "chat_template_detect"
PARSER_FIELDS = ("tool_call_parser", "reasoning_parser")
# where tokenizer.save_pretrained() writes the templates: the default one, and the others
# (a dict of templates) as NAME.jinja in the folder
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
SHIPPED_HINT = "; chat requests will fail: start with --chat-template FILE to serve chat"


# apply_chat_template's own arguments (and render_jinja_template's, which it calls) and the
# names it renders with: chat_template_kwargs may not set them (the request's own fields
# do). `documents` is the exception: no request field sets it, and a RAG template reads it.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "conversations", "messages", "tools", "chat_template", "tokenize",
    "add_generation_prompt", "continue_final_message", "sanitize_control_tokens", "padding",
    "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs",
})  # fmt: skip


class ChatTemplateError(ValueError):
    """The request's messages cannot be rendered (no template, bad content); `param` is
    the request field to blame, `code` the error body's code."""

    def __init__(self, message: str, param: str = "messages", code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def load_chat_template(value: str | None) -> str | None:
    """`value` (--chat-template) is a Jinja file path or an inline template; None keeps
    the tokenizer's. Checked as `check_chat_template` does: a ValueError names the flag."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        source = f"--chat-template {value!r}"
        return check_chat_template(path.read_text(encoding="utf-8"), source)
    if "{%" in value or "{{" in value:
        return check_chat_template(value, "--chat-template (inline Jinja)")
    raise FileNotFoundError(f"--chat-template {value!r}: no such file, and not inline Jinja")


def check_chat_template(template: str, source: str, hint: str = "") -> str:
    """`template`, refused (a ValueError naming `source`, then `hint`) where it cannot serve
    chat: it does not compile in the renderer's Jinja environment, or it never reads
    `messages` (every prompt would be the same text, the conversation dropped)."""
    try:
        variables = template_variables(template)
    except jinja2.TemplateError as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise ValueError(
            f"{source}: the chat template does not compile: {exc}{where}{hint}"
        ) from None
    if "messages" not in variables:
        raise ValueError(
            f"{source}: not a chat template: it never reads `messages`, so every prompt would "
            f"be the same text (a chat template is Jinja that renders `messages`){hint}"
        )
    return template


def template_variables(template: str) -> frozenset[str]:
    """The names `template` reads from its context; raises jinja2.TemplateError where it
    does not compile."""
    # transformers' own compiler: its sandbox, extensions ({% generation %}, loop controls)
    # and filters are what apply_chat_template renders with. Imported here, as elsewhere in
    # this server: transformers is slow to import.
    from transformers.utils.chat_template_utils import _compile_jinja_template

    environment = _compile_jinja_template(template).environment
    return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(template)))


def message_text(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of text parts) to text: the
    parts joined by a space, as SGLang does for a template that reads content as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(part["text"] for part in text_parts(content))


def text_parts(content: list[Any]) -> list[dict[str, str]]:
    """The `{"type": "text", "text"}` parts of a content list (checked: text only)."""
    texts = []
    for part in content:
        part_type = part.get("type")
        if part_type != "text":
            raise ChatTemplateError(
                f"content part type {part_type!r} is not supported", code="unsupported"
            )
        text = part.get("text")
        if not isinstance(text, str):  # as OpenAI refuses it
            raise ChatTemplateError("a content part of type 'text' needs a string `text`")
        texts.append({"type": "text", "text": text})
    return texts


def normalize_messages(
    messages: list[dict[str, Any]], content_as_parts: bool = False
) -> list[dict[str, Any]]:
    """Plain `{"role", "content", ...}` dicts; "developer" is a system message; an
    assistant's earlier tool calls carry their arguments as a dict, as templates expect.
    A list of content parts stays a list for a template that loops over it
    (`content_as_parts`), else becomes text."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if v is not None}
        item["role"] = "system" if message["role"] == "developer" else message["role"]
        content = message.get("content")
        if content_as_parts and isinstance(content, list):
            item["content"] = text_parts(content)
        else:
            item["content"] = message_text(content)
        if item.get("tool_calls"):
            item["tool_calls"] = [_call_for_template(call) for call in item["tool_calls"]]
        out.append(item)
    return out


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    """Arguments that are a JSON object's text become the object (kept as text otherwise,
    as SGLang does). Text escaping a lone surrogate (`\\ud83d`, as this server's own calls
    keep one) stays text: the object would hold the raw half, which no tokenizer encodes."""
    function = dict(call.get("function") or {})
    try:
        arguments = json.loads(function.get("arguments") or "")
    except (ValueError, TypeError, RecursionError):  # not JSON, huge ints, nested too deep
        return call
    raw_half = has_lone_surrogate(json.dumps(arguments, ensure_ascii=False))
    if isinstance(arguments, dict) and not raw_half:
        function["arguments"] = arguments
    return {**call, "function": function}


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template: str | None = None,
    *,
    continue_final_message: bool = False,
    add_generation_prompt: bool | None = None,
    tools: list[dict[str, Any]] | None = None,
    extra_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for `messages`, opening the assistant turn when
    add_generation_prompt (default: unless continuing the last message)."""
    if add_generation_prompt is None:
        add_generation_prompt = not continue_final_message
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("the model has no chat template; start with --chat-template FILE")
    kwargs: dict[str, Any] = dict(extra_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ChatTemplateError(
            f"chat_template_kwargs may not set {', '.join(reserved)} (the request's own "
            "fields do: messages, tools, continue_final_message, add_generation_prompt)",
            param="chat_template_kwargs",
        )
    if tools:
        kwargs["tools"] = tools
    try:
        as_parts = loops_over_content(template or tokenizer.chat_template, bool(tools))
        return tokenizer.apply_chat_template(
            normalize_messages(messages, content_as_parts=as_parts),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **kwargs,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, RecursionError) as exc:
        # the template (or transformers around it) refused these messages, tools or
        # kwargs: e.g. raise_exception("roles must alternate"), documents not a list
        raise ChatTemplateError(f"the chat template cannot render this request: {exc}") from None


def loops_over_content(template: str | dict[str, str] | None, with_tools: bool = False) -> bool:
    """Whether the template iterates over a message's content (`{% for part in
    message['content'] %}`): it then takes the parts as a list, as SGLang and vLLM
    detect from the template's syntax tree. Named templates: the one
    apply_chat_template picks (`tool_use` for a request with tools, if there is one)."""
    if isinstance(template, dict):
        named = template
        template = (with_tools and named.get("tool_use")) or named.get("default")
        template = template or next(iter(named.values()), None)
    return isinstance(template, str) and _loops_over_content(template)


@functools.lru_cache(maxsize=8)
def _loops_over_content(template: str) -> bool:
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateError:  # rendering will report it
        return False
    return any(_reads_content(loop.iter) for loop in tree.find_all(jinja2.nodes.For))


def _reads_content(node: Any) -> bool:
    while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None:
        node = node.node  # `message['content'] | selectattr(...)`
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == "content"
    return (
        isinstance(node, jinja2.nodes.Getitem)
        and isinstance(node.arg, jinja2.nodes.Const)
        and node.arg.value == "content"
    )


# --- parser detection (launcher stage) ------------------------------------------------------


def model_chat_templates(server_args: ServerArgs) -> dict[str, str]:
    """The templates the chat route will render with, by name, each checked as
    `check_chat_template` does: `--chat-template` (as "default"), else the tokenizer's
    ("default", and "tool_use" for requests with tools where the model names one, as
    Hermes-2-Pro does)."""
    from sglang.srt.server_args import resolution_result

    override = load_chat_template(resolution_result(server_args, "chat_template"))
    if override is not None:
        return {"default": override}
    if resolution_result(server_args, "skip_tokenizer_init"):
        return {}
    path = resolution_result(server_args, "tokenizer_path") or resolution_result(
        server_args, "model_path"
    )
    if Path(path).is_dir():
        return _local_chat_template(Path(path))
    from transformers import AutoTokenizer

    field = "tokenizer_path" if server_args.tokenizer_path else "model_path"  # as typed
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path,
            trust_remote_code=resolution_result(server_args, "trust_remote_code"),
            revision=resolution_result(server_args, "revision"),
        )
    except OSError as exc:  # a hub id that cannot be fetched (offline, a typo)
        raise ValueError(f"{field}={path!r}: cannot load its tokenizer: {exc}") from None
    templates = _named_templates(getattr(tokenizer, "chat_template", None))
    source = f"{field}={path!r}: its tokenizer's chat template"
    return _shipped(templates, lambda name: f"{source} {name!r}")


def _local_chat_template(directory: Path) -> dict[str, str]:
    """As transformers loads them: the template files (chat_template.jinja as "default",
    additional_chat_templates/NAME.jinja by name) replace tokenizer_config.json's."""
    files = _template_files(directory)
    if files:
        texts = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
        return _shipped(texts, lambda name: str(files[name]))
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return {}
    value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    return _shipped(_named_templates(value), lambda name: f"{config} (chat template {name!r})")


def _template_files(directory: Path) -> dict[str, Path]:
    """The template files of a directory, by name, as tokenizer.save_pretrained() writes
    a dict of templates (an additional `default.jinja` replaces chat_template.jinja, as
    transformers reads them)."""
    files = {"default": directory / CHAT_TEMPLATE_FILE}
    for path in sorted((directory / CHAT_TEMPLATE_DIR).glob("*.jinja")):
        files[path.name.removesuffix(".jinja")] = path
    return {name: path for name, path in files.items() if path.is_file()}


def _shipped(templates: dict[str, str], source_of: Callable[[str], str]) -> dict[str, str]:
    """The model's own templates (by name; `source_of(name)` names where one came from)
    that pass `check_chat_template`. A bad one is logged at start-up (every chat request
    with it will be a 400) and left out of parser detection, not refused: the model still
    serves completions and the Engine, as with transformers, which renders without
    checking."""
    usable = {}
    for name, text in templates.items():
        try:
            usable[name] = check_chat_template(text, source_of(name), SHIPPED_HINT)
        except ValueError as exc:
            logger.warning("%s", exc)
    return usable


def _named_templates(value: Any) -> dict[str, str]:
    """A template string (as "default"), or a list of named templates / a dict, by name."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        value = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if not isinstance(value, dict):
        return {}
    return {name: text for name, text in value.items() if isinstance(text, str)}


def _detect_from(templates: dict[str, str]) -> dict[str, str | None]:
    """The parsers each field would take: the tool-call parser from the template a
    request with tools renders with, the reasoning parser from the default one."""
    default = templates.get("default")
    for_tools = templates.get("tool_use") or default
    return dict(zip(PARSER_FIELDS, (detect_parsers(for_tools)[0], detect_parsers(default)[1])))


def resolve_auto_parsers(server_args: ServerArgs) -> ServerArgs:
    """The config to launch with: `server_args` (resolved), or a variant declaring the
    parsers detected from the chat template for the flags the operator left unset.
    Raises ValueError for a chat template that cannot serve chat (check_chat_template)."""
    from sglang.srt.server_args import resolution_result

    if resolution_result(server_args, "is_embedding"):
        return server_args  # an embedding server serves no chat
    # read (and checked) even where no parser flag is left unset: a template that cannot
    # serve chat is refused here, before the schedulers load the model
    templates = model_chat_templates(server_args)
    unset = [name for name in PARSER_FIELDS if resolution_result(server_args, name) is None]
    if not unset:
        return server_args
    detected = _detect_from(templates)
    found = {name: detected[name] for name in unset if detected[name] is not None}
    if not found:
        return server_args
    logger.info("parsers detected from the chat template: %s", found)
    return server_args.derive(DETECT_SOURCE, **found)


def detected_parsers(server_args: ServerArgs) -> dict[str, str]:
    """The parser fields `resolve_auto_parsers` declared on `server_args`."""
    from sglang.srt.server_args import resolution_result, resolution_sources

    return {
        name: resolution_result(server_args, name)
        for name in PARSER_FIELDS
        if DETECT_SOURCE in resolution_sources(server_args, name)
    }
