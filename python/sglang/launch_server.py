"""`python -m sglang.launch_server --model-path DIR [--port 30000] ...`"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    return launch_server(server_args)


if __name__ == "__main__":
    sys.exit(main())
