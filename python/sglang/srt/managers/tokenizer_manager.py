"""The TokenizerManager: the main process's asyncio front of the runtime.

It tokenizes and validates requests, sends them to the scheduler, and wakes
the waiting coroutine when the detokenizer's BatchStrOutput arrives (with
detokenizer_mode inline it receives the schedulers' BatchTokenIDOutput and
detokenizes it here, a BatchDetokenizer of its own). One
instance per Engine / HTTP server; several may share a process, so per-engine
control-plane state (model path after a weight reload, detected parsers) lives
here (`record_config_updates`), not in the process-wide config bags.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pickle
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from pydantic import BaseModel, ValidationError

from sglang.srt.managers.detokenizer_manager import BatchDetokenizer, token_piece_text
from sglang.srt.managers.forward_clock import ForwardClock
from sglang.srt.managers.io_struct import (
    LOGPROB_FIELDS,
    MAX_LOGPROB_ENTRIES_PER_REQUEST,
    AbortReq,
    BatchStrOutput,
    BatchTokenIDOutput,
    EmbeddingReqInput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    LogprobBudget,
    TokenizedGenerateReqInput,
    TokenizerHandoff,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    is_health_probe,
)
from sglang.srt.managers.ipc import AsyncPullEndpoint, PushEndpoint
from sglang.srt.managers.request_errors import (
    UPDATE_BUSY_MESSAGE,
    ServerUnavailableError,
    aborted_reason,
    internal_error_reason,
    raise_if_failed,
)
from sglang.srt.managers.tokenizer_embedding import TokenizerEmbeddingMixin
from sglang.srt.parser.reasoning_parser import reasoning_format
from sglang.srt.runtime_context import get_model, get_schedule
from sglang.srt.sampling.param_types import (
    MAX_TOP_LOGPROBS_NUM,
    Flag,
    InvalidParamError,
    LogprobStartLen,
    LogprobTokenIds,
    RequestId,
    TopLogprobsNum,
    first_error,
    strict,
)
from sglang.srt.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

INLINE_TOKENIZE_CHARS = 16_384  # longer texts are tokenized off the event loop
# An abandoned request's rid is held until the scheduler's finish for it arrives (ms);
# past this, a new request may take the rid anyway (the finish was lost).
ABANDONED_RID_HOLD_S = 30.0
# how long a weight update with abort_all_requests waits for the aborted requests to end
UPDATE_DRAIN_TIMEOUT_S = 30.0
# A local directory with none of these has no tokenizer for AutoTokenizer to load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer() -> Any:
    """The HF tokenizer named by the published `model` bag (None if skipped)."""
    from transformers import AutoTokenizer

    model = get_model()
    if model.skip_tokenizer_init:
        return None
    path = model.tokenizer_path or model.model_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=model.trust_remote_code, revision=model.revision
        )
    except (OSError, ValueError) as exc:
        local = Path(os.path.expanduser(path))
        if local.is_dir() and not any((local / name).exists() for name in TOKENIZER_FILES):
            fix = (
                "point --tokenizer-path at a directory that holds them"
                if model.tokenizer_path
                else "pass --tokenizer-path DIR"
            )
            raise ValueError(
                f"{str(path)!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}): "
                f"{fix}, or --skip-tokenizer-init to send token ids"
            ) from exc
        raise
    _quiet_length_warning(tokenizer)
    return tokenizer


def _quiet_length_warning(tokenizer: Any) -> None:
    """transformers warns, once, past --log-level and the log format, that a prompt longer
    than `model_max_length` "will result in indexing errors": the server checks lengths
    against its context itself (a 400 naming it), so the warning only misleads. Marked as
    given (transformers' own once-only flag; a tokenizer without it is left as is)."""
    given = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(given, dict):
        given["sequence-length-is-longer-than-the-specified-maximum"] = True


def _warn_if_tokenizer_outgrows(tokenizer: Any, vocab_size: int) -> None:
    """A tokenizer with ids past the model's vocabulary (a --tokenizer-path of another
    model): each prompt holding one is refused; say so once at start-up."""
    if tokenizer is not None and len(tokenizer) > vocab_size:
        logger.warning(
            "the tokenizer has %d tokens, the model's vocabulary %d: a prompt that encodes "
            "to an id past it is refused (does --tokenizer-path match the model?)",
            len(tokenizer), vocab_size,
        )  # fmt: skip


def load_tokenizer_in_child() -> Any:
    """`load_tokenizer()` run in a forked child, the tokenizer returned pickled.

    AutoTokenizer picks the class through transformers' config machinery, which imports
    torch.distributed.tensor and sympy: ~55 MiB of RSS a process keeps for its life.
    Unpickling the result needs only the tokenization modules. The scheduler calls this
    before it starts threads (OpenMP, zmq), so the fork copies a single-threaded process.
    """
    if not hasattr(os, "fork"):
        return load_tokenizer()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _send_from_child(write_fd, load_tokenizer)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not payload:
        raise RuntimeError(f"the tokenizer-loading child exited with status {status}")
    ok, value = pickle.loads(payload)
    if not ok:
        raise value
    return value


def _send_from_child(write_fd: int, fn: Any) -> None:
    """Pickle (True, fn()) or (False, the exception) to write_fd, then exit the child."""
    try:
        try:
            payload = pickle.dumps((True, fn()))
        except Exception as exc:  # shown to the parent as its own error
            try:
                payload = pickle.dumps((False, exc))
            except Exception:  # an exception that does not pickle
                payload = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(0)


def _tokenizer_from(tokenizer_pickle: bytes | None) -> Any:
    """The scheduler's tokenizer when it sent one (the launcher does not import torch,
    which AutoTokenizer would); else load it here."""
    if tokenizer_pickle is None:
        return load_tokenizer()
    return pickle.loads(tokenizer_pickle)


@dataclass
class ReqState:
    """A request's accumulated output, filled by the receive loop."""

    obj: GenerateReqInput
    prompt_tokens: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished_reason: dict[str, Any] | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int | None = None  # decode rounds, when speculative decoding is on
    queue_time_s: float | None = None
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[Any] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[Any] = field(default_factory=list)
    error: str | None = None
    embedding: list[float] | None = None  # embedding requests: the pooled vector
    reported: ReportedLogprobs | None = None  # with return_logprob, made on first output
    scheduler_done: bool = False  # the scheduler sent its finish: no more outputs come
    abandoned_at: float | None = None  # the caller left before that finish (monotonic s)
    created_s: float = field(default_factory=time.monotonic)  # arrival here (monotonic s)


@dataclass
class PendingRequest:
    """A request accepted but not yet at the scheduler, and whether it was aborted."""

    parent_rid: str | None
    abort_message: str | None = None


@dataclass
class ReportedLogprobs:
    """A request's logprob lists as the API reports them, (logprob, token id, text)
    triples, each entry converted once as it arrives: every chunk of a stream (and every
    output of a fanned-out choice) carries the whole lists, and converting them afresh
    each time cost O(tokens^2) token decodes (480 tokens with top 5: 0.8 s of launcher
    CPU per request)."""

    output_tokens: list[tuple] = field(default_factory=list)
    output_tops: list[list[tuple]] = field(default_factory=list)
    input_tokens: list[tuple] = field(default_factory=list)
    input_tops: list[list[tuple] | None] = field(default_factory=list)
    output_ids: list[list[tuple]] = field(default_factory=list)  # token_ids_logprob's
    input_ids: list[list[tuple] | None] = field(default_factory=list)


class TokenizerManager(TokenizerEmbeddingMixin):
    def __init__(self, server_args: Any, port_args: Any, ready_info: dict[str, Any] | None = None):
        from sglang.srt.runtime_context import publish

        publish(server_args, role="tokenizer")
        self.server_args = server_args
        self.port_args = port_args
        self._init_config(ready_info or {})
        self._init_ipc()
        self._init_request_state()
        self._control_waiters: dict[type, deque[_ReplyCollector]] = {}
        self._config_updates: dict[str, Any] = {}
        self._dead_message: str | None = None
        self._handle_loop_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_output_at: float | None = None
        self._max_token_chars: int | None = None  # the vocabulary's longest token string
        self._token_texts: dict[int, str] = {}  # token id -> its decoded text (logprobs)
        # Set by the launcher: the scheduler's shared forward clock (None: unknown).
        self.forward_clock: ForwardClock | None = None

    def _init_config(self, ready_info: dict[str, Any]) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.runtime_context import get_model, get_serving

        self.model_config = ModelConfig.from_server_args()
        ready_info = dict(ready_info)
        self.tokenizer = _tokenizer_from(ready_info.pop("tokenizer_pickle", None))
        _warn_if_tokenizer_outgrows(self.tokenizer, self.model_config.vocab_size)
        self.model_path = get_model().model_path
        self.served_model_name = get_serving().served_model_name or self.model_path
        # detokenizer_mode inline: the schedulers' token ids come here, no process between
        self.detokenizer = (
            BatchDetokenizer(self.tokenizer) if get_serving().detokenizer_mode == "inline" else None
        )
        self.context_len = int(ready_info.get("context_len", self.model_config.context_len))
        self.max_req_input_len = int(ready_info.get("max_req_input_len", self.context_len - 1))
        self._end_token_ids: dict[str, int | None] = {}  # reasoning parser -> end token
        self.ready_info = dict(ready_info)
        from sglang.srt.runtime_context import get_observability

        self.log_requests = bool(get_observability().log_requests)
        self.allow_auto_truncate = bool(get_serving().allow_auto_truncate)
        self.max_queued_requests = get_schedule().max_queued_requests
        self.sampling_defaults = _model_sampling_defaults(
            self.model_config, get_serving().sampling_defaults
        )
        self._base_config = dict(self.server_args.resolved_dict())
        # what --sampling-defaults resolved to: the values unset fields take (readback)
        self._base_config["default_sampling_params"] = dict(self.sampling_defaults)
        # every DP rank answers a control request (the controller sends it to all)
        self.num_dp_ranks = int(self._base_config.get("dp_size", 1))

    def _init_request_state(self) -> None:
        self.rid_to_state: dict[str, ReqState] = {}
        self._parent_rids: Counter[str] = Counter()  # parent rid -> its samples in flight
        self._idle = asyncio.Event()  # set while rid_to_state is empty
        self._idle.set()
        self._admitting = asyncio.Event()  # cleared while a weight update runs
        self._admitting.set()
        self._updates_running = 0
        self._pending_rids: dict[str, PendingRequest] = {}  # accepted, not yet registered

    def _init_ipc(self) -> None:
        self._sync_ctx = zmq.Context(1)
        self.recv_from_detokenizer = AsyncPullEndpoint(
            self._sync_ctx, self.port_args.tokenizer_ipc_name
        )
        self.send_to_scheduler = PushEndpoint(
            self._sync_ctx, self.port_args.scheduler_input_ipc_name
        )

    # ------------------------------------------------------------------ config state

    def record_config_updates(self, source: str, **kw: Any) -> None:
        logger.info("config update from %s: %s", source, kw)
        self._config_updates.update(kw)

    def config_value(self, name: str) -> Any:
        if name in self._config_updates:
            return self._config_updates[name]
        return self._base_config[name]

    def resolved_config_dict(self) -> dict[str, Any]:
        return {**self._base_config, **self._config_updates}

    # ------------------------------------------------------------------ liveness

    def is_alive(self) -> bool:
        return self._dead_message is None

    def on_child_death(self, message: str) -> None:
        """Fail every in-flight request; thread-safe (the watchdog calls it)."""
        self._dead_message = message
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fail_all, message)

    def fail_in_flight(self, message: str) -> None:
        """Fail every request still waiting here (the server is shutting down), and
        abort them in the scheduler; on the event loop."""
        for rid, state in list(self.rid_to_state.items()):
            if state.abandoned_at is None and state.finished_reason is None:
                state.error = message
                state.event.set()
                self.abort_request(rid, message)

    def _fail_all(self, message: str) -> None:
        for state in self.rid_to_state.values():
            state.error = message
            state.event.set()
        for waiters in self._control_waiters.values():
            while waiters:
                fut = waiters.popleft().future
                if not fut.done():
                    fut.set_exception(ServerUnavailableError(message))

    def _check_alive(self) -> None:
        if self._dead_message is not None:
            raise ServerUnavailableError(self._dead_message)

    # ------------------------------------------------------------------ generate

    def check_request_size(self, num_prompts: int, n: int, prompt_param: str) -> None:
        """A 400 for a request of `num_prompts` x `n` generations that no retry can
        fit: more than every DP rank's running slots and queue (--max-queued-requests)
        hold at once. A full queue would answer each of its generations 429, retry
        later, for ever. Names `prompt_param` for a prompt list, else n."""
        max_queued = self.max_queued_requests
        max_running = self.ready_info.get("max_running_requests")
        if max_queued is None or max_running is None:
            return
        capacity = self.num_dp_ranks * (int(max_running) + max_queued)
        if num_prompts * n <= capacity:
            return
        param = prompt_param if num_prompts > 1 else "n"
        raise InvalidParamError(
            f"{param}: this request's {num_prompts * n} generations ({num_prompts} prompts x "
            f"n={n}) are more than the server holds at once ({capacity}: "
            f"max_running_requests + max_queued_requests per DP rank); send fewer "
            f"{'prompts' if num_prompts > 1 else 'samples'} per request",
            param,
        )

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """One request; yields cumulative dicts, the last with finish_reason set."""
        self._check_alive()
        self.check_serves_generation()
        self._ensure_handle_loop()
        tokenized, state = await self._admit(obj, self._tokenize_off_loop)
        self._charge_logprobs(obj, tokenized)
        if state.finished_reason is not None:  # aborted before it reached the scheduler
            if self.log_requests:
                self._log_finished(state)
            yield self._make_output(state)
            return
        self._register(state)
        try:
            self.send_to_scheduler.send(tokenized)
            async for out in self._wait_outputs(state):
                yield out
        finally:
            self._release(state)

    def _charge_logprobs(
        self, obj: GenerateReqInput, tokenized: TokenizedGenerateReqInput
    ) -> None:
        """Take this choice's logprob entries from its request's budget (shared by the
        request's choices); a 400 naming the fields past MAX_LOGPROB_ENTRIES_PER_REQUEST.
        Counted as asked (every position to max_new_tokens), before anything runs."""
        if not obj.return_logprob:
            return
        per_position = 1 + obj.top_logprobs_num + len(obj.token_ids_logprob or ())
        input_len = len(tokenized.input_ids)
        start = tokenized.logprob_start_len
        max_new = tokenized.sampling_params.max_new_tokens
        positions = (input_len - start if start >= 0 else 0) + (
            max_new if max_new is not None else self.context_len - input_len
        )
        budget = obj.logprob_budget or LogprobBudget()
        budget.left -= positions * per_position
        if budget.left < 0:
            raise InvalidParamError(
                "return_logprob: this request asks for more than "
                f"{MAX_LOGPROB_ENTRIES_PER_REQUEST:,} logprob entries (positions x (1 + "
                "top_logprobs_num + token ids in token_ids_logprob), over all its choices; "
                f"this choice alone {positions:,} x {per_position}): ask for fewer "
                "alternatives or choices, or start the input logprobs later",
                "return_logprob",
            )

    async def _admit(
        self,
        obj: GenerateReqInput | EmbeddingReqInput,
        tokenize: Callable[[Any], Awaitable[Any]],
    ) -> tuple[Any, ReqState]:
        """`obj` tokenized and past any weight update, with its state; the state is
        finished (aborted) when an abort reached it meanwhile, before the scheduler."""
        with self._pending(obj) as pending:
            tokenized = await tokenize(obj)
            await self._wait_for_weight_update()
        # a child died (or the Engine shut down) while it was tokenized off the loop:
        # _fail_all did not reach it, and registered now it would wait for ever
        self._check_alive()
        state = ReqState(obj=obj, prompt_tokens=len(tokenized.input_ids))
        if pending.abort_message is not None:
            state.finished_reason = aborted_reason(pending.abort_message)
        return tokenized, state

    @contextlib.contextmanager
    def _pending(self, obj: GenerateReqInput | EmbeddingReqInput) -> Iterator[PendingRequest]:
        """`obj` accepted but not yet registered (tokenized off the loop, or waiting out a
        weight update): abort_request and abort_all reach it through here (they missed
        it: a request aborted while a weight update ran then ran to its end)."""
        if obj.rid in self._pending_rids:
            raise InvalidParamError(f"duplicate request id {obj.rid!r}", "rid")
        pending = self._pending_rids[obj.rid] = PendingRequest(obj.parent_rid)
        try:
            yield pending
        finally:
            del self._pending_rids[obj.rid]

    async def _wait_for_weight_update(self) -> None:
        """A request that comes during a weight update waits for it to end (SGLang's
        model update lock), then runs on the new weights."""
        if not self._admitting.is_set():
            await self._admitting.wait()
            self._check_alive()

    def _register(self, state: ReqState) -> None:
        """Track `state` under its rid; a ValueError if the rid is taken: by a request in
        flight, as the parent of one's samples, or (for a sample) its parent by a plain
        request, since abort_request(parent) would reach both."""
        rid, parent = state.obj.rid, state.obj.parent_rid
        self._drop_stale_abandoned(rid)
        if rid in self.rid_to_state or rid in self._parent_rids:
            held = self.rid_to_state.get(rid)
            if held is not None and held.abandoned_at is not None:
                raise InvalidParamError(
                    f"duplicate request id {rid!r}: the request that had it is still "
                    "being aborted; retry in a moment",
                    "rid",
                )
            raise InvalidParamError(f"duplicate request id {rid!r}", "rid")
        if parent is not None and parent in self.rid_to_state:  # siblings share the parent
            raise InvalidParamError(f"duplicate request id {parent!r}", "rid")
        self.rid_to_state[rid] = state
        self._idle.clear()
        if parent is not None:
            self._parent_rids[parent] += 1

    def _release(self, state: ReqState) -> None:
        """The caller stopped waiting for `state` (finished, failed or gone). While the
        scheduler may still send outputs for it, the request is aborted and its rid
        held until the scheduler's finish arrives: a retry under the same rid must not
        be answered with this request's outputs."""
        if self.rid_to_state.get(state.obj.rid) is not state:
            return
        if state.scheduler_done or self._dead_message is not None:
            self._unregister(state)
            return
        if state.finished_reason is None:  # an error that finished it here sent its abort
            self.abort_request(state.obj.rid)
            if self.log_requests:  # its caller left: logged with what it had
                self._log_finished(state, "caller left; aborted")
        state.abandoned_at = time.monotonic()

    def _drop_stale_abandoned(self, rid: str) -> None:
        held = self.rid_to_state.get(rid)
        if held is not None and held.abandoned_at is not None:
            if time.monotonic() - held.abandoned_at > ABANDONED_RID_HOLD_S:
                logger.warning("request %s: no finish came for its abort; rid released", rid)
                self._unregister(held)

    def _unregister(self, state: ReqState) -> bool:
        """Stop tracking `state`; whether it was tracked until now."""
        if self.rid_to_state.get(state.obj.rid) is not state:
            return False
        del self.rid_to_state[state.obj.rid]
        if not self.rid_to_state:
            self._idle.set()
        parent = state.obj.parent_rid
        if parent is not None:
            self._parent_rids[parent] -= 1
            if not self._parent_rids[parent]:
                del self._parent_rids[parent]
        return True

    async def _wait_outputs(self, state: ReqState) -> AsyncIterator[dict[str, Any]]:
        # No polling: on_child_death wakes every waiting request (see _fail_all),
        # and periodic wake-ups of many requests would steal CPU from the scheduler.
        while True:
            await state.event.wait()
            state.event.clear()
            ended = state.finished_reason is not None or state.error is not None
            if ended and self.log_requests:  # refused or failed ones too (a 429, a 500)
                self._log_finished(state, state.error)
            raise_if_failed(state.error, state.finished_reason)
            if state.finished_reason is not None:
                yield self._make_output(state)
                return
            if state.obj.stream:
                yield self._make_output(state)

    def _log_finished(self, state: ReqState, finish: Any = None) -> None:
        obj = state.obj
        if is_health_probe(obj.rid):  # the server's own probe (/health_generate), no request
            return
        prompt = obj.text if obj.text is not None else obj.input_ids
        logger.info(
            "request %s: prompt=%.200r output=%.200r prompt_tokens=%d "
            "completion_tokens=%d finish=%s",
            obj.rid,
            prompt,
            state.text,
            state.prompt_tokens,
            state.completion_tokens,
            finish if finish is not None else state.finished_reason,
        )

    async def _tokenize_off_loop(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        """A long text is tokenized in a worker thread (the tokenizer releases the GIL),
        so a huge prompt does not stall every other request and /health meanwhile."""
        if isinstance(obj.text, str) and len(obj.text) > INLINE_TOKENIZE_CHARS:
            return await asyncio.to_thread(self._tokenize, obj)
        return self._tokenize(obj)

    def _tokenize(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        check_request_fields(obj, self.model_config.vocab_size)
        input_ids = self._input_ids(obj)
        given = _with_defaults(obj.sampling_params, self.sampling_defaults)
        params = _sampling_params(given, self.model_config.vocab_size)
        if params.n != 1:
            raise ValueError("n > 1 must be expanded into n requests by the caller")
        params.normalize(self.tokenizer)
        if obj.return_text_in_logprobs and self.tokenizer is None:
            raise InvalidParamError(
                "return_text_in_logprobs needs a tokenizer (the server runs with "
                "--skip-tokenizer-init)",
                "return_text_in_logprobs",
            )
        if params.stop_strs and self.tokenizer is None:  # matched on decoded text
            raise InvalidParamError(
                "stop strings need a tokenizer (the server runs with --skip-tokenizer-init): "
                "use stop_token_ids",
                "sampling_params.stop",
            )
        # With auto-truncate (the prompt is already cut, _input_ids) max_new_tokens is cut
        # to the room the context leaves; so is the default (128) when the caller set
        # none, as in SGLang: only a max_new_tokens the caller set is refused for not fitting
        caller_set_max = "max_new_tokens" in (obj.sampling_params or {})
        if not caller_set_max and obj.default_max_new_tokens is not None:
            params.max_new_tokens = obj.default_max_new_tokens
        if self.allow_auto_truncate or not caller_set_max:
            params.max_new_tokens = self._room_for_output(
                len(input_ids), params.max_new_tokens, warn=self.allow_auto_truncate
            )
            if params.max_new_tokens is not None:
                params.min_new_tokens = min(params.min_new_tokens, params.max_new_tokens)
        prompt_param = "input_ids" if obj.input_ids is not None else "text"
        if obj.return_logprob and obj.logprob_start_len >= len(input_ids):  # as SGLang
            raise InvalidParamError(
                f"logprob_start_len ({obj.logprob_start_len}) must be below the number of "
                f"input tokens ({len(input_ids)}); -1 asks for no input logprobs",
                "logprob_start_len",
            )
        self._check_length(len(input_ids), params.max_new_tokens, prompt_param)
        self._check_min_fits(len(input_ids), params)
        self._fit_kv_pool(len(input_ids), params)
        return TokenizedGenerateReqInput(
            rid=obj.rid,
            input_text=obj.text,
            input_ids=input_ids,
            sampling_params=params,
            return_logprob=obj.return_logprob,
            top_logprobs_num=obj.top_logprobs_num,
            token_ids_logprob=list(obj.token_ids_logprob or ()),
            logprob_start_len=obj.logprob_start_len,
            stream=obj.stream,
            parent_rid=obj.parent_rid,
            reasoning_end_token_id=self._required_reasoning_end() if obj.require_reasoning else None,
        )

    def reasoning_end_token_id(self, parser: str | None) -> int | None:
        """The token that ends `parser`'s think block, None when its end tag is not one
        token of the tokenizer (or there is no parser)."""
        if parser is None or self.tokenizer is None:
            return None
        if parser not in self._end_token_ids:  # a chat request asks each time
            tag = reasoning_format(parser).end_tag
            ids = self.tokenizer.encode(tag, add_special_tokens=False)
            self._end_token_ids[parser] = ids[0] if len(ids) == 1 else None
        return self._end_token_ids[parser]

    def _required_reasoning_end(self) -> int:
        """require_reasoning's end token; InvalidParamError when there is none."""
        parser = self.config_value("reasoning_parser")
        token_id = self.reasoning_end_token_id(parser)
        if token_id is None:
            why = (
                "needs a reasoning parser (--reasoning-parser; Engine(reasoning_parser=...))"
                if parser is None
                else f"needs {reasoning_format(parser).end_tag!r} to be one token of the tokenizer"
            )
            raise InvalidParamError(f"require_reasoning {why}", "require_reasoning")
        return token_id

    def _input_ids(self, obj: GenerateReqInput) -> list[int]:
        """The prompt's token ids, checked; cut to what fits with --allow-auto-truncate."""
        if obj.input_ids is not None:
            ids = list(obj.input_ids)
            param = "input_ids"
        elif obj.text is not None:
            if self.tokenizer is None:
                raise InvalidParamError(
                    "text prompts need a tokenizer (the server runs with "
                    "--skip-tokenizer-init): send input_ids",
                    "text",
                )
            ids = list(self.tokenizer.encode(self.text_to_encode(obj.text, "text")))
            param = "text"
        else:
            raise InvalidParamError("either text or input_ids must be given", "text")
        if not ids:
            raise InvalidParamError("the prompt is empty", param)
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            if param == "text":  # the tokenizer's, past the model's (a --tokenizer-path)
                bad = sorted({t for t in ids if t >= vocab})
                raise InvalidParamError(
                    f"the tokenizer encodes this text to token ids the model does not have "
                    f"({', '.join(map(str, bad[:5]))}; the model's vocabulary is [0, "
                    f"{vocab})): the tokenizer does not match the model",
                    "text",
                )
            raise InvalidParamError(f"input_ids must be token ids in [0, {vocab})", "input_ids")
        return self.truncate_prompt(ids, obj.rid) if self.allow_auto_truncate else ids

    def text_to_encode(self, text: str, param: str) -> str:
        """`text`, or with --allow-auto-truncate its head that holds more tokens than the
        context (cut by characters before tokenizing, so a huge text costs no more than
        that); without the flag a text that cannot fit is refused (check_text_can_fit)."""
        if not self.allow_auto_truncate:
            self.check_text_can_fit(text, param)
            return text
        return text[: 2 * self._max_fitting_chars()]

    def _max_fitting_chars(self) -> int:
        if self._max_token_chars is None:
            vocab = self.tokenizer.get_vocab()
            self._max_token_chars = max((len(t) for t in vocab), default=1)
        return self.context_len * self._max_token_chars

    def truncate_prompt(self, input_ids: list[int], rid: Any) -> list[int]:
        """The prompt's first tokens that fit the context and the KV pool (all of it if
        it fits): --allow-auto-truncate."""
        limit = min(self.context_len - 1, self.max_req_input_len)
        if len(input_ids) <= limit:
            return input_ids
        logger.warning("request %s: the input (%d tokens) is longer than the context (%d "
                       "tokens) and the KV pool allow; truncated to its first %d tokens", rid,
                       len(input_ids), self.context_len, limit)  # fmt: skip
        return input_ids[:limit]

    def _room_for_output(
        self, input_len: int, max_new_tokens: int | None, warn: bool = True
    ) -> int | None:
        """max_new_tokens, cut to what the context leaves after `input_len` tokens (a
        warning each cut when `warn`)."""
        room = self.context_len - input_len
        if max_new_tokens is None or max_new_tokens <= room:
            return max_new_tokens
        if warn:
            logger.warning("max_new_tokens %d cut to %d: the context holds %d tokens and "
                           "the input %d", max_new_tokens, room, self.context_len,
                           input_len)  # fmt: skip
        return room

    def _fit_kv_pool(self, input_len: int, params: SamplingParams) -> None:
        """A KV pool smaller than the context (--max-total-tokens) cannot hold a
        request past its size: max_new_tokens (and min_new_tokens) are cut to what
        it leaves after the prompt, as SGLang does, so such a request finishes with
        `length` instead of being aborted once it filled the whole pool."""
        max_seq_len = self.max_req_input_len + 1  # min(context, pool) tokens
        if max_seq_len >= self.context_len:
            return  # the context check above already bounds every request
        room = max_seq_len - input_len
        if params.max_new_tokens is None or params.max_new_tokens > room:
            params.max_new_tokens = room
            params.min_new_tokens = min(params.min_new_tokens, room)

    def check_text_can_fit(self, text: str, param: str) -> None:
        """Refuse, without tokenizing it, a text too long for the context even if every
        token were the vocabulary's longest (a token never decodes to more characters
        than its vocabulary string has)."""
        limit = self._max_fitting_chars()
        if len(text) > limit:
            raise InvalidParamError(
                f"The input ({len(text)} characters) is longer than the model's context "
                f"length ({self.context_len} tokens) can hold (at most {limit} characters).",
                param,
            )

    def _check_length(
        self, input_len: int, max_new_tokens: int | None, prompt_param: str = "input_ids"
    ) -> None:
        """The prompt (the request's field `prompt_param`) must fit the context and the
        KV pool; prompt + max_new_tokens must fit the context. The message names the
        limit that was hit."""
        if input_len >= self.context_len:
            raise InvalidParamError(
                f"The input ({input_len} tokens) is longer than the model's context length "
                f"({self.context_len} tokens; at most {self.context_len - 1} in the prompt).",
                prompt_param,
            )
        if input_len > self.max_req_input_len:
            raise InvalidParamError(
                f"The input ({input_len} tokens) is longer than the KV cache can hold "
                f"({self.max_req_input_len} tokens; raise --max-total-tokens or "
                f"--mem-fraction-static).",
                prompt_param,
            )
        if max_new_tokens is not None and input_len + max_new_tokens > self.context_len:
            raise InvalidParamError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens: {input_len} in the input plus "
                f"{max_new_tokens} max_new_tokens.",
                "sampling_params.max_new_tokens",
            )

    def _check_min_fits(self, input_len: int, params: SamplingParams) -> None:
        """max_new_tokens null runs to the context's end: a min_new_tokens past it could
        never be met (it ended at the context with `length`, the minimum unmet). A set
        max_new_tokens bounds it already (SamplingParams.verify)."""
        room = self.context_len - input_len
        if params.max_new_tokens is None and params.min_new_tokens > room:
            raise InvalidParamError(
                f"min_new_tokens ({params.min_new_tokens}) is more than the context leaves "
                f"for output ({room} of {self.context_len} tokens after {input_len} in the "
                "input)",
                "sampling_params.min_new_tokens",
            )

    def abort_own_request(self, obj: GenerateReqInput) -> None:
        """Abort `obj`'s request if `obj` is what runs under its rid: a request refused as
        a duplicate (or not registered yet) must not abort the one holding that rid."""
        state = self.rid_to_state.get(obj.rid)
        if state is not None and state.obj is obj:
            self.abort_request(obj.rid)

    def abort_request(
        self, rid: str, message: str = "Aborted by request.", *, with_samples: bool = False
    ) -> bool:
        """Abort `rid` and, with_samples (a client's abort), the samples `<rid>-<k>` it
        was fanned out into (n > 1); returns whether any of them is in flight here.
        An abort for `rid` itself is sent even when it is not (a request that just
        left rid_to_state)."""
        fanned = [r for r, state in self.rid_to_state.items()
                  if with_samples and state.obj.parent_rid == rid]  # fmt: skip
        # a request whose caller left is being aborted already: not "in flight" to report
        found = any(
            self.rid_to_state[r].abandoned_at is None for r in [rid, *fanned]
            if r in self.rid_to_state
        )  # fmt: skip
        for r, pending in self._pending_rids.items():  # not yet at the scheduler
            if r == rid or (with_samples and pending.parent_rid == rid):
                pending.abort_message, found = message, True
        if self._dead_message is None:
            for r in [rid, *fanned]:
                self.send_to_scheduler.send(AbortReq(rid=r, message=message))
        return found

    def abort_all(self, message: str = "Aborted by request.") -> int:
        """Abort every request in flight (SGLang's abort_all), those not yet at the
        scheduler too; how many were (those whose caller already left are being aborted
        and not counted). The server's own health probes are no client's: left alone (a
        probe aborted under it made /health_generate report a healthy server down)."""
        rids = [rid for rid in self.rid_to_state if not is_health_probe(rid)]
        live = [rid for rid in rids if self.rid_to_state[rid].abandoned_at is None]
        pending = [rid for rid in self._pending_rids if not is_health_probe(rid)]
        for rid in rids + pending:
            self.abort_request(rid, message)
        return len(live) + len(pending)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight here, at most `timeout_s`; whether none is."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return not self.rid_to_state

    # ------------------------------------------------------------------ outputs

    def _make_output(self, state: ReqState) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": state.obj.rid,
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
            "finish_reason": state.finished_reason,
        }
        if state.queue_time_s is not None:
            meta["queue_time"] = state.queue_time_s
        if state.finished_reason is not None:  # SGLang's: seconds from arrival to the end
            meta["e2e_latency"] = time.monotonic() - state.created_s
        if state.spec_verify_ct is not None:
            meta["spec_verify_ct"] = state.spec_verify_ct
        if state.obj.return_logprob:
            self._add_logprob_meta(state, meta)
        return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}

    def _add_logprob_meta(self, state: ReqState, meta: dict[str, Any]) -> None:
        """The logprob lists so far (copies: a consumer may keep an earlier output)."""
        with_text = state.obj.return_text_in_logprobs and self.tokenizer is not None
        shown = state.reported = state.reported or ReportedLogprobs()
        one = functools.partial(self._triple, with_text=with_text)
        many = functools.partial(self._triples, with_text=with_text)
        meta["output_token_logprobs"] = _caught_up(
            shown.output_tokens, state.output_token_logprobs, one
        )
        meta["output_top_logprobs"] = _caught_up(shown.output_tops, state.output_top_logprobs, many)
        meta["input_token_logprobs"] = _caught_up(shown.input_tokens, state.input_token_logprobs, one)
        meta["input_top_logprobs"] = _caught_up(
            shown.input_tops, state.input_top_logprobs, lambda top: many(top) if top else None
        )
        if state.obj.token_ids_logprob:  # SGLang's keys, there only when asked
            meta["output_token_ids_logprobs"] = _caught_up(
                shown.output_ids, state.output_token_ids_logprobs, many
            )
            meta["input_token_ids_logprobs"] = _caught_up(
                shown.input_ids, state.input_token_ids_logprobs, lambda ids: many(ids) if ids else None
            )

    def _triple(self, pair: tuple[Any, int], with_text: bool) -> tuple:
        """(logprob, token id) -> (reported logprob, token id, its text or None)."""
        logprob, token_id = pair
        return (_reportable(logprob), token_id, self._token_text(token_id) if with_text else None)

    def _triples(self, pairs: list[tuple[Any, int]], with_text: bool) -> list[tuple]:
        return [self._triple(pair, with_text) for pair in pairs]

    def _token_text(self, token_id: int) -> str:
        """One token's text, decoded once per token id (logprob lists repeat the same
        few thousand ids)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = token_piece_text(self.tokenizer, token_id)
        return text

    # ------------------------------------------------------------------ receive loop

    def _ensure_handle_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._handle_loop_task is None or self._handle_loop_task.done():
            self._loop = loop
            self._handle_loop_task = loop.create_task(self._handle_loop())

    def scheduler_busy_for_s(self) -> float | None:
        """Seconds the scheduler's current forward has run; None between forwards."""
        return None if self.forward_clock is None else self.forward_clock.busy_for_s()

    def updating_weights(self) -> bool:
        return self._updates_running > 0

    def stalled_ranks(self, limit_s: float) -> list[int]:
        """Local DP ranks whose scheduler neither stepped nor ran a forward for `limit_s`."""
        return [] if self.forward_clock is None else self.forward_clock.stalled_ranks(limit_s)

    def seconds_since_output(self) -> float:
        """Seconds since the runtime last sent anything (inf before the first message)."""
        if self._last_output_at is None:
            return float("inf")
        return time.monotonic() - self._last_output_at

    async def _handle_loop(self) -> None:
        while True:
            try:
                msg = await self.recv_from_detokenizer.recv()
                self._last_output_at = time.monotonic()
                if isinstance(msg, BatchTokenIDOutput) and self.detokenizer is not None:
                    self._handle_batch_output(self.detokenizer.handle(msg))
                elif isinstance(msg, BatchStrOutput):
                    self._handle_batch_output(msg)
                elif isinstance(msg, TokenizerHandoff):
                    pass  # for a detokenizer process; this one came with the ready info
                else:
                    self._resolve_control(msg)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad message must not stop every request's outputs
                logger.exception("TokenizerManager: handling a runtime message failed")

    def _handle_batch_output(self, msg: BatchStrOutput) -> None:
        for i, rid in enumerate(msg.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue
            reason = msg.finished_reasons[i]
            if reason is not None and reason.get("origin") != "detokenizer":
                state.scheduler_done = True
                if state.abandoned_at is not None:  # its caller left: the rid is free now
                    self._unregister(state)
                    continue
            if state.abandoned_at is not None or state.finished_reason is not None:
                # Already finished here (a detokenizer or absorb error): what follows
                # is the scheduler's answer to our abort, which must not replace it.
                continue
            try:
                self._absorb_output(state, msg, i)
            except Exception as exc:  # this request's output is unusable: it fails alone
                logger.exception("request %s: absorbing its output failed", rid)
                state.finished_reason = internal_error_reason(exc)
                self.abort_request(rid)
            state.event.set()

    def _absorb_output(self, state: ReqState, msg: BatchStrOutput, i: int) -> None:
        state.text += msg.new_texts[i]
        state.output_ids.extend(msg.new_output_ids[i])
        state.completion_tokens = msg.completion_tokens[i]
        state.cached_tokens = msg.cached_tokens[i]
        state.queue_time_s = msg.queue_times[i]
        if msg.spec_verify_ct is not None:
            state.spec_verify_ct = msg.spec_verify_ct[i]
        if msg.output_token_logprobs is not None:
            self._absorb_logprobs(state, msg, i)
        if msg.embeddings is not None:
            state.embedding = msg.embeddings[i]
        state.finished_reason = reason = msg.finished_reasons[i]
        if reason is not None and reason.get("origin") == "detokenizer":
            self.abort_request(msg.rids[i])  # the scheduler still runs it

    @staticmethod
    def _absorb_logprobs(state: ReqState, msg: BatchStrOutput, i: int) -> None:
        for name in LOGPROB_FIELDS:
            getattr(state, name).extend(getattr(msg, name)[i])

    def _resolve_control(self, msg: Any) -> None:
        """A reply goes to the oldest waiter of its type that lacks its DP rank's: each
        rank answers in order, so that is the request this reply answers."""
        waiters = self._control_waiters.get(type(msg), deque())
        collector = next((w for w in waiters if msg.dp_rank not in w.replies), None)
        if collector is None:
            logger.warning("unexpected control reply %s", type(msg).__name__)
            return
        collector.replies[msg.dp_rank] = msg
        if len(collector.replies) == collector.num_replies:
            waiters.remove(collector)
            if not collector.future.done():
                collector.future.set_result(
                    [collector.replies[r] for r in sorted(collector.replies)]
                )

    async def _control(self, request: Any, reply_type: type) -> list[Any]:
        """Send a control request; the replies of every DP rank, by rank."""
        self._check_alive()
        self._ensure_handle_loop()
        collector = _ReplyCollector(asyncio.get_running_loop().create_future(), self.num_dp_ranks)
        self._control_waiters.setdefault(reply_type, deque()).append(collector)
        self.send_to_scheduler.send(request)
        return await collector.future

    # ------------------------------------------------------------------ control API

    async def flush_cache(self) -> bool:
        return not (await self.flush_cache_ranks())[1]

    async def flush_cache_ranks(self) -> tuple[list[int], list[int]]:
        """(DP ranks whose cache was flushed, ranks that refused: requests running there).
        Each rank decides alone, as in SGLang: a busy rank does not stop an idle one."""
        outs = await self._control(FlushCacheReqInput(), FlushCacheReqOutput)
        ranks = [(out.dp_rank or 0, out.success) for out in outs]
        return sorted(r for r, ok in ranks if ok), sorted(r for r, ok in ranks if not ok)

    async def get_internal_state(self) -> list[dict[str, Any]]:
        """One state per DP rank, in rank order."""
        outs = await self._control(GetInternalStateReq(), GetInternalStateReqOutput)
        return [out.internal_state for out in outs]

    async def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, abort_all_requests: bool = False
    ) -> tuple[bool, str]:
        """Load new weights on every rank; refused while requests are in flight, unless
        `abort_all_requests` (SGLang's field): then they are aborted first. Requests that
        come meanwhile wait for the update (else steady traffic never lets it start)."""
        self._updates_running += 1
        self._admitting.clear()
        try:
            return await self._update_weights(model_path, load_format, abort_all_requests)
        finally:
            self._updates_running -= 1
            if not self._updates_running:
                self._admitting.set()

    async def _update_weights(
        self, model_path: str, load_format: str | None, abort_all_requests: bool
    ) -> tuple[bool, str]:
        if abort_all_requests and self.rid_to_state:
            count = self.abort_all("Aborted for a weight update.")
            logger.info("weight update: aborted %d request(s) in flight", count)
            await self.wait_idle(UPDATE_DRAIN_TIMEOUT_S)
        if self.rid_to_state:  # every rank's requests pass here: refused before any loads
            return False, UPDATE_BUSY_MESSAGE
        previous = (self.model_path, self.config_value("load_format"))
        req = UpdateWeightFromDiskReqInput(model_path=model_path, load_format=load_format)
        outs = await self._control(req, UpdateWeightFromDiskReqOutput)
        out = _combined_update_reply(outs)
        if not out.success and any(o.success for o in outs):
            return False, await self._roll_back_update(previous, out.message)
        if out.success:
            # the runner loads with "auto" when none is given (not the one before)
            fields = {"model_path": model_path, "load_format": load_format or "auto"}
            self.record_config_updates("update_weights_from_disk", **fields)
            self.model_path = model_path
        return out.success, out.message

    async def _roll_back_update(self, previous: tuple[str, Any], why: str) -> str:
        """Some DP ranks loaded new weights and others refused (one still held a request
        the scheduler had not yet dropped): load the previous weights on every rank, so
        that all serve the same model. The failure message, saying how it ended."""
        path, load_format = previous
        req = UpdateWeightFromDiskReqInput(model_path=path, load_format=load_format)
        outs = await self._control(req, UpdateWeightFromDiskReqOutput)
        if all(o.success for o in outs):
            return f"{why}; every DP rank serves {path} again"
        differ = ", ".join(str(o.dp_rank) for o in outs if not o.success)
        logger.error("weight update rolled back only in part: DP ranks %s kept %s", differ, why)
        return f"{why}; rolling back to {path} failed on DP ranks {differ}: ranks now differ"

    async def aclose(self) -> None:
        """Stop the receive loop and close the sockets (call on the serving loop). A
        request still waiting fails, and nothing is sent on the closed sockets after."""
        if self._dead_message is None:
            self._dead_message = "The server shut down before this request finished."
            self._fail_all(self._dead_message)
        task = self._handle_loop_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.recv_from_detokenizer.close()
        self.send_to_scheduler.close()


