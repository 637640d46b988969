"""The HTTP server: a FastAPI app over one TokenizerManager, served by uvicorn on uvloop.

`create_app(tokenizer_manager)` builds the app (routes, error bodies, the API key
check, metrics) from the published `serving` and `observability` bags;
`launch_server(server_args)` starts the runtime's processes, warms up, serves
until SIGTERM/SIGINT (or a dead child), then stops the children.

Server status (what `/health` answers):

    starting -> ready           after a 1-token warmup generation succeeded
    ready -> shutting_down      on SIGTERM / SIGINT
    any -> dead                 when the scheduler (or another child) died
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import logging
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool

from sglang import __version__
from sglang.srt.arg_groups.model import LOAD_FORMAT_CHOICES
from sglang.srt.entrypoints.http_protocol import GuardedHttpToolsProtocol
from sglang.srt.entrypoints.openai.errors import (
    BYTES_PER_MIB,
    APIError,
    install_error_handlers,
    parse_body,
)
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from sglang.srt.entrypoints.openai.serving_base import MODEL_ALIASES
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_embedding import EncodeRequest, OpenAIServingEmbedding
from sglang.srt.entrypoints.openai.serving_native import GenerateRequest, NativeServing
from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingTokenize
from sglang.srt.entrypoints.openapi_bodies import install_body_schemas
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import (
    HEALTH_PROBE_RID_PREFIX,
    EmbeddingReqInput,
    GenerateReqInput,
)
from sglang.srt.managers.node_link import split_dist_init_addr
from sglang.srt.observability.metrics import ServerMetrics
from sglang.srt.parser.chat_template import load_chat_template
from sglang.srt.utils import freeze_startup_heap

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health"})  # served without the API key
# probed by load balancers and scrapers every few seconds: no access line with
# --log-requests (one a request is what it promises, not ten a second of probes)
QUIET_ACCESS_PATHS = frozenset({"/health", "/health_generate", "/metrics"})
SHUTDOWN_FAIL_MARGIN_S = 1.0  # before the grace ends, still-running requests get an error
FORCED_EXIT_ANSWER_S = 2.0  # after a forced exit, how long requests get to send their error
WATCH_INTERVAL_S = 1.0
DEAD_GRACE_S = 2.0  # /health answers 503 this long before a server with a dead child exits
WARMUP_PROMPT = "The capital of France is"
WARMUP_INPUT_IDS = [10, 11, 12, 13, 14]  # the prompt under --skip-tokenizer-init


def _health_generate_timeout_s() -> float:
    """Seconds /health_generate waits for a token (SGLANG_HEALTH_CHECK_TIMEOUT, default 20)."""
    return envs.SGLANG_HEALTH_CHECK_TIMEOUT.get()


class ServerStatus(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    SHUTTING_DOWN = "shutting_down"
    DEAD = "dead"


@dataclass
class ServerState:
    """Everything a route needs, hung on `app.state.server`."""

    tokenizer_manager: Any
    chat: OpenAIServingChat
    completion: OpenAIServingCompletion
    native: NativeServing
    embedding: OpenAIServingEmbedding
    tokenize: OpenAIServingTokenize
    metrics: ServerMetrics | None = None
    status: ServerStatus = ServerStatus.STARTING
    exit_code: int = 0

    def is_healthy(self) -> bool:
        return self.status is ServerStatus.READY and self.tokenizer_manager.is_alive()


def server_state(request: Request) -> ServerState:
    return request.app.state.server


# --- auth ----------------------------------------------------------------------------------


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every route but OPEN_PATHS; else 401."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self._expected = api_key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "").rstrip("/") or "/"  # /health/ is /health (a redirect)
        if scope["type"] != "http" or path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        error = APIError(
            "Incorrect or missing API key: send `Authorization: Bearer <key>`.",
            401,
            code="invalid_api_key",
        )
        await error.response()(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        # the first Authorization header, as Starlette's (and SGLang's, vLLM's) reads it
        value = next((v for k, v in scope.get("headers") or [] if k == b"authorization"), b"")
        scheme, _, token = value.partition(b" ")
        # the scheme is case-insensitive (RFC 7235): `bearer KEY` is as good
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected)


# --- OpenAI and native generation routes ---------------------------------------------------

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(raw_request: Request) -> Response:
    request = await parse_body(raw_request, ChatCompletionRequest)
    return await server_state(raw_request).chat.handle(request, raw_request)


@router.post("/v1/completions")
async def completions(raw_request: Request) -> Response:
    request = await parse_body(raw_request, CompletionRequest)
    return await server_state(raw_request).completion.handle(request, raw_request)


@router.post("/v1/embeddings")
async def embeddings(raw_request: Request) -> Response:
    request = await parse_body(raw_request, EmbeddingRequest)
    return await server_state(raw_request).embedding.handle(request, raw_request)


@router.post("/encode")
async def encode(raw_request: Request) -> Response:
    request = await parse_body(raw_request, EncodeRequest)
    return await server_state(raw_request).embedding.handle_native(request, raw_request)


@router.post("/v1/tokenize")
@router.post("/tokenize")
async def tokenize(raw_request: Request) -> TokenizeResponse:
    request = await parse_body(raw_request, TokenizeRequest)
    return await server_state(raw_request).tokenize.tokenize(request)


@router.post("/v1/detokenize")
@router.post("/detokenize")
async def detokenize(raw_request: Request) -> DetokenizeResponse:
    request = await parse_body(raw_request, DetokenizeRequest)
    return await server_state(raw_request).tokenize.detokenize(request)


@router.post("/generate")
async def generate(raw_request: Request) -> Response:
    request = await parse_body(raw_request, GenerateRequest)
    return await server_state(raw_request).native.handle(request, raw_request)


def _model_card(tokenizer_manager: Any) -> ModelCard:
    return ModelCard(
        id=tokenizer_manager.served_model_name,
        root=str(tokenizer_manager.config_value("model_path")),
        max_model_len=tokenizer_manager.context_len,
    )


@router.get("/v1/models")
async def list_models(raw_request: Request) -> ModelList:
    return ModelList(data=[_model_card(server_state(raw_request).tokenizer_manager)])


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, raw_request: Request) -> ModelCard:
    card = _model_card(server_state(raw_request).tokenizer_manager)
    if model_id != card.id and model_id not in MODEL_ALIASES:  # the routes accept "default"
        raise APIError(f"The model `{model_id}` does not exist.", 404, param="model",
                       code="model_not_found")  # fmt: skip
    return card


# --- health ---------------------------------------------------------------------------------


# One route per method: each gets its own OpenAPI operationId.
@router.get("/health")
@router.head("/health")
async def health(raw_request: Request) -> Response:
    """200 when ready, every child alive, and the scheduler answers between its steps."""
    state = server_state(raw_request)
    if not state.tokenizer_manager.is_alive():  # a child died; the server is exiting
        return JSONResponse({"status": ServerStatus.DEAD.value}, status_code=503)
    if not state.is_healthy():
        return JSONResponse({"status": state.status.value}, status_code=503)
    if not await _scheduler_answers(state.tokenizer_manager):  # ready, yet stuck
        return JSONResponse({"status": "unhealthy"}, status_code=503)
    return JSONResponse({"status": state.status.value})


async def _scheduler_answers(tokenizer_manager: Any) -> bool:
    """A hung scheduler loop (alive, but stuck) fails this; a busy one answers within a step.

    Output from the runtime within the timeout counts as an answer, and so does a
    forward in progress (the scheduler's watchdog ends one that runs past
    --watchdog-timeout): /health stays fast under a burst and during a long prefill.
    First, every DP rank must have stepped or been in a forward within the timeout:
    output from one rank says nothing of a frozen other. A weight update in progress
    counts as answering (requests wait for it; the launcher's watchdog ends a scheduler
    frozen past --watchdog-timeout)."""
    timeout_s = envs.SGLANG_HEALTH_TIMEOUT.get()
    if tokenizer_manager.updating_weights():  # the schedulers load; requests wait for them
        return True
    stalled = tokenizer_manager.stalled_ranks(timeout_s)
    if stalled:
        logger.warning("health check: DP rank(s) %s did not step for %.0f s", stalled, timeout_s)
        return False
    if tokenizer_manager.seconds_since_output() < timeout_s:
        return True
    if tokenizer_manager.scheduler_busy_for_s() is not None:
        return True
    try:
        await asyncio.wait_for(tokenizer_manager.get_internal_state(), timeout_s)
    except Exception as exc:  # timeout, or the runtime died meanwhile
        logger.warning("health check: scheduler did not answer (%r)", exc)
        return False
    return True


async def generate_one_token(tokenizer_manager: Any, timeout_s: float) -> None:
    """Raise unless a 1-token greedy generation finishes within `timeout_s`
    (token ids when the server has no tokenizer: --skip-tokenizer-init)."""
    params = {"max_new_tokens": 1, "temperature": 0.0}
    if tokenizer_manager.tokenizer is None:
        vocab_size = tokenizer_manager.model_config.vocab_size
        prompt = {"input_ids": [i % vocab_size for i in WARMUP_INPUT_IDS]}
    else:
        prompt = {"text": WARMUP_PROMPT}
    rid = f"{HEALTH_PROBE_RID_PREFIX}{uuid.uuid4().hex}"  # no client's: abort_all skips it
    if tokenizer_manager.is_embedding:  # an embedding server: one embedding instead
        obj = EmbeddingReqInput(**prompt, rid=rid)
        await _within(tokenizer_manager.encode_request(obj), obj.rid, tokenizer_manager, timeout_s)
        return
    obj = GenerateReqInput(**prompt, sampling_params=params, rid=rid)

    async def run() -> None:
        async for output in tokenizer_manager.generate_request(obj):
            reason = output["meta_info"].get("finish_reason")
            if reason is not None and reason.get("type") == "abort":
                raise RuntimeError(reason.get("message", "generation aborted"))

    await _within(run(), obj.rid, tokenizer_manager, timeout_s)


async def _within(coro: Any, rid: str, tokenizer_manager: Any, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(coro, timeout_s)
    except asyncio.TimeoutError:
        tokenizer_manager.abort_request(rid)
        raise


@router.get("/health_generate")
async def health_generate(raw_request: Request) -> Response:
    state = server_state(raw_request)
    if state.status is not ServerStatus.READY:
        return JSONResponse({"status": state.status.value}, status_code=503)
    try:
        await generate_one_token(state.tokenizer_manager, _health_generate_timeout_s())
    except Exception as exc:
        logger.warning("health_generate failed: %r", exc)  # a timeout's str() is empty
        return JSONResponse({"status": "unhealthy", "message": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok"})


# --- readback and control ------------------------------------------------------------------


def model_info(tokenizer_manager: Any) -> dict[str, Any]:
    tm = tokenizer_manager
    return {
        "model_path": tm.config_value("model_path"),
        "tokenizer_path": tm.config_value("tokenizer_path"),
        "load_format": tm.config_value("load_format"),
        "served_model_name": tm.served_model_name,
        "context_length": tm.context_len,
        "is_generation": not tm.is_embedding,
    }


@router.get("/model_info")
@router.get("/get_model_info")
async def get_model_info(raw_request: Request) -> dict[str, Any]:
    return model_info(server_state(raw_request).tokenizer_manager)


@router.get("/server_info")
@router.get("/get_server_info")
async def get_server_info(raw_request: Request) -> dict[str, Any]:
    state = server_state(raw_request)
    info = _redacted(state.tokenizer_manager.resolved_config_dict())
    states = await state.tokenizer_manager.get_internal_state()
    info["internal_states"] = [_redacted(s) for s in states]
    info["status"] = state.status.value
    info["version"] = __version__
    return info


SECRET_FIELDS = ("api_key",)


def _redacted(config: dict[str, Any]) -> dict[str, Any]:
    """A copy with secrets shown as set or not, never their value."""
    return {k: ("<set>" if k in SECRET_FIELDS and v else v) for k, v in config.items()}


@router.get("/flush_cache")
@router.post("/flush_cache")
async def flush_cache(raw_request: Request) -> Response:
    flushed, busy = await server_state(raw_request).tokenizer_manager.flush_cache_ranks()
    if not busy:
        return PlainTextResponse("Cache flushed.\n")
    if not flushed:
        raise APIError("Cache not flushed: requests are still running.", 400, code="cache_busy")
    raise APIError(
        f"Cache flushed on DP ranks {flushed} only: requests are still running on ranks "
        f"{busy}, whose caches were kept.",
        400,
        code="cache_busy",
    )


class AbortRequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rid: str = ""
    abort_all: StrictBool = False  # SGLang's: every request in flight


@router.post("/abort_request")
async def abort_request(raw_request: Request) -> dict[str, Any]:
    """200 either way: `success` says whether the request (or, for n > 1, one of
    its samples `<rid>-<k>`), or with abort_all any request, was in flight and is
    now being aborted."""
    body = await parse_body(raw_request, AbortRequestBody)
    tm = server_state(raw_request).tokenizer_manager
    if body.abort_all:
        count = tm.abort_all()
        logger.info("abort_all: %d request(s) in flight aborted", count)
        return {"success": count > 0, "rid": body.rid, "num_aborted": count}
    if not body.rid:
        raise APIError("rid is required unless abort_all is true", 400, param="rid")
    found = tm.abort_request(body.rid, with_samples=True)
    return {"success": bool(found), "rid": body.rid}


class UpdateWeightsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_path: str
    load_format: str | None = None  # --load-format's choices; "" or null: auto
    abort_all_requests: StrictBool = False  # SGLang's: abort what runs, then update
    # SGLang's; the prefix cache holds the old weights' KV, so an update always drops it
    flush_cache: StrictBool = True


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(raw_request: Request) -> Response:
    body = await parse_body(raw_request, UpdateWeightsBody)
    if body.load_format and body.load_format not in LOAD_FORMAT_CHOICES:
        raise APIError(
            f"unsupported load format {body.load_format!r}; supported: "
            f"{', '.join(LOAD_FORMAT_CHOICES)}",
            400,
            param="load_format",
        )
    if not body.flush_cache:
        raise APIError(
            "flush_cache false is not supported: the prefix cache holds KV computed with "
            "the old weights, so a weight update always drops it",
            400,
            param="flush_cache",
        )
    tm = server_state(raw_request).tokenizer_manager
    success, message = await tm.update_weights_from_disk(
        body.model_path, body.load_format, body.abort_all_requests
    )
    payload = {"success": success, "message": message}
    if not success:
        return APIError(message, 400, param="model_path", code="update_failed").response()
    logger.info("weights updated from %s", body.model_path)
    return JSONResponse(payload)


async def metrics_route(raw_request: Request) -> Response:
    state = server_state(raw_request)
    state.metrics.set_scheduler_states(await state.tokenizer_manager.get_internal_state())
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


# --- the app ---------------------------------------------------------------------------------

# The JSON body of each POST route, for /openapi.json.
POST_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/generate": GenerateRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/encode": EncodeRequest,
    "/v1/tokenize": TokenizeRequest,
    "/tokenize": TokenizeRequest,
    "/v1/detokenize": DetokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/abort_request": AbortRequestBody,
    "/update_weights_from_disk": UpdateWeightsBody,
}


def create_app(tokenizer_manager: Any) -> FastAPI:
    """The app over `tokenizer_manager`; reads the published serving/observability bags."""
    from sglang.srt.runtime_context import get_observability, get_serving

    serving = get_serving()
    metrics = (
        ServerMetrics(tokenizer_manager.served_model_name)
        if get_observability().enable_metrics
        else None
    )
    template = load_chat_template(serving.chat_template)
    app = FastAPI(title="SGLang-compatible server", version=__version__)
    app.state.max_request_body_bytes = serving.max_request_body_mb * BYTES_PER_MIB
    app.state.server = ServerState(
        tokenizer_manager=tokenizer_manager,
        chat=OpenAIServingChat(tokenizer_manager, metrics, chat_template=template),
        completion=OpenAIServingCompletion(tokenizer_manager, metrics),
        native=NativeServing(tokenizer_manager, metrics),
        embedding=OpenAIServingEmbedding(tokenizer_manager, metrics),
        tokenize=OpenAIServingTokenize(tokenizer_manager),
        metrics=metrics,
    )
    install_error_handlers(app)
    app.include_router(router)
    install_body_schemas(app, POST_BODIES)
    if metrics is not None:
        app.add_api_route("/metrics", metrics_route, methods=["GET"])
    if serving.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=serving.api_key)
    # outermost: a browser's preflight is answered before the API key is asked for; every
    # origin is allowed, as SGLang's and vLLM's servers do
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"],
                       allow_headers=["*"])  # fmt: skip
    return app


# --- lifecycle ------------------------------------------------------------------------------


# Signals that stop the server gracefully: uvicorn's two, and SIGHUP (the terminal that
# ran it closed), which killed the launcher at once (streams cut, no error event)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Server(uvicorn.Server):
    """uvicorn, but a signal starts our bounded shutdown and is not re-raised after it,
    so that the launcher can stop the children and exit 0."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT and SIGTERM, and SIGHUP too (STOP_SIGNALS)."""
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGHUP, self.handle_exit)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.state.status is not ServerStatus.DEAD:
            self.state.status = ServerStatus.SHUTTING_DOWN
        logger.info("signal %d received: shutting down", sig)
        if not self.should_exit:  # the first signal: in-flight requests get the grace
            loop = asyncio.get_event_loop()
            delay_s = max(0.0, self.config.timeout_graceful_shutdown - SHUTDOWN_FAIL_MARGIN_S)
            loop.call_soon_threadsafe(loop.call_later, delay_s, self._fail_in_flight)
        super().handle_exit(sig, frame)
        self._captured_signals.clear()

    def _fail_in_flight(self) -> None:
        """Just before uvicorn cancels what still runs: an error for each request (a
        stream ends with an error event and [DONE]), not a connection cut mid-body."""
        self.state.tokenizer_manager.fail_in_flight(
            "The server shut down before this request finished."
        )


