"""No flag pretends: every field is read by the runtime, refused, or a declared no-op.

A field nothing outside the config layer reads must say so where it is declared
(`arg(..., unsupported="<issue>")` or `noop_on={"<device>": "<why>"}`). Refused
values fail when the record is built (ValueError naming the field) and on the
command line (exit 2 naming the flag); a no-op logs a warning at resolution.
`--help` and docs/config.md carry the same note for each such flag.

The reader scan is static and deliberately coarse: an attribute load `x.<field>`
or `getattr(x, "<field>")` anywhere in python/sglang outside the config layer (and
the package's test helpers) counts as a reader, so a field whose name is common
(`device`, `dtype`) always passes; the guard catches the specific names that
features are made of, which is where flags used to pretend.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest

from sglang.srt.arg_groups.arg_utils import arg, is_refused_value
from sglang.srt.server_args import (
    ServerArgs,
    build_parser,
    flag_support_notes,
    prepare_server_args,
    resolution_result,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "sglang"
DOCS = REPO / "docs" / "config.md"

# Not readers: the config layer itself, and test helpers shipped in the package.
NOT_READERS = ("srt/server_args.py", "srt/runtime_context.py", "srt/arg_groups/", "test/")

FIELDS = {f.name: f for f in dataclasses.fields(ServerArgs)}
HINTS = typing.get_type_hints(ServerArgs)


def is_reader_module(rel: str) -> bool:
    return not any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in NOT_READERS)


# Calls that read a field named by a string: function name -> argument index.
NAMED_READS = {"getattr": 1, "resolution_result": 1, "config_leaf": 0, "config_value": 0}


def names_read(source: str) -> set[str]:
    """Attribute names loaded (`x.name`) or read by name (`getattr(x, "name")`,
    `resolution_result(sa, "name")`, `config_leaf("name")`, a TokenizerManager's
    `config_value("name")`) in a module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            found.add(node.attr)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            index = NAMED_READS.get(name)
            if index is not None and len(node.args) > index:
                arg_node = node.args[index]
                if isinstance(arg_node, ast.Constant) and isinstance(arg_node.value, str):
                    found.add(arg_node.value)
    return found


@functools.cache
def package_reads() -> frozenset[str]:
    reads: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if is_reader_module(rel):
            reads |= names_read(path.read_text(encoding="utf-8"))
    return frozenset(reads)


def is_declared(f: dataclasses.Field) -> bool:
    return f.metadata.get("unsupported") is not None or bool(f.metadata.get("noop_on"))


def pretending_fields(fields: list[dataclasses.Field], reads: set[str]) -> list[str]:
    """Fields nothing reads that declare neither a refusal nor a no-op."""
    return sorted(f.name for f in fields if f.name not in reads and not is_declared(f))


def stale_refusals(fields: list[dataclasses.Field], reads: set[str]) -> list[str]:
    """Fields refused outright that something reads: the feature landed, lift the refusal."""
    return sorted(
        f.name
        for f in fields
        if f.metadata.get("unsupported") is not None
        and f.metadata.get("unsupported_values") is None
        and not f.metadata.get("noop_on")
        and f.name in reads
    )


# ---- the guard, pinned at zero -----------------------------------------------------


def test_every_field_is_read_or_refused_or_a_declared_noop():
    assert pretending_fields(list(FIELDS.values()), set(package_reads())) == []


def test_no_refused_field_is_read():
    assert stale_refusals(list(FIELDS.values()), set(package_reads())) == []


def test_guard_catches_a_planted_pretending_field():
    @dataclasses.dataclass(kw_only=True)
    class Planted:
        planted_read: int = arg(0, "read through a bag")
        planted_getattr: int = arg(0, "read through getattr")
        planted_resolved: int = arg(0, "read from the resolution result")
        planted_ignored: bool = arg(False, "parsed, resolved, never read")
        planted_refused: bool = arg(False, "not built yet", unsupported="planting")
        planted_noop: bool = arg(False, "meaningless here", noop_on={"cpu": "planted"})
        planted_stale: bool = arg(False, "built but still refused", unsupported="planting")

    code = textwrap.dedent(
        """
        def f(bag):
            a = get_exec().planted_read
            b = getattr(bag, "planted_getattr", None)
            d = resolution_result(server_args, "planted_resolved")
            c = bag.planted_stale
            bag.planted_ignored = True  # a store is not a read
            return a, b, c, d
        """
    )
    reads = names_read(code)
    fields = dataclasses.fields(Planted)
    assert pretending_fields(list(fields), reads) == ["planted_ignored"]
    assert stale_refusals(list(fields), reads) == ["planted_stale"]


