"""Run several single-prompt generations concurrently and merge their outputs.

The TokenizerManager serves one prompt with n = 1 per `generate_request` call, so
a request with `n > 1` or a list of prompts becomes one call per choice. A
`ChoiceFanout` starts those calls, forwards their cumulative outputs tagged with
the choice index, and guarantees that every unfinished choice is aborted when the
consumer stops early (client disconnect, error, cancellation).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang.srt.entrypoints.openai.errors import APIError, out_of_descriptors
from sglang.srt.entrypoints.openai.sampling import openai_message
from sglang.srt.managers.io_struct import share_logprob_budget
from sglang.srt.managers.request_errors import (
    InvalidRequestError,
    RequestFailedError,
    ServerOverloadedError,
    ServerUnavailableError,
)

if TYPE_CHECKING:
    from fastapi import Request

    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.observability.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class ClientDisconnected(Exception):
    """The HTTP client went away; its choices have been aborted."""


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client of `request` (whose body was read) goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass
class ChoiceEvent:
    index: int
    output: dict[str, Any] | None = None  # cumulative {"text", "output_ids", "meta_info"}
    error: BaseException | None = None
    disconnected: bool = False

    @property
    def finished(self) -> bool:
        return self.output is not None and self.output["meta_info"].get("finish_reason") is not None


def to_api_error(exc: BaseException, param_of: Callable[[str], str] | None = None) -> APIError:
    """Map what `generate_request` raises to a client-facing error. `param_of` renames a
    runtime error's native field path (`sampling_params.regex`) for the route."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ServerOverloadedError):
        return APIError(
            exc.message,
            exc.status_code,
            code="server_overloaded",
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, ServerUnavailableError):
        return APIError(exc.message, exc.status_code)
    if isinstance(exc, InvalidRequestError):
        message, param = _route_names(exc.message, exc.param, param_of)
        return APIError(message, exc.status_code, param=param, code="invalid_value")
    if isinstance(exc, RequestFailedError):
        return APIError(exc.message, exc.status_code, code="request_failed")
    if isinstance(exc, ValueError):
        message, param = _route_names(str(exc), getattr(exc, "param", None), param_of)
        lowered = message.lower()
        too_long = "context length" in lowered or "longer than" in lowered
        code = "context_length_exceeded" if too_long else "invalid_value"
        return APIError(message, 400, param=param, code=code)
    busy = out_of_descriptors(exc)
    if busy is not None:
        return busy
    logger.error("request failed unexpectedly: %r", exc)
    return APIError(f"internal error: {type(exc).__name__}: {exc}", 500, code="request_failed")


def is_client_error(exc: BaseException) -> bool:
    """A refusal of the request itself (4xx: invalid, overloaded), not a runtime failure."""
    if isinstance(exc, (APIError, RequestFailedError, ServerUnavailableError)):
        return exc.status_code < 500
    return isinstance(exc, ValueError)


def _route_names(
    message: str, param: str | None, param_of: Callable[[str], str] | None
) -> tuple[str, str | None]:
    """(message, param) in the route's names: OpenAI's where `param_of` is given."""
    if param_of is None:
        return message, param
    return openai_message(message, param_of), (param_of(param) if param else param)


