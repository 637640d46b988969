"""The shared shape of every child process entry (scheduler, detokenizer).

publish the config under the role first; build; report ChildReady (or
ChildFailed with the traceback text) over the ready pipe; run the loop.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from sglang.srt.managers.io_struct import ChildFailed, ChildReady
from sglang.srt.utils import (
    configure_child_logging,
    format_exception_text,
    freeze_startup_heap,
    start_parent_watcher,
)

logger = logging.getLogger(__name__)

# build() returns (info for ChildReady, the event loop to run forever).
BuildFn = Callable[[], tuple[dict[str, Any], Callable[[], None]]]


def run_child(
    role: str, server_args: Any, ready_writer: Any, build: BuildFn, log_name: str | None = None
) -> None:
    """Publish under `role`, build, report ready, loop; log lines carry `log_name` (the
    role, or a scheduler's ranks too)."""
    from sglang.srt.runtime_context import publish

    # Ctrl-C in a terminal reaches the whole process group: the launcher (or the
    # Engine's owner) handles it and stops the children, which must not unwind on their
    # own with a KeyboardInterrupt traceback first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    publish(server_args, role=role)
    # No PR_SET_PDEATHSIG: it fires when the spawning *thread* exits, and an
    # Engine may be built on a short-lived thread. Polling the parent pid is safe.
    start_parent_watcher()
    _configure_logging(log_name or role)
    try:
        info, loop = build()
    except BaseException:
        text = format_exception_text()
        logger.error("%s failed to start:\n%s", role, text)
        _send_quietly(ready_writer, ChildFailed(role=role, pid=os.getpid(), traceback_text=text))
        os._exit(1)
    ready_writer.send(ChildReady(role=role, pid=os.getpid(), info=info))
    ready_writer.close()
    freeze_startup_heap(role)
    try:
        loop()
    except BaseException:
        logger.error("%s crashed:\n%s", role, format_exception_text())
        os._exit(1)


def _configure_logging(role: str) -> None:
    from sglang.srt.runtime_context import get_observability

    configure_child_logging(get_observability().log_level, prefix=f" {role}")


def _send_quietly(writer: Any, msg: Any) -> None:
    try:
        writer.send(msg)
        writer.close()
    except OSError:
        pass
