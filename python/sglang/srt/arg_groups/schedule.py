"""The `schedule` namespace: admission, batching and streaming policy."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

SCHEDULE_POLICY_CHOICES = ("fcfs", "lpm", "dfs-weight", "random")
PREFIX_POLICIES = ("lpm", "dfs-weight")  # they order by cached prefixes: need the radix cache
# SGLang's overlap scheduler prepares step N+1 while step N runs; this one never does (on
# two CPU cores the scheduler's 0.04-0.23 ms a step could only run on a core the forward
# uses: benchmark/RESULTS.md), so every schedule already is what the flag asks for.
NEVER_OVERLAPS = "this scheduler never overlaps scheduling with the forward"


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
    enable_mixed_chunk: bool = arg(
        False,
        "Run the decoding requests' next tokens inside each prefill batch (one row each), "
        "so streams keep going while a long prompt is prefilled chunk by chunk; the decode "
        "rows take their share of chunked_prefill_size (at most half of it).",
    )
    max_running_requests: int | None = arg(
        None, "Max requests decoding at once. Default: sized from the KV pool."
    )
    max_queued_requests: int | None = arg(
        None, "Max requests waiting to be scheduled. Default: unbounded."
    )
    disable_overlap_schedule: bool = arg(
        False,
        "Do not overlap the next step's scheduling with the current forward (SGLang's "
        "overlap scheduler). Accepted for SGLang command lines.",
        noop_on={"cpu": NEVER_OVERLAPS, "cuda": NEVER_OVERLAPS},
    )
    stream_interval: int = arg(1, "Emit a streaming chunk every N decoded tokens.")
    schedule_conservativeness: float = arg(
        1.0, "Higher values reserve more KV room for running requests whose output length is "
        "open (fewer retractions); one only max_new_tokens can end is reserved in full.",
    )
