"""The launcher CLI generated from the fields."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

import pytest

from sglang.srt.server_args import (
    ServerArgs,
    build_parser,
    prepare_server_args,
    server_args_namespaces,
    to_cli_args,
)


def test_round_trip_argv_server_args_argv():
    argv = [
        "--model-path", "org/model",
        "--tp-size", "2",
        "--enable-metrics",
        "--mem-fraction-static", "0.5",
        "--attention-backend", "torch_native",
        "--sampling-backend", "pytorch",
        "--grammar-backend", "none",
        "--watchdog-timeout", "12.5",
    ]  # fmt: skip
    sa = prepare_server_args(argv)
    assert sa.tp_size == 2 and sa.enable_metrics and sa.grammar_backend == "none"
    assert not sa.is_resolved
    again = prepare_server_args(to_cli_args(sa))
    assert again == sa
    assert sorted(to_cli_args(again)) == sorted(argv)


def test_defaults_match_the_dataclass():
    assert prepare_server_args([]) == ServerArgs()


def test_every_field_has_a_flag_with_help():
    parser = build_parser()
    flags = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(ServerArgs):
        assert f.name in flags, f.name
        assert flags[f.name].help, f.name


def test_flags_grouped_by_namespace():
    parser = build_parser()
    titles = {g.title for g in parser._action_groups}
    for path in set(server_args_namespaces().values()):
        assert f"{path} options" in titles


@pytest.mark.parametrize(
    "argv",
    [["--no-such-flag"], ["--tp-size", "two"], ["--schedule-policy", "lifo"], ["--tp-size", "0"]],
)
def test_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_exits_0_and_lists_groups():
    code = "from sglang.srt.server_args import prepare_server_args; prepare_server_args(['--help'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "parallel options" in proc.stdout and "--tp-size" in proc.stdout
    assert "exec.kernel options" in proc.stdout
    assert "option_strings" not in proc.stdout  # a help with "%" printed argparse's dict
    assert "loses 10-17% at 64" in " ".join(proc.stdout.split())


def _free_port() -> int:
    """A port nothing listens on now: a fixed one may be taken on a shared machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--context-length", "100000"], "context_length"),  # the demo model's is 512
        (["--model-path", "{empty}"], "model_path"),  # a directory without config.json
        (["--tokenizer-path", "/nonexistent/tok"], "tokenizer_path"),
        # a host that does not resolve: the rendezvous would retry for minutes
        (["--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
          "--dist-init-addr", "nonexistent.invalid:41488"], "dist_init_addr"),  # fmt: skip
    ],
)
def test_flags_refused_at_resolution_exit_2_with_one_line(tmp_path, argv, field):
    """Found while resolving (after parsing), still argparse's exit 2 and one line naming
    the field: no traceback, no child started."""
    argv = [a.replace("{empty}", str(tmp_path)) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--port", str(_free_port()), *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: {field}" in proc.stderr or f"error: {field}=" in proc.stderr


def test_a_port_in_use_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "sglang.launch_server", "--port", str(port)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "KV pool" not in proc.stderr  # no child started, no model loaded


def test_log_level_holds_from_the_start():
    """Resolution logs (the demo model's path, the KV pool) follow --log-level too."""
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--port", str(_free_port()),
         "--log-level", "error", "--context-length", "100000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "error: context_length" in proc.stderr
    assert " INFO " not in proc.stderr, proc.stderr
