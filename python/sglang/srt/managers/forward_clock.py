"""When the scheduler's current forward started, and when it last stepped, shared with
the launcher's process.

Two floats in shared memory, written by the scheduler (rank 0) and read by the
launcher's process:
- slot 0, the forward start: `/health` counts a scheduler that is inside a forward as
  answering (its own watchdog ends a forward that runs past `--watchdog-timeout`),
  so a long prefill does not make a healthy server report 503;
- slot 1, the last step: the scheduler stamps it at every loop step (an idle loop
  steps every 50 ms). A scheduler that has not stepped for longer than its own
  watchdog allows is frozen (SIGSTOP, a deadlock holding the GIL): its watchdog
  thread cannot run either, so the launcher's watchdog ends it (hang_check.py).
CLOCK_MONOTONIC is one clock for every process of the machine, so the sides can compare.
"""

from __future__ import annotations

import time
from typing import Any

_IDLE = 0.0  # slot 0 between forwards; slot 1 before the first step
_FORWARD_STARTED, _LAST_STEP = 0, 1
NUM_SLOTS = 2


class ForwardClock:
    def __init__(self, shared: Any = None) -> None:
        # A multiprocessing Array('d', 2) from the launcher, a MappedFloats (Ray
        # actors), or a plain list (tests): indexable floats.
        self._shared = shared if shared is not None else [_IDLE] * NUM_SLOTS

    @classmethod
    def shared(cls, mp_context: Any) -> ForwardClock:
        return cls(mp_context.Array("d", NUM_SLOTS, lock=False))

    def start(self) -> None:
        self._shared[_FORWARD_STARTED] = time.monotonic()

    def stop(self) -> None:
        self._shared[_FORWARD_STARTED] = _IDLE

    def step(self) -> None:
        """The scheduler's loop is alive (called once per step)."""
        self._shared[_LAST_STEP] = time.monotonic()

    def busy_for_s(self) -> float | None:
        """Seconds the current forward has run; None between forwards."""
        started = self._shared[_FORWARD_STARTED]
        return None if started == _IDLE else time.monotonic() - started

    def silent_for_s(self) -> float | None:
        """Seconds since the scheduler last stepped; None before its first step."""
        stepped = self._shared[_LAST_STEP]
        return None if stepped == _IDLE else time.monotonic() - stepped

    def stalled(self, limit_s: float) -> bool:
        """Neither stepped nor inside a forward for over `limit_s` (an idle loop steps
        every 50 ms): frozen or deadlocked."""
        silent_s = self.silent_for_s()
        return silent_s is not None and silent_s > limit_s and self.busy_for_s() is None

    def stalled_ranks(self, limit_s: float) -> list[int]:
        return [0] if self.stalled(limit_s) else []


class ForwardClocks:
    """The clocks of several DP ranks read as one: busy while any rank is in a forward."""

    def __init__(self, clocks: list[ForwardClock]) -> None:
        self.clocks = clocks

    def busy_for_s(self) -> float | None:
        busy = [s for s in (c.busy_for_s() for c in self.clocks) if s is not None]
        return max(busy) if busy else None

    def stalled_ranks(self, limit_s: float) -> list[int]:
        """The DP ranks (in this node's order) stalled past `limit_s`."""
        return [rank for rank, clock in enumerate(self.clocks) if clock.stalled(limit_s)]
