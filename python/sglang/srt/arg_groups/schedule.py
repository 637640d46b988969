"""The `schedule` namespace: admission, batching and streaming policy."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

SCHEDULE_POLICY_CHOICES = ("fcfs", "lpm", "dfs-weight", "random")


@dataclass(kw_only=True)
class ScheduleArgs:
    _NS_PATH = "schedule"

    schedule_policy: str = arg(
        "fcfs", "Order in which waiting requests are admitted.", choices=SCHEDULE_POLICY_CHOICES
    )
    chunked_prefill_size: int | None = arg(
        None, "Max prefill tokens per chunk. Default: 2048 on cpu, 8192 on cuda; -1 disables."
    )
    max_prefill_tokens: int = arg(16384, "Max tokens in one prefill batch.")
    max_running_requests: int | None = arg(
        None, "Max requests decoding at once. Default: sized from the KV pool."
    )
    max_queued_requests: int | None = arg(
        None, "Max requests waiting to be scheduled. Default: unbounded."
    )
    stream_interval: int = arg(1, "Emit a streaming chunk every N decoded tokens.")
    schedule_conservativeness: float = arg(
        1.0, "Higher values reserve more KV room for running requests whose output length is "
        "open (fewer retractions); one only max_new_tokens can end is reserved in full.",
    )