@dataclass
class _ReplyCollector:
    """One control request's replies, one per DP rank, gathered into `future`."""

    future: asyncio.Future
    num_replies: int
    replies: dict[int, Any] = field(default_factory=dict)  # dp_rank -> reply


def _combined_update_reply(outs: list[UpdateWeightFromDiskReqOutput]) -> Any:
    """Success only if every DP rank loaded the weights; each failing rank's reason."""
    if len(outs) == 1:
        return outs[0]
    failed = [f"DP rank {o.dp_rank}: {o.message}" for o in outs if not o.success]
    message = "; ".join(failed) if failed else outs[0].message
    return UpdateWeightFromDiskReqOutput(
        not failed, message, outs[0].model_path, outs[0].load_format
    )


# ----------------------------------------------------------------------------
# Request validation shared by the Engine and every HTTP route
# ----------------------------------------------------------------------------


class RequestFieldsSpec(BaseModel):
    """GenerateReqInput's own fields (sampling_params aside), with the rules the
    /generate body declares for them."""

    text: strict(str) | None
    input_ids: list[strict(int)] | None  # the vocabulary range is checked with the ids
    stream: Flag
    return_logprob: Flag
    return_text_in_logprobs: Flag
    rid: RequestId
    top_logprobs_num: TopLogprobsNum
    token_ids_logprob: LogprobTokenIds | None
    logprob_start_len: LogprobStartLen


