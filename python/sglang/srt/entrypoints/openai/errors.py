"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`.

Every error a user can cause is raised as an `APIError` (or a pydantic / HTTP error
that the handlers below translate) and answered with that body; the server keeps
serving.
"""

from __future__ import annotations

import errno
import logging
from http import HTTPStatus
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from sglang.srt.entrypoints.openai.protocol import ErrorBody, ErrorResponse
from sglang.srt.managers.request_errors import ServerUnavailableError
from sglang.srt.sampling.param_types import error_of, most_telling_error

logger = logging.getLogger(__name__)
BaseModelT = TypeVar("BaseModelT", bound=BaseModel)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}
# api.md's table: a 400 is `invalid_value` unless a more telling code is given
_DEFAULT_CODE_BY_STATUS = {400: "invalid_value"}


class APIError(Exception):
    """An error answered to the client with an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        status_code: int = 400,
        *,
        param: str | None = None,
        code: str | None = None,
        err_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code if code is not None else _DEFAULT_CODE_BY_STATUS.get(status_code)
        self.err_type = err_type or _TYPE_BY_STATUS.get(status_code, "server_error")

    def body(self) -> dict:
        error = ErrorBody(
            message=self.message, type=self.err_type, param=self.param, code=self.code
        )
        return ErrorResponse(error=error).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)

    def sse_bytes(self) -> bytes:
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def from_validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic error, named by its JSON path (the `body` prefix dropped)."""
    errors = exc.errors()
    if not errors:
        return APIError("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(f"malformed JSON body: {first.get('msg', '')}", code="invalid_json")
    error = error_of(most_telling_error(errors))
    return APIError(str(error), param=error.param, code="invalid_value")


async def _api_error_handler(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_error(exc).response()


async def _http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    phrase = HTTPStatus(exc.status_code).phrase
    message = exc.detail if isinstance(exc.detail, str) else phrase
    headers = exc.headers
    if exc.status_code == 405:  # every method the path takes (Starlette names one route's)
        headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
    return APIError(message, exc.status_code, headers=headers).response()


def _allowed_methods(request: Request) -> list[str]:
    scope = {**request.scope, "method": "GET"}  # any method: a path match is PARTIAL at least
    return sorted({m for route in _routes(request.app.routes) if route.matches(scope)[0]
                   is not Match.NONE for m in getattr(route, "methods", None) or ()})  # fmt: skip


def _routes(routes: list[Any]) -> list[Any]:
    """The app's routes, those of included routers too (FastAPI wraps a router)."""
    out = []
    for route in routes:
        inner = getattr(getattr(route, "original_router", None), "routes", None)
        out.extend(_routes(inner) if inner is not None else [route])
    return out


async def _client_disconnect_handler(_: Request, exc: ClientDisconnect) -> JSONResponse:
    # the client closed its connection while sending the body: its own doing, no fault
    # here; the answer goes nowhere
    logger.info("a client disconnected before its request body arrived")
    return APIError("the client disconnected while sending the request body", 400).response()


async def _unavailable_handler(_: Request, exc: ServerUnavailableError) -> JSONResponse:
    """The runtime died under a control route (a weight update, a flush): a 503, as the
    requests in flight get."""
    return APIError(exc.message, exc.status_code).response()


def out_of_descriptors(exc: BaseException) -> APIError | None:
    """A 503 to retry for a request that failed because the process ran out of file
    descriptors (a connection flood past `ulimit -n`): the server recovers as connections
    close, so it is no internal error; None for any other exception."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        logger.warning("a request failed for want of file descriptors: %s", exc)
        return APIError("the server has too many open connections (out of file descriptors); "
                        "retry later", 503, code="server_overloaded",
                        headers={"Retry-After": "1"})  # fmt: skip
    return None


async def _unexpected_handler(_: Request, exc: Exception) -> JSONResponse:
    busy = out_of_descriptors(exc)
    if busy is not None:
        return busy.response()
    logger.exception("unhandled error in request")
    return APIError(f"internal error: {exc}", 500, err_type="server_error").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(ClientDisconnect, _client_disconnect_handler)
    app.add_exception_handler(ServerUnavailableError, _unavailable_handler)
    app.add_exception_handler(Exception, _unexpected_handler)


BYTES_PER_MIB = 1 << 20


def body_too_large(limit_bytes: int) -> APIError:
    return APIError(
        f"request body too large: the limit is {limit_bytes // BYTES_PER_MIB} MiB "
        "(--max-request-body-mb)",
        413,
        code="request_too_large",
    )


# codings a body may come in: a Content-Encoding of identity, a Transfer-Encoding of
# chunked (which the HTTP parser undoes)
_PLAIN_CODINGS = {
    "content-encoding": ("", "identity"),
    "transfer-encoding": ("", "identity", "chunked"),
}


def _refuse_codings(headers: Any) -> None:
    """415 for a compressed body (every Content-Encoding and Transfer-Encoding header,
    each a comma-separated list): the body is read as it comes, never decoded."""
    for name, plain in _PLAIN_CODINGS.items():
        for value in headers.getlist(name):
            for coding in value.split(","):
                coding = coding.strip().lower()
                if coding not in plain:
                    raise APIError(
                        f"{name.title()} {coding!r} is not supported: send the body uncompressed",
                        415,
                        code="unsupported_media_type",
                    )


async def read_body(raw_request: Request) -> bytes:
    """The body, refused (413) as soon as it passes the app's `max_request_body_bytes`:
    by its Content-Length before reading, or while reading a chunked one. A compressed
    body is refused (415): it is read as it comes, never decoded."""
    _refuse_codings(raw_request.headers)
    limit_bytes = raw_request.app.state.max_request_body_bytes
    declared = raw_request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise body_too_large(limit_bytes)
    chunks: list[bytes] = []
    size_bytes = 0
    async for chunk in raw_request.stream():
        size_bytes += len(chunk)
        if size_bytes > limit_bytes:
            raise body_too_large(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(raw_request: Request, model: type[BaseModelT]) -> BaseModelT:
    """The JSON body as `model`, whatever the Content-Type (curl -d sends a form type)."""
    body = await read_body(raw_request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(
            f"malformed JSON body: {_json_problem(body, exc)}", code="invalid_json"
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(RequestValidationError(exc.errors())) from None


def _json_problem(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """orjson's reason, except for bytes that are not UTF-8 (it blames surrogates)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"the body is not UTF-8 (byte {bad.start} is {body[bad.start : bad.start + 1]!r})"
    return str(exc)
