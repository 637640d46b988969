"""Loading chat templates at launch: the model's named template files (as transformers
reads them), `--chat-template` compiled and checked before the model loads, and the
names chat_template_kwargs may not set."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import socket
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

import sglang.launch_server as launch_server
from sglang.srt.entrypoints import engine
from sglang.srt.parser.chat_template import (
    RESERVED_TEMPLATE_KWARGS,
    ChatTemplateError,
    detected_parsers,
    load_chat_template,
    model_chat_templates,
    render_chat,
    resolve_auto_parsers,
)
from sglang.srt.server_args import ServerArgs

DEMO_TARGET = Path(__file__).parents[2] / "python/sglang/demo_models/target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
# the tool_use template of a Hermes-2-Pro-like model: `<tool_call>` markup (qwen25)
TOOL_USE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools> answer in <tool_call></tool_call>"
    "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
)
FROM_CONFIG = "config: {% for m in messages %}{{ m.content }}{% endfor %}"
USER = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def model_dir(tmp_path: Path, config_template=None, files: dict[str, str] | None = None) -> Path:
    """A checkpoint dir with the demo model's tokenizer; `files` are template files by
    path (relative), `config_template` tokenizer_config.json's chat_template."""
    directory = tmp_path / "m"
    directory.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(DEMO_TARGET / name, directory / name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if config_template is not None:
        config["chat_template"] = config_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text((DEMO_TARGET / "config.json").read_text())
    for relative, text in (files or {}).items():
        (directory / relative).parent.mkdir(exist_ok=True)
        (directory / relative).write_text(text)
    return directory


def launch_args(directory: Path, **flags) -> ServerArgs:
    return ServerArgs(model_path=str(directory), device="cpu", **flags).resolve_once()


# --- the model's named template files ------------------------------------------------------------

SAVED_LAYOUTS = {
    # tokenizer.save_pretrained() of a dict of templates
    "saved_dict": {"chat_template.jinja": PLAIN,
                   "additional_chat_templates/tool_use.jinja": TOOL_USE},
    # named files only: tokenizer_config.json's template is replaced all the same
    "named_only": {"additional_chat_templates/tool_use.jinja": TOOL_USE},
    # an additional default.jinja replaces chat_template.jinja, as transformers reads them
    "default_file": {"chat_template.jinja": FROM_CONFIG,
                     "additional_chat_templates/default.jinja": PLAIN,
                     "additional_chat_templates/tool_use.jinja": TOOL_USE},
}  # fmt: skip


@pytest.mark.parametrize("layout", sorted(SAVED_LAYOUTS))
def test_template_files_are_read_as_transformers_reads_them(tmp_path, layout):
    directory = model_dir(tmp_path, FROM_CONFIG, SAVED_LAYOUTS[layout])
    loaded = AutoTokenizer.from_pretrained(directory).chat_template
    assert model_chat_templates(launch_args(directory)) == loaded


def test_tool_use_file_is_where_the_tool_call_parser_is_detected(tmp_path):
    directory = model_dir(tmp_path, files=SAVED_LAYOUTS["saved_dict"])
    assert detected_parsers(resolve_auto_parsers(launch_args(directory))) == {
        "tool_call_parser": "qwen25"
    }


def test_a_request_with_tools_renders_with_the_tool_use_file(tmp_path):
    # the chat route renders with the tokenizer transformers loads: tool_use for tools
    tokenizer = AutoTokenizer.from_pretrained(
        model_dir(tmp_path, files=SAVED_LAYOUTS["saved_dict"])
    )
    assert render_chat(tokenizer, USER, tools=[WEATHER]).startswith("<tools>")
    assert render_chat(tokenizer, USER) == "hi"


# --- --chat-template, checked at launch ----------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def test_a_template_that_does_not_compile_is_refused_naming_the_flag(tmp_path):
    path = write(tmp_path, "bad.jinja", "{% for m in messages %}{{ m.content }{% endfor %}")
    with pytest.raises(ValueError, match=r"--chat-template '.*bad.jinja': .*does not compile: "
                                         r"unexpected '}' \(line 1\)"):  # fmt: skip
        load_chat_template(path)


@pytest.mark.parametrize(
    "text",
    [
        # an SGLang JSON conversation template: no Jinja, every prompt its literal text
        '{"name": "my_model", "roles": ["<|im_start|>user", "<|im_start|>assistant"]}',
        "{{ bos_token }}Answer briefly.",
    ],
)
def test_a_file_that_never_reads_messages_is_refused(tmp_path, text):
    with pytest.raises(ValueError, match=r"--chat-template .*never reads `messages`"):
        load_chat_template(write(tmp_path, "t.json", text))


def test_inline_jinja_is_checked_too():
    with pytest.raises(ValueError, match=r"--chat-template \(inline Jinja\): .*does not compile"):
        load_chat_template("{{ messages[0].content }}{% if %}")
    assert load_chat_template(PLAIN) == PLAIN


def test_the_renderers_own_jinja_extensions_compile(tmp_path):
    # transformers' environment knows {% generation %} and loop controls
    text = (
        "{% for m in messages %}{% if loop.index > 9 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content | tojson(indent=2) }}{% endgeneration %}{% endfor %}"
    )
    assert load_chat_template(write(tmp_path, "ok.jinja", text)) == text


def test_a_bad_override_is_refused_before_launch_even_with_both_parsers_set(tmp_path):
    override = write(tmp_path, "bad.jinja", "{{ messages[0].content }}{% if %}")
    sa = launch_args(model_dir(tmp_path, PLAIN), chat_template=override,
                     tool_call_parser="qwen25", reasoning_parser="qwen3")  # fmt: skip
    with pytest.raises(ValueError, match="--chat-template"):
        resolve_auto_parsers(sa)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_cli_exits_2_naming_the_flag_before_any_child_starts(tmp_path, monkeypatch, capsys):
    def no_children(*args, **kwargs):
        raise AssertionError("the launch went past the template check")

    monkeypatch.setattr(engine.PortArgs, "init_new", no_children)
    override = write(tmp_path, "conv.json", '{"name": "chatml", "sep": "<|im_end|>"}')
    argv = ["--model-path", str(model_dir(tmp_path, PLAIN)), "--device", "cpu",
            "--port", str(free_port()), "--chat-template", override]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        launch_server.main(argv)
    assert exit_info.value.code == 2
    assert "--chat-template" in capsys.readouterr().err


# --- the model's own template ------------------------------------------------------------------


def test_a_shipped_template_that_does_not_compile_is_named_in_a_warning(tmp_path, caplog):
    """The model's own template is the model's: a broken one is logged and left out of
    parser detection; the model still serves (completions, the Engine), as transformers
    loads it without a check."""
    sa = launch_args(model_dir(tmp_path, "{% for m in messages %}{{ m.content }{% endfor %}"))
    assert resolve_auto_parsers(sa) is sa
    assert model_chat_templates(sa) == {}
    assert any(re.search(r"tokenizer_config.json \(chat template 'default'\): .*does not "
                         r"compile.*--chat-template FILE", r.getMessage())
               for r in caplog.records)  # fmt: skip
    files = {"additional_chat_templates/tool_use.jinja": "{% if %}", "chat_template.jinja": PLAIN}
    caplog.clear()
    assert model_chat_templates(launch_args(model_dir(tmp_path / "b", files=files))) == {
        "default": PLAIN
    }
    assert any("additional_chat_templates/tool_use.jinja: " in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_broken_shipped_template_can_be_replaced_or_left_unread(tmp_path):
    directory = model_dir(tmp_path, "{% if %}")
    override = write(tmp_path, "ok.jinja", PLAIN)
    assert resolve_auto_parsers(launch_args(directory, chat_template=override)) is not None
    embedding = launch_args(directory, is_embedding=True)  # serves no chat
    assert resolve_auto_parsers(embedding) is embedding


# --- chat_template_kwargs --------------------------------------------------------------------------


def test_every_apply_chat_template_argument_is_reserved_but_documents():
    # documents: no request field sets it, and a RAG template reads it
    arguments = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    arguments |= set(inspect.signature(render_jinja_template).parameters)
    assert arguments - {"self", "kwargs", "documents"} <= RESERVED_TEMPLATE_KWARGS


@pytest.mark.parametrize("name", ["sanitize_control_tokens", "conversations"])
def test_the_renderers_arguments_are_a_400_naming_chat_template_kwargs(name):
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TARGET)
    with pytest.raises(ChatTemplateError, match=name) as error:
        render_chat(tokenizer, USER, extra_kwargs={name: True})
    assert error.value.param == "chat_template_kwargs"


def test_a_file_the_launcher_cannot_read_is_one_line_not_a_traceback(
    tmp_path, monkeypatch, caplog
):
    # an unreadable chat_template.jinja in the model dir: a 37-line traceback, exit 1
    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "chat_template.jinja"))

    monkeypatch.setattr(launch_server, "_launch", unreadable)
    argv = ["--model-path", str(model_dir(tmp_path, PLAIN)), "--device", "cpu",
            "--port", str(free_port())]  # fmt: skip
    with caplog.at_level("ERROR", logger="sglang.launch_server"):
        assert launch_server.main(argv) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"[Errno 13] Permission denied: '{tmp_path / 'chat_template.jinja'}'"
    ]
