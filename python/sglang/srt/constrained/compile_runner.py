"""Grammar compiles run one at a time, each on a thread of its own, in submit order.

A compile cannot be stopped once it runs (xgrammar works in C++), so one that runs
past its time is *abandoned*: its requests fail, it finishes in the background (and
its result is kept, so a retry of the same constraint is then served at once), and
the next compile starts beside it. Constraints queued behind a slow one are thus
served after at most one timeout each, not failed with it. At most MAX_ABANDONED
abandoned compiles run at once; beyond that the queue waits for one to end (a flood
of hopeless schemas must not take every core).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_ABANDONED = 2


@dataclass(eq=False)
class CompileJob:
    key: Any
    future: Future = field(default_factory=Future)
    started_s: float | None = None  # time.monotonic() when its thread started

    def running_for_s(self, now_s: float) -> float:
        """Seconds since it started (0 while queued)."""
        return 0.0 if self.started_s is None else now_s - self.started_s


class CompileRunner:
    """Called from the scheduler thread; the compile threads only finish their job and
    start the next."""

    def __init__(self, compile_fn: Callable[[Any], Any]) -> None:
        self._compile_fn = compile_fn
        self._lock = threading.Lock()
        self._queue: deque[CompileJob] = deque()
        self._active: CompileJob | None = None
        self._abandoned: list[CompileJob] = []
        self._closed = False

    def submit(self, key: Any) -> CompileJob:
        job = CompileJob(key)
        with self._lock:
            self._queue.append(job)
        self._start_next()
        return job

    def abandon(self, job: CompileJob) -> None:
        """`job` ran past its time: let the next compile start beside it."""
        with self._lock:
            if self._active is job:
                self._active = None
                self._abandoned.append(job)
        self._start_next()

    def cancel(self, job: CompileJob) -> bool:
        """Drop `job` if it has not started (nobody waits for it any more)."""
        with self._lock:
            if job not in self._queue:
                return False
            self._queue.remove(job)
        job.future.cancel()
        return True

    def shutdown(self) -> None:
        """Start nothing more; queued jobs are cancelled (running ones end on their own)."""
        with self._lock:
            self._closed = True
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            job.future.cancel()

    def _start_next(self) -> None:
        with self._lock:
            self._abandoned = [job for job in self._abandoned if not job.future.done()]
            busy = self._active is not None and not self._active.future.done()
            if busy or self._closed or not self._queue or len(self._abandoned) >= MAX_ABANDONED:
                return
            job = self._active = self._queue.popleft()
            job.started_s = time.monotonic()
        threading.Thread(
            target=self._run, args=(job,), name="grammar-compile", daemon=True
        ).start()

    def _run(self, job: CompileJob) -> None:
        try:
            result = self._compile_fn(job.key)
        except BaseException as exc:  # handed to whoever waits for the job
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
        self._start_next()