def _server_url() -> str:
    from sglang.srt.runtime_context import get_serving

    host = get_serving().host
    # "::" listens on IPv6 only (asyncio sets IPV6_V6ONLY): its loopback is [::1]
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)
    return f"http://{shown}:{get_serving().port}"


async def _wait_started(server: _Server) -> None:
    while not server.started and not server.should_exit:
        await asyncio.sleep(0.05)


async def _warmup(server: _Server) -> None:
    """Mark the server ready after one real generation (unless warmup is skipped)."""
    from sglang.srt.runtime_context import get_serving

    state = server.state
    await _wait_started(server)
    if server.should_exit:
        return
    if not get_serving().skip_server_warmup:
        try:
            await generate_one_token(state.tokenizer_manager, _health_generate_timeout_s() * 3)
        except Exception as exc:
            logger.error("warmup generation failed: %s", exc)
            _fail(server, "warmup failed")
            return
    if state.status is ServerStatus.STARTING:
        freeze_startup_heap("launcher")
        state.status = ServerStatus.READY
        logger.info("The server is fired up and ready to roll! URL: %s", _server_url())


def _fail(server: _Server, why: str) -> None:
    logger.error("shutting down: %s", why)
    server.state.status = ServerStatus.DEAD
    server.state.exit_code = 1
    server.should_exit = True


