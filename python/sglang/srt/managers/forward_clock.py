"""When the scheduler's current forward started, shared with the launcher's process.

One float in shared memory, written by the scheduler (rank 0) and read by the
TokenizerManager: `/health` counts a scheduler that is inside a forward as
answering (its own watchdog ends a forward that runs past `--watchdog-timeout`),
so a long prefill does not make a healthy server report 503. CLOCK_MONOTONIC is
one clock for every process of the machine, so the two sides can compare.
"""

from __future__ import annotations

import time
from typing import Any

_IDLE = 0.0


class ForwardClock:
    def __init__(self, shared: Any = None) -> None:
        # A multiprocessing Value('d') from the launcher, or a plain holder (tests).
        self._shared = shared if shared is not None else _Holder()

    @classmethod
    def shared(cls, mp_context: Any) -> ForwardClock:
        return cls(mp_context.Value("d", _IDLE, lock=False))

    def start(self) -> None:
        self._shared.value = time.monotonic()

    def stop(self) -> None:
        self._shared.value = _IDLE

    def busy_for_s(self) -> float | None:
        """Seconds the current forward has run; None between forwards."""
        started = self._shared.value
        return None if started == _IDLE else time.monotonic() - started


class _Holder:
    value = _IDLE


class ForwardClocks:
    """The clocks of several DP ranks read as one: busy while any rank is in a forward."""

    def __init__(self, clocks: list[ForwardClock]) -> None:
        self.clocks = clocks

    def busy_for_s(self) -> float | None:
        busy = [s for s in (c.busy_for_s() for c in self.clocks) if s is not None]
        return max(busy) if busy else None