def test_reader_scan_skips_the_config_layer():
    assert not is_reader_module("srt/arg_groups/parallel.py")
    assert not is_reader_module("srt/server_args.py")
    assert not is_reader_module("test/runner_utils.py")
    assert is_reader_module("srt/managers/scheduler.py")


# ---- refusals: ServerArgs(...), Engine(...), the CLI --------------------------------


def refused_value(f: dataclasses.Field) -> Any:
    """A value the field's declaration refuses."""
    meta = f.metadata
    if meta.get("unsupported_values"):
        return meta["unsupported_values"][0]
    if f.default is False:
        return True
    if meta.get("choices"):
        return next(c for c in meta["choices"] if c != f.default)
    if meta.get("nargs"):
        return ["x"]
    if isinstance(f.default, int):
        return f.default + 1
    return 2 if int in typing.get_args(HINTS[f.name]) else "x"  # int | None, str | None


def refused_cases() -> list[tuple[str, Any, dict[str, Any]]]:
    """(field, refused value, fields that make it refused, e.g. the device)."""
    cases = []
    for f in FIELDS.values():
        if f.metadata.get("unsupported") is None:
            continue
        noop = f.metadata.get("noop_on") or {}
        context = {"device": next(d for d in ("cuda", "cpu") if d not in noop)} if noop else {}
        cases.append((f.name, refused_value(f), context))
    return cases


CASES = refused_cases()


def argv_for(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if isinstance(value, list):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def test_the_refusals_the_issue_names_are_declared():
    refused = {name for name, _, _ in CASES}
    named = {
        "enable_lora", "lora_paths", "max_loras_per_batch", "disaggregation_mode",
        "enable_multimodal", "enable_torch_compile", "sampling_backend",
        "enable_dp_attention", "tokenizer_mode", "show_time_cost",
        "speculative_algorithm", "grammar_backend", "pp_size",
    }  # fmt: skip
    assert named <= refused, sorted(named - refused)


@pytest.mark.parametrize("name, value, context", CASES, ids=[c[0] for c in CASES])
def test_server_args_keyword_refused_naming_the_field(name, value, context):
    assert is_refused_value(FIELDS[name], value)
    with pytest.raises(ValueError, match=rf"\({name}=.*not supported yet \(issue: "):
        ServerArgs(model_path="org/model", **context, **{name: value})


@pytest.mark.parametrize("name, value, context", CASES, ids=[c[0] for c in CASES])
def test_cli_exits_2_naming_the_flag(name, value, context, capsys):
    argv = [*argv_for("device", context["device"])] if context else []
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(argv + argv_for(name, value))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    flag = "--" + name.replace("_", "-")
    assert f"error: {flag}" in err and "is not supported yet (issue: " in err


def test_launcher_exits_2_for_pp_size():
    code = "from sglang.launch_server import main; main(['--pp-size', '2'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--pp-size 2 (pp_size=2) is not supported yet (issue: pipeline parallelism)" in (
        proc.stderr
    )


def test_dp_size_and_its_balance_method_parse(capsys):
    """Data parallelism is served (test/srt/test_dp.py); a method it lacks exits 2."""
    sa = prepare_server_args(["--dp-size", "2", "--load-balance-method", "prefix_aware"])
    assert (sa.dp_size, sa.load_balance_method) == (2, "prefix_aware")
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--dp-size", "2", "--load-balance-method", "minimum_tokens"])
    assert exc.value.code == 2 and "--load-balance-method" in capsys.readouterr().err


def test_engine_keyword_refused_before_anything_starts():
    from sglang.srt.entrypoints.engine import Engine

    with pytest.raises(ValueError, match=r"--enable-lora \(enable_lora=True\).*LoRA adapters"):
        Engine(model_path="org/model", enable_lora=True)


def test_defaults_and_accepted_values_are_fine():
    sa = ServerArgs(
        model_path="org/model",
        device="cpu",
        sampling_backend="pytorch",
        grammar_backend="none",
        kv_cache_dtype="bfloat16",
        tokenizer_mode="auto",
        dp_size=1,
    ).resolve_once()
    assert resolution_result(sa, "grammar_backend") == "none"


def test_a_record_changed_before_resolution_is_refused_at_resolution():
    sa = ServerArgs(model_path="org/model", device="cpu")
    sa.pp_size = 2
    with pytest.raises(ValueError, match=r"pp_size=2.*pipeline parallelism"):
        sa.resolve_once()
    assert not sa.is_resolved


# ---- no-ops: accepted with a warning -----------------------------------------------


def test_cuda_graph_flags_are_noops_on_cpu_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="sglang.srt.arg_groups.validation")
    sa = ServerArgs(
        model_path="org/model", device="cpu", disable_cuda_graph=True, cuda_graph_max_bs=8
    )
    sa.resolve_once()
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("--disable-cuda-graph has no effect on cpu") for m in messages)
    assert any(m.startswith("--cuda-graph-max-bs has no effect on cpu") for m in messages)