def check_request_fields(obj: GenerateReqInput, vocab_size: int) -> None:
    """Types and ranges of GenerateReqInput's own fields; top_logprobs_num and
    token_ids_logprob also within the vocabulary."""
    fields = {name: getattr(obj, name) for name in RequestFieldsSpec.model_fields}
    try:
        RequestFieldsSpec.model_validate(fields)
    except ValidationError as exc:
        raise first_error(exc) from None
    top_cap = min(vocab_size, MAX_TOP_LOGPROBS_NUM)
    if obj.top_logprobs_num > top_cap:
        raise InvalidParamError(
            f"top_logprobs_num must be an integer in [0, {top_cap}] (the vocabulary size "
            f"and a cap of {MAX_TOP_LOGPROBS_NUM})",
            "top_logprobs_num",
        )
    _check_token_ids_logprob(obj, vocab_size)


def _check_token_ids_logprob(obj: GenerateReqInput, vocab_size: int) -> None:
    asked = obj.token_ids_logprob
    if not asked:
        return
    if not obj.return_logprob:
        raise InvalidParamError(
            "token_ids_logprob lists logprobs only with return_logprob: true", "token_ids_logprob"
        )
    if max(asked) >= vocab_size:
        raise InvalidParamError(
            f"token_ids_logprob: token id {max(asked)} is outside the vocabulary "
            f"(size {vocab_size})",
            "token_ids_logprob",
        )


