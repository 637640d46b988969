"""`python -m sglang.launch_server --model-path DIR [--port 30000] [--use-ray] ...`"""

from __future__ import annotations

import argparse
import logging
import sys

USE_RAY_HELP = (
    "Run the scheduler ranks as Ray actors in a placement group made for this server "
    "(one bundle per rank, on this node) and removed when it stops. Joins RAY_ADDRESS "
    "or a `ray start` cluster of this machine, else starts a local Ray. Needs the ray "
    'extra: pip install -e ".[ray]".'
)


def build_launch_parser() -> argparse.ArgumentParser:
    """The server's flags plus the launcher's own, which are not server config."""
    from sglang.srt.server_args import build_parser

    parser = build_parser()
    group = parser.add_argument_group("launcher", "How this launcher runs the server.")
    group.add_argument("--use-ray", action="store_true", help=USE_RAY_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sglang.srt.entrypoints.engine import ChildStartupError
    from sglang.srt.server_args import server_args_from_namespace
    from sglang.srt.utils import LOG_DATE_FORMAT, log_format

    parser = build_launch_parser()
    namespace = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(  # --log-level from the start: resolution logs too
        level=(getattr(namespace, "log_level", None) or "info").upper(),
        format=log_format(),
        datefmt=LOG_DATE_FORMAT,
    )
    server_args = server_args_from_namespace(parser, namespace)
    try:
        return _launch(parser, namespace, server_args)
    except (ValueError, FileNotFoundError) as exc:  # the flags' resolution refused them
        parser.error(str(exc))
    except OSError as exc:  # a file the server must read it may not (a chat template)
        logging.getLogger("sglang.launch_server").error("%s", exc)
        return 1
    except ChildStartupError as exc:  # the child printed its traceback; here its last line
        logging.getLogger("sglang.launch_server").error("%s", _summary(exc))
        return 1


def _launch(parser: argparse.ArgumentParser, namespace: argparse.Namespace, server_args) -> int:
    from sglang.srt.entrypoints.http_server import launch_server

    if not namespace.use_ray:
        return launch_server(server_args)
    from sglang.srt.entrypoints.ray_engine import launch_server_on_ray, require_ray

    try:
        require_ray()
    except ImportError as exc:
        parser.error(f"--use-ray: {exc}")
    return launch_server_on_ray(server_args)


def _summary(exc: BaseException) -> str:
    """'The scheduler process failed to start: ValueError: ...' (the traceback's last line)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return str(exc)
    return f"{lines[0].rstrip(':')}: {lines[-1].strip()}"


if __name__ == "__main__":
    sys.exit(main())
