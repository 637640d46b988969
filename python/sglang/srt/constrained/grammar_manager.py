"""Compiling constraints off the decode loop, and the per-step token mask.

The scheduler hands a new constrained request to `GrammarManager.submit`; the
compiles run one at a time off the scheduler thread (`compile_runner`; xgrammar
releases the GIL while it works), results are kept in an LRU cache keyed by the
constraint, and the request waits in the manager's queue until `pop_ready` hands
it back with its matcher, or with its error. A request's timeout counts from the
start of its constraint's compile, so a constraint queued behind a slow one waits
for it (at most one timeout) instead of failing with it. Unconstrained requests
never pass through here.

The backend itself is built by the first compile, on the worker thread: a server
that never sees a constraint never imports xgrammar (about 30 MiB of RSS per
scheduler), and the first constrained request waits for the tokenizer's
vocabulary to be read once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sglang.srt.constrained.backends import GrammarBackendUnavailable
from sglang.srt.constrained.base import GrammarBackend, GrammarKey, InvalidGrammarError
from sglang.srt.constrained.compile_runner import CompileJob, CompileRunner

logger = logging.getLogger(__name__)

CACHE_CAPACITY = 256  # compiled constraints kept (LRU)


@dataclass
class GrammarMask:
    """One step's token mask for the constrained rows of a batch."""

    backend: GrammarBackend
    bitmask: torch.Tensor  # int32 [bs, words]; rows not in `rows` are unused
    rows: list[int]  # batch rows that carry a grammar

    def apply(self, logits: torch.Tensor) -> None:
        self.backend.apply_bitmask(logits, self.bitmask, self.rows)


@dataclass
class _Pending:
    req: Any
    key: GrammarKey
    job: CompileJob