def _model_sampling_defaults(model_config: Any, source: str) -> dict[str, Any]:
    """The sampling fields a request leaves unset default to (--sampling-defaults)."""
    defaults = {}
    for name, value in (model_config.sampling_defaults if source == "model" else {}).items():
        try:  # a value the API would refuse must not fail every request that omits it
            _sampling_params({name: value}, model_config.vocab_size)
        except (InvalidParamError, TypeError, ValueError) as exc:
            logger.warning("generation_config.json %s=%r is not used: %s", name, value, exc)
            continue
        defaults[name] = value
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
        logger.info("sampling defaults from the model's generation_config.json: %s "
                    "(--sampling-defaults openai for the API's)", shown)  # fmt: skip
    return defaults


def _with_defaults(given: dict[str, Any] | None, defaults: dict[str, Any]) -> Any:
    """A request's sampling fields over the defaults (a null takes the default too)."""
    if not defaults or not isinstance(given, (dict, type(None))):
        return given  # a malformed value is refused by _sampling_params, as it is
    merged = dict(defaults)
    merged.update((k, v) for k, v in (given or {}).items() if v is not None or k not in defaults)
    return merged


def _sampling_params(params: Any, vocab_size: int) -> SamplingParams:
    """Validated SamplingParams; errors name the field as `sampling_params.<field>`."""
    try:
        out = SamplingParams.from_dict(params)
        out.verify(vocab_size)
    except InvalidParamError as exc:
        param = exc.param or ""
        if not param.startswith("sampling_params"):
            param = f"sampling_params.{param}".rstrip(".")
        raise InvalidParamError(f"sampling_params.{exc}", param) from None
    return out


def _caught_up(shown: list, raw: list, convert: Callable[[Any], Any]) -> list:
    """`shown` extended with the converted entries of `raw` it lacks; a copy of it."""
    shown.extend(convert(entry) for entry in raw[len(shown) :])
    return list(shown)


# A token the step forbade (a grammar mask, the min_new_tokens ban) has logprob -inf,
# which JSON cannot carry: it is reported as this floor, as vLLM does.
LOGPROB_FLOOR = -9999.0


def _reportable(logprob: float | None) -> float | None:
    """`logprob` as the API reports it: None stays None, -inf (or NaN) is the floor."""
    if logprob is None or logprob >= LOGPROB_FLOOR:
        return logprob
    return LOGPROB_FLOOR
