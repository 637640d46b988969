"""The scheduler process's entry, in a module the launcher imports without torch.

The launcher names the entry function when it spawns a scheduler, so it imports
the entry's module; `scheduler.py` (torch) is imported in the child only.
"""

from __future__ import annotations

from typing import Any


def scheduler_role(dp_size: int, tp_size: int, dp_rank: int, tp_rank: int) -> str:
    """A scheduler's name in child_pids(), the death message and its log lines' prefix."""
    ranks = ([f"dp rank {dp_rank}"] if dp_size > 1 else []) + (
        [f"tp rank {tp_rank}"] if tp_size > 1 else []
    )
    return f"scheduler ({', '.join(ranks)})" if ranks else "scheduler"


def run_scheduler_process(
    server_args: Any,
    port_args: Any,
    tp_rank: int,
    forward_clock: Any,
    ready_writer: Any,
) -> None:
    """Process entry: publish, build the worker and scheduler, report ready, loop."""
    from sglang.srt.managers.process_entry import run_child
    from sglang.srt.server_args import resolution_result

    def build():
        from sglang.srt.managers.scheduler import build_scheduler

        return build_scheduler(port_args, tp_rank, forward_clock)

    sizes = (int(resolution_result(server_args, name)) for name in ("dp_size", "tp_size"))
    name = scheduler_role(*sizes, port_args.dp_rank, tp_rank)  # each rank's lines told apart
    run_child("scheduler", server_args, ready_writer, build, log_name=name)