class ChoiceFanout:
    """One `generate_request` per choice; events come out in arrival order."""

    def __init__(
        self,
        tokenizer_manager: Any,
        objs: list[GenerateReqInput],
        metrics: ServerMetrics | None = None,
        request: Request | None = None,
        param_of: Callable[[str], str] | None = None,
        choice_param: Callable[[str, int], str] | None = None,
    ) -> None:
        """`param_of` renames a runtime error's field path for the route (OpenAI's
        names); `choice_param(path, choice index)` names the failing choice's element of
        a per-prompt field (a batch)."""
        self._tm = tokenizer_manager
        self._param_of = param_of
        self._choice_param = choice_param
        share_logprob_budget(objs)
        self._objs = objs
        self._metrics = metrics
        self._request = request
        self._queue: asyncio.Queue[ChoiceEvent] = asyncio.Queue()
        # per choice, its output event still in the queue: a newer output replaces that
        # event's (outputs are cumulative), so a client that does not read holds one
        # output per choice, not one per step (O(tokens^2) memory: +1 GB at 4k tokens)
        self._unread: dict[int, ChoiceEvent] = {}
        self._buffer: list[ChoiceEvent] = []
        self._finished: set[int] = set()
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self._failed = False  # a choice failed: the others were cancelled for it

    @property
    def num_choices(self) -> int:
        return len(self._objs)

    async def __aenter__(self) -> ChoiceFanout:
        self._tasks = [asyncio.create_task(self._pump(i, obj)) for i, obj in enumerate(self._objs)]
        if self._request is not None:
            self._tasks.append(asyncio.create_task(self._watch_disconnect()))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    async def prime(self) -> None:
        """Wait for every choice's first output; raise APIError for a rejected input.

        Priming lets a streaming route answer a bad prompt with a plain 400 before
        it commits to a 200 event stream.
        """
        started: set[int] = set()
        while len(started) < self.num_choices:
            event = await self._next_event()
            self._buffer.append(event)
            self._raise_if_failed(event)
            started.add(event.index)

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        """Outputs until every choice finished; raises on an error or a disconnect."""
        pending, self._buffer = self._buffer, []
        for event in pending:
            self._note(event)
            yield event
        while len(self._finished) < self.num_choices:
            event = await self._next_event()
            self._raise_if_failed(event)
            self._note(event)
            yield event

    async def collect(self) -> list[dict[str, Any]]:
        """The final output of every choice, by index."""
        final: dict[int, dict[str, Any]] = {}
        async for event in self.events():
            final[event.index] = event.output
        return [final[i] for i in range(self.num_choices)]

    def close(self) -> None:
        """Abort every unfinished choice and stop the helper tasks (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for index, obj in enumerate(self._objs):
            if index not in self._finished:
                self._tm.abort_own_request(obj)
        for task in self._tasks:
            task.cancel()
        # A cancelled task keeps its CancelledError, whose traceback holds the task's
        # frames, whose `self` is this object: holding the tasks here would close a
        # reference cycle per request (~60 objects) that only a full collection frees.
        self._tasks = []

    async def _next_event(self) -> ChoiceEvent:
        event = await self._queue.get()
        if self._unread.get(event.index) is event:
            del self._unread[event.index]
        return event

    def _put_output(self, index: int, output: dict[str, Any]) -> ChoiceEvent:
        """Queue `output`, or give it to this choice's event still in the queue."""
        unread = self._unread.get(index)
        if unread is not None:
            unread.output = output
            return unread
        event = self._unread[index] = ChoiceEvent(index, output=output)
        self._queue.put_nowait(event)
        return event

    def _note(self, event: ChoiceEvent) -> None:
        if event.finished:
            self._finished.add(event.index)

    def _raise_if_failed(self, event: ChoiceEvent) -> None:
        if event.disconnected:
            self.close()
            raise ClientDisconnected()
        if event.error is not None:
            self._failed = True
            self.close()
            raise to_api_error(event.error, self._route_param_of(event.index))

    def _route_param_of(self, index: int) -> Callable[[str], str] | None:
        """The field-path renaming for an error of choice `index`."""
        if self._choice_param is None:
            return self._param_of
        choice_param, param_of = self._choice_param, self._param_of or (lambda path: path)
        return lambda path: choice_param(param_of(path), index)

    async def _pump(self, index: int, obj: GenerateReqInput) -> None:
        tracker = self._metrics.track() if self._metrics is not None else None
        finished = False
        try:
            async for output in self._tm.generate_request(obj):
                if tracker is not None:
                    tracker.on_output(output)
                finished = self._put_output(index, output).finished
            if not finished:
                raise RuntimeError("generation ended without a finish reason")
        except asyncio.CancelledError:
            # cancelled because a sibling failed: the request as a whole failed, counted
            # (or, refused, not) by that sibling
            if tracker is not None and not finished and not self._failed:
                tracker.on_abort()
            raise
        except Exception as exc:  # forwarded to the consumer, which answers it
            if tracker is not None and not is_client_error(exc):
                tracker.on_failure()
            # Without its traceback, which only the answer's mapping would see (it logs
            # the repr): its frames hold this object, so a stored traceback is a reference
            # cycle per failed request (a 429 under load) that only a full collection frees.
            self._queue.put_nowait(ChoiceEvent(index, error=exc.with_traceback(None)))

    async def _watch_disconnect(self) -> None:
        await wait_for_disconnect(self._request)
        logger.info(
            "client disconnected; aborting request %s (%d choice(s))",
            self._objs[0].parent_rid or self._objs[0].rid,
            self.num_choices,
        )
        self._queue.put_nowait(ChoiceEvent(-1, disconnected=True))
        self.close()