def test_flags_the_rest_of_the_config_leaves_unread_warn(caplog, tmp_path):
    # --revision only picks a hub revision; --load-balance-method only routes DP ranks
    caplog.set_level(logging.WARNING, logger="sglang.srt.arg_groups.validation")
    (tmp_path / "config.json").write_text("{}")
    ServerArgs(model_path=str(tmp_path), device="cpu", revision="v2",
               load_balance_method="shortest_queue").resolve_once()  # fmt: skip
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("--revision has no effect here") for m in messages), messages
    assert any(m.startswith("--load-balance-method has no effect here") for m in messages)
    caplog.clear()
    ServerArgs(model_path="org/model", device="cpu", revision="v2").resolve_once()  # a hub id
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tokenizer_path": "."}, "--tokenizer-path has no effect here"),
        ({"grammar_backend": "none", "constrained_json_disable_any_whitespace": True},
         "--constrained-json-disable-any-whitespace has no effect here"),
        ({"max_total_tokens": 4096, "mem_fraction_static": 0.5},
         "--mem-fraction-static has no effect here"),
        ({"is_embedding": True, "reasoning_parser": "qwen3"}, "--reasoning-parser has no effect"),
        ({"is_embedding": True, "tool_call_parser": "qwen25"}, "--tool-call-parser has no effect"),
        ({"is_embedding": True, "stream_interval": 4}, "--stream-interval has no effect here"),
        ({"is_embedding": True, "sampling_defaults": "openai"},
         "--sampling-defaults has no effect here"),
        ({"is_embedding": True, "constrained_json_disable_any_whitespace": True},
         "--constrained-json-disable-any-whitespace has no effect here: an embedding"),
        ({"log_requests": True, "log_level": "warning"},
         "--log-requests has no effect here: its lines are logged at info"),
        ({"skip_tokenizer_init": True, "reasoning_parser": "qwen3"},
         "--reasoning-parser has no effect here: skip_tokenizer_init"),
        ({"skip_tokenizer_init": True, "tool_call_parser": "qwen25"},
         "--tool-call-parser has no effect here: skip_tokenizer_init"),
    ],
)  # fmt: skip
def test_more_flags_the_config_leaves_unread_warn(caplog, fields, message):
    caplog.set_level(logging.WARNING, logger="sglang.srt.arg_groups.validation")
    extra = {"skip_tokenizer_init": True} if "tokenizer_path" in fields else {}
    ServerArgs(model_path="org/model", device="cpu", **fields, **extra).resolve_once()
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith(message) for m in messages), messages


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"random_seed": 1 << 64}, "random_seed"),  # torch.manual_seed overflowed in the child
        ({"num_threads": 100_000}, "num_threads"),  # OpenMP segfaulted the scheduler
        ({"max_total_tokens": 5}, "max_total_tokens"),
        ({"max_total_tokens": 8192, "page_size": 16384}, "max_total_tokens"),
        ({"api_key": ""}, "api_key"),  # served without authentication
        ({"api_key": "sk-pad "}, "api_key"),  # no client could ever send it
        ({"api_key": "sk-\u00fc"}, "api_key"),  # only clients sending raw UTF-8 headers
        ({"served_model_name": ""}, "served_model_name"),
        ({"tokenizer_path": ""}, "tokenizer_path"),
        ({"dist_init_addr": "garbage"}, "dist_init_addr"),
        ({"dist_init_addr": "h:notaport"}, "dist_init_addr"),
        ({"page_size": None}, "page_size"),  # None for a field that has no None
        ({"max_prefill_tokens": None}, "max_prefill_tokens"),
        ({"tp_size": None}, "tp_size"),
    ],
)  # fmt: skip
def test_values_that_crashed_a_child_are_refused_naming_the_field(fields, says):
    with pytest.raises(ValueError, match=f"^{says}="):
        ServerArgs(model_path="org/model", device="cpu", **fields).resolve_once()


