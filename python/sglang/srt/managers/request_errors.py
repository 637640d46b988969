"""Errors a request can end with after it was accepted (the runtime refused or failed it).

The scheduler and detokenizer end such a request with an `abort` finish reason
that carries a `status_code`; the TokenizerManager raises it as one of these, so
the Engine raises a clear exception and the HTTP routes answer that status with
an OpenAI-style body (429 carries `Retry-After`). An abort the client asked for
(`/abort_request`, a disconnect) has no status code and stays a normal finish.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST_STATUS = 400
OVERLOADED_STATUS = 429
INTERNAL_ERROR_STATUS = 500
UNAVAILABLE_STATUS = 503
RETRY_AFTER_S = 1  # what a 429 tells the client to wait


class RequestFailedError(RuntimeError):
    """The runtime could not serve this request; `status_code` is the HTTP status."""

    def __init__(self, message: str, status_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class InvalidRequestError(RequestFailedError, ValueError):
    """The runtime found the request invalid after accepting it (a constraint that does
    not compile, say); `param` names the field. HTTP 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, INVALID_REQUEST_STATUS)
        self.param = param


class ServerOverloadedError(RequestFailedError):
    """The request queue is full (--max-queued-requests); retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message, OVERLOADED_STATUS)
        self.retry_after_s = retry_after_s


class ServerUnavailableError(RequestFailedError):
    """The runtime cannot serve at all (a child process died, or it is shut down)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, UNAVAILABLE_STATUS)


def error_of_finish(reason: dict[str, Any] | None) -> RequestFailedError | None:
    """The error an abort finish reason stands for, or None for a normal finish."""
    if not reason or reason.get("type") != "abort" or "status_code" not in reason:
        return None
    message = reason.get("message") or "the request failed"
    status = int(reason["status_code"])
    if status == OVERLOADED_STATUS:
        return ServerOverloadedError(message)
    if status == INVALID_REQUEST_STATUS:
        return InvalidRequestError(message, reason.get("param"))
    return RequestFailedError(message, status)


def raise_if_failed(runtime_error: str | None, finished_reason: dict[str, Any] | None) -> None:
    """Raise what a request's state says it ended with: the runtime died (503), or an abort
    that carries a status (a refusal, an internal error). A normal finish or none yet: no-op."""
    if runtime_error is not None:
        raise ServerUnavailableError(runtime_error)
    failure = error_of_finish(finished_reason)
    if failure is not None:
        raise failure


def aborted_reason(message: str) -> dict[str, Any]:
    """The finish reason of a request aborted on request (abort_request, abort_all)."""
    return {"type": "abort", "matched": None, "message": message}


def invalid_request_reason(message: str, param: str | None) -> dict[str, Any]:
    """The abort finish reason of a request the runtime found invalid (HTTP 400)."""
    return {**aborted_reason(message), "status_code": INVALID_REQUEST_STATUS, "param": param}


def internal_error_reason(exc: BaseException) -> dict[str, Any]:
    """The abort finish reason of a request that failed inside the runtime (HTTP 500)."""
    message = f"Internal error while processing this request: {type(exc).__name__}: {exc}"
    return {**aborted_reason(message), "status_code": INTERNAL_ERROR_STATUS}

# /update_weights_from_disk's answer while a request runs (the TokenizerManager's and
# each scheduler's): weights change only between requests.
UPDATE_BUSY_MESSAGE = "Cannot update weights while requests are in flight."