class GrammarManager:
    def __init__(
        self,
        make_backend: Callable[[], GrammarBackend],
        timeout_s: float,
        blocking: bool = False,
    ):
        """`make_backend` builds the backend (raising GrammarBackendUnavailable); it runs
        once, normally on the compile thread. `blocking`: wait for each compile in submit order (TP
        ranks must admit the same requests at the same step, so they cannot race their
        compiles)."""
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._build_lock = threading.Lock()
        # Set (on the compile thread) when the backend could not be built; every
        # compile after it fails with this error.
        self.backend_error: GrammarBackendUnavailable | None = None
        self.timeout_s = timeout_s
        self.blocking = blocking
        self._runner = CompileRunner(self._compile)
        # A failed compile leaves; one still running (even abandoned) stays, so a
        # retry of the same constraint joins it instead of compiling it again.
        self._cache: OrderedDict[GrammarKey, CompileJob] = OrderedDict()
        self.queue: list[_Pending] = []
        self.num_compiles = 0
        self.compile_time_s = 0.0

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def backend(self) -> GrammarBackend:
        """The backend (built already once any grammar has compiled)."""
        return self._built_backend()

    # ------------------------------------------------------------------ compile

    def submit(self, req: Any, key: GrammarKey) -> None:
        self.queue.append(_Pending(req, key, self._compiled(key)))

    def _compiled(self, key: GrammarKey) -> CompileJob:
        job = self._cache.get(key)
        if job is not None:
            self._cache.move_to_end(key)
            return job
        job = self._cache[key] = self._runner.submit(key)
        if len(self._cache) > CACHE_CAPACITY:
            self._cache.popitem(last=False)
        return job

    def _built_backend(self) -> GrammarBackend:
        """The backend, built on first use (normally by the first compile)."""
        with self._build_lock:
            if self.backend_error is not None:
                raise GrammarBackendUnavailable(str(self.backend_error))
            if self._backend is None:
                start = time.perf_counter()
                try:
                    self._backend = self._make_backend()
                except GrammarBackendUnavailable as exc:
                    self.backend_error = exc
                    raise
                logger.info("grammar backend ready in %.2f s", time.perf_counter() - start)
            return self._backend

    def _compile(self, key: GrammarKey) -> Any:
        backend = self._built_backend()
        start = time.perf_counter()
        outcome = "failed to compile"
        try:
            compiled = backend.compile(key)
            outcome = "compiled"
            return compiled
        finally:
            elapsed = time.perf_counter() - start
            self.num_compiles += 1
            self.compile_time_s += elapsed
            logger.debug("%s a %s constraint in %.1f ms", outcome, key.kind, elapsed * 1e3)

    # ------------------------------------------------------------------ hand back

    def wait(self, timeout_s: float) -> None:
        """Block up to timeout_s for any pending compile (the scheduler has nothing
        else to do)."""
        if self.queue:
            futures = [p.job.future for p in self.queue]
            wait_futures(futures, timeout_s, return_when="FIRST_COMPLETED")

    def pop_ready(self) -> tuple[list[Any], list[tuple[Any, Exception]]]:
        """(requests now holding a matcher in `req.grammar`, (request, error) pairs)."""
        ready, failed, still = [], [], []
        for pending in self.queue:
            job = pending.job
            if self.blocking:  # started by now: the one before it ended or was abandoned
                left_s = self.timeout_s - job.running_for_s(time.monotonic())
                wait_futures([job.future], max(left_s, 0.0))
            if not job.future.done():
                if job.running_for_s(time.monotonic()) >= self.timeout_s:
                    self._runner.abandon(job)
                    failed.append((pending.req, self.timeout_error(pending.key.kind)))
                else:
                    still.append(pending)
                continue
            error = job.future.exception()
            if error is not None:
                self._forget_failed(pending.key, job)
                failed.append((pending.req, error))
                continue
            pending.req.grammar = self.backend.new_grammar(job.future.result())
            ready.append(pending.req)
        self.queue = still
        return ready, failed

    def waiting_reqs(self) -> list[Any]:
        """The requests waiting for their grammar, in arrival order."""
        return [pending.req for pending in self.queue]

    def drain(self) -> list[Any]:
        """Take every waiting request out (the backend is gone); returns them."""
        reqs = [pending.req for pending in self.queue]
        self.queue = []
        return reqs

    def remove(self, rid: str) -> Any | None:
        """Take a waiting request out (abort); returns it, or None. Its compile is
        dropped too if it has not started and no other request waits for it."""
        for i, pending in enumerate(self.queue):
            if pending.req.rid == rid:
                del self.queue[i]
                self._drop_if_unwanted(pending)
                return pending.req
        return None

    def _drop_if_unwanted(self, gone: _Pending) -> None:
        if any(p.job is gone.job for p in self.queue):
            return
        if self._runner.cancel(gone.job):
            self._forget_failed(gone.key, gone.job)

    def _forget_failed(self, key: GrammarKey, job: CompileJob) -> None:
        # Errors are not cached: a transient failure should not stick to the key.
        if self._cache.get(key) is job:
            del self._cache[key]

    def timeout_error(self, kind: str) -> Exception:
        """The error of a `kind` constraint whose compile ran past the timeout."""
        return InvalidGrammarError(
            f"compiling the {kind} constraint took longer than "
            f"{self.timeout_s:g} s (SGLANG_GRAMMAR_TIMEOUT); it goes on in the "
            f"background, and a retry after it ends uses its result",
            kind,
        )

    # ------------------------------------------------------------------ per step

    def mask_for(self, reqs: list[Any], skip: list[bool] | None = None) -> GrammarMask | None:
        """This step's mask for `reqs` (batch order), or None when none is constrained.
        Rows with skip[i] set get none (a speculative verify masks those rows itself)."""
        rows = [
            i
            for i, r in enumerate(reqs)
            if r.grammar is not None and not (skip is not None and skip[i])
        ]
        if not rows:
            return None
        bitmask = self.backend.allocate_bitmask(len(reqs))
        for row in rows:
            reqs[row].grammar.fill_bitmask(bitmask, row)
        return GrammarMask(self.backend, bitmask, rows)

    def shutdown(self) -> None:
        self._runner.shutdown()