async def _watch_children(server: _Server) -> None:
    """A dead scheduler makes /health 503, then takes the server down (exit 1)."""
    state = server.state
    while not server.should_exit and state.tokenizer_manager.is_alive():
        await asyncio.sleep(WATCH_INTERVAL_S)
    if server.should_exit:
        return
    state.status = ServerStatus.DEAD
    logger.error("a runtime process died; exiting in %.0f s", DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    _fail(server, "a runtime process died")


async def serve_app(app: FastAPI) -> int:
    """Serve `app` until a signal or a dead child; the exit code."""
    from sglang.srt.runtime_context import get_observability, get_serving

    _quiet_probe_access_lines()
    config = uvicorn.Config(
        app,
        host=get_serving().host,
        port=get_serving().port,
        log_config=None,
        log_level=get_observability().log_level,
        access_log=get_observability().log_requests,
        timeout_graceful_shutdown=envs.SGLANG_GRACEFUL_SHUTDOWN_TIMEOUT.get(),
        loop="none",
        http=GuardedHttpToolsProtocol,  # limits on reading a request (http_protocol.py)
    )
    server = _Server(config, app.state.server)
    helpers = [asyncio.create_task(_warmup(server)), asyncio.create_task(_watch_children(server))]
    try:
        await server.serve()
    finally:
        for task in helpers:
            task.cancel()
        await _answer_left_requests(server)
        await server.state.tokenizer_manager.aclose()
    return server.state.exit_code


class _QuietProbes(logging.Filter):
    """Drops uvicorn's access lines for QUIET_ACCESS_PATHS. Its access record's args
    are (client, method, path with query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0].rstrip("/") not in QUIET_ACCESS_PATHS
        return True


def _quiet_probe_access_lines() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _QuietProbes) for f in access.filters):
        access.addFilter(_QuietProbes())


async def _answer_left_requests(server: _Server) -> None:
    """After a forced exit (a second Ctrl-C) uvicorn leaves requests running: each gets
    the shutdown error (a stream: an error event and [DONE]) before the sockets close,
    not a 500 from a closed socket or a connection cut mid-body."""
    tasks = [t for t in server.server_state.tasks if not t.done()]
    if not tasks:
        return
    server._fail_in_flight()
    await asyncio.wait(tasks, timeout=FORCED_EXIT_ANSWER_S)


def _check_address_free(host: str, port: int) -> None:
    """ValueError naming host/port when the HTTP server could not listen there (taken,
    or a host that does not resolve). Bound as uvicorn binds (SO_REUSEADDR) and closed:
    a port taken in between is still refused by uvicorn itself."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        ):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as exc:
        raise ValueError(f"host/port: cannot listen on {host}:{port}: {exc}") from None


def _check_host_resolves(dist_init_addr: str | None) -> None:
    """ValueError naming --dist-init-addr when its host does not resolve: the
    rendezvous would otherwise retry for minutes before failing."""
    if not dist_init_addr:
        return
    host = split_dist_init_addr(dist_init_addr)[0].strip("[]")
    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:
        raise ValueError(f"dist_init_addr={dist_init_addr!r}: cannot resolve {host!r}: {exc}") from None


def _run_event_loop(main: Any) -> int:
    try:
        import uvloop
    except ImportError:  # no uvloop on this platform: the default loop serves too
        return asyncio.run(main)
    return uvloop.run(main)


def _apply_log_level() -> None:
    from sglang.srt.runtime_context import get_observability

    logging.getLogger().setLevel(get_observability().log_level.upper())


@contextlib.contextmanager
def _signals_exit_cleanly() -> Iterator[None]:
    """While the runtime starts, STOP_SIGNALS unwind (the launcher stops the children
    it started) and the process exits 0; uvicorn takes the signals over once serving."""

    def stop(signum: int, frame: Any) -> None:
        logger.info("signal %d received during startup: stopping", signum)
        raise SystemExit(0)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_server(server_args: Any, placement_group: Any = None) -> int:
    """Start the runtime, serve HTTP until told to stop, stop the children; the exit code.

    On node_rank > 0 of a multi-node server no HTTP server starts: the node runs its
    TP ranks until one exits (run_worker_node). `placement_group`: a Ray placement
    group to run the schedulers in (`--use-ray`, ray_engine.launch_server_on_ray)."""
    from sglang.srt.entrypoints.engine import _launch_subprocesses, run_worker_node
    from sglang.srt.server_args import resolution_result

    _check_host_resolves(resolution_result(server_args, "dist_init_addr"))
    node_rank = int(resolution_result(server_args, "node_rank"))
    if node_rank > 0:
        nnodes = resolution_result(server_args, "nnodes")
        logger.info("node %d of %d: scheduler ranks only, no HTTP server", node_rank, nnodes)
        with _signals_exit_cleanly():
            return run_worker_node(server_args)
    # before minutes of model loading, not after
    _check_address_free(
        resolution_result(server_args, "host"), resolution_result(server_args, "port")
    )
    with _signals_exit_cleanly():
        tokenizer_manager, children = _launch_subprocesses(server_args, placement_group)
    try:
        # until uvicorn takes the signals over (and after it gives them back): a signal
        # there killed the launcher, its children left to find out alone
        with _signals_exit_cleanly():
            _apply_log_level()
            app = create_app(tokenizer_manager)
            return _run_event_loop(serve_app(app))
    finally:
        children.shutdown()
        logger.info("server stopped")
