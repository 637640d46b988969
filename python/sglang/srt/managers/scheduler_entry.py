"""The scheduler process's entry, in a module the launcher imports without torch.

The launcher names the entry function when it spawns a scheduler, so it imports
the entry's module; `scheduler.py` (torch) is imported in the child only.
"""

from __future__ import annotations

from typing import Any


def run_scheduler_process(
    server_args: Any,
    port_args: Any,
    tp_rank: int,
    forward_clock: Any,
    ready_writer: Any,
) -> None:
    """Process entry: publish, build the worker and scheduler, report ready, loop."""
    from sglang.srt.managers.process_entry import run_child

    def build():
        from sglang.srt.managers.scheduler import build_scheduler

        return build_scheduler(port_args, tp_rank, forward_clock)

    run_child("scheduler", server_args, ready_writer, build)
