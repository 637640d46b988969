"""An in-memory stand-in for the scheduler's IPC endpoints (tests and benchmarks that run
a Scheduler in-process)."""

from __future__ import annotations


class FakeQueue:
    """recv / recv_all_nowait / send over a list: what one side sends, the other receives."""

    def __init__(self) -> None:
        self.items: list = []

    def recv(self, timeout_ms=None):
        return self.items.pop(0) if self.items else None

    def recv_all_nowait(self):
        out, self.items = self.items, []
        return out

    def send(self, msg) -> None:
        self.items.append(msg)
