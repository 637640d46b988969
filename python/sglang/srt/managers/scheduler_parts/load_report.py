"""Data parallelism, scheduler side: the first TP rank of each DP rank tells the
DP controller its load after every step in which a figure changed."""

from __future__ import annotations

from typing import Any

from sglang.srt.managers.data_parallel_policy import is_new_request
from sglang.srt.managers.io_struct import LoadReport


class NullLoadReporter:
    """dp_size 1, or a TP rank other than the first: nothing to report."""

    def note_received(self, msgs: list[Any]) -> None:
        pass

    def maybe_report(self, scheduler: Any) -> None:
        pass


class LoadReporter(NullLoadReporter):
    def __init__(self, endpoint: Any, dp_rank: int) -> None:
        self.endpoint = endpoint
        self.dp_rank = dp_rank
        self.num_received_reqs = 0
        self._last_sent: LoadReport | None = None

    def note_received(self, msgs: list[Any]) -> None:
        self.num_received_reqs += sum(map(is_new_request, msgs))

    def maybe_report(self, scheduler: Any) -> None:
        report = LoadReport(
            dp_rank=self.dp_rank,
            num_running_reqs=len(scheduler.running) + (scheduler.chunked_req is not None),
            num_queued_reqs=len(scheduler.waiting_queue) + scheduler.num_grammar_waiting(),
            num_free_kv_tokens=scheduler.allocator.available_size(),
            max_total_num_tokens=scheduler.max_total_num_tokens,
            num_received_reqs=self.num_received_reqs,
        )
        if report != self._last_sent:
            self.endpoint.send(report)
            self._last_sent = report