def test_a_draft_directory_without_config_json_is_refused(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "draft").mkdir()
    sa = ServerArgs(model_path=str(tmp_path / "target"), device="cpu",
                    speculative_algorithm="STANDALONE",
                    speculative_draft_model_path=str(tmp_path / "draft"))  # fmt: skip
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        sa.resolve_once()


def test_cuda_on_a_machine_without_one_is_refused_before_any_child_starts():
    from sglang.srt.entrypoints.engine import _check_device_present

    with pytest.raises(ValueError, match="device='cuda' is not accepted here"):
        _check_device_present("cuda")
    _check_device_present("cpu")


def test_a_hub_id_that_cannot_be_fetched_exits_2_naming_the_field():
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "my-model-dir-typo",
         "--port", "1"], capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: model_path='my-model-dir-typo': cannot load its tokenizer" in proc.stderr


def test_an_engine_warns_of_http_server_settings(caplog):
    from sglang.srt.entrypoints.engine import _warn_http_only_fields

    caplog.set_level(logging.WARNING, logger="sglang.srt.entrypoints.engine")
    _warn_http_only_fields(ServerArgs(model_path="org/model", port=31234, api_key="k",
                                      served_model_name="mine", tool_call_parser="qwen25",
                                      reasoning_parser="qwen3", chat_template="t.jinja"))  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    # reasoning_parser acts: it names require_reasoning's end token, and chat_template is
    # where a reasoning parser is detected from
    assert [m.split(" ")[0] for m in messages] == [
        "port", "api_key", "served_model_name", "tool_call_parser"
    ]  # fmt: skip
    assert all("has no effect on an Engine" in m for m in messages)


def test_an_engine_given_a_path_instead_of_server_args_says_so():
    from sglang.srt.entrypoints.engine import Engine

    for wrong in ("/models/llama", {"model_path": "/models/llama"}):
        with pytest.raises(TypeError, match=r"server_args must be a ServerArgs.*model_path="):
            Engine(wrong)


def test_no_warning_at_the_default(caplog):
    caplog.set_level(logging.WARNING, logger="sglang.srt.arg_groups.validation")
    ServerArgs(model_path="org/model", device="cpu").resolve_once()
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]


def test_cuda_graph_flags_are_accepted_on_cuda():
    """CUDA graphs are captured on cuda (model_executor/cuda_graph_runner.py)."""
    sa = ServerArgs(
        model_path="org/model", device="cuda", disable_cuda_graph=True, cuda_graph_max_bs=8
    )
    assert (sa.disable_cuda_graph, sa.cuda_graph_max_bs) == (True, 8)
    assert ServerArgs(model_path="org/model", cuda_graph_max_bs=8).cuda_graph_max_bs == 8


# ---- --help and docs/config.md say the same thing ----------------------------------


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def docs_rows() -> dict[str, str]:
    """The `| `--flag` | note |` rows of docs/config.md's refused / no-op table."""
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"\| `(--[a-z0-9-]+)` \| (.+) \|", line.strip())
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_docs_table_matches_the_declarations():
    assert docs_rows() == flag_support_notes()


def test_help_carries_each_note():
    helps = {a.option_strings[0]: a.help for a in build_parser()._actions if a.option_strings}
    for flag, note in flag_support_notes().items():
        assert note in _squash(helps[flag]), flag


def test_a_quoted_tilde_path_is_expanded_for_every_reader(tmp_path, monkeypatch):
    """`--model-path '~/m'` passed the launcher's checks, then the tokenizer loader took
    it for a hub id ("Repo id must use alphanumeric chars")."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.setenv("HOME", str(tmp_path))
    args = ServerArgs(model_path="~/m", tokenizer_path="~/m", device="cpu").resolve_once()
    assert resolution_result(args, "model_path") == str(tmp_path / "m")
    assert resolution_result(args, "tokenizer_path") == str(tmp_path / "m")
    assert args.model_path == "~/m"  # what the operator typed stays as typed
