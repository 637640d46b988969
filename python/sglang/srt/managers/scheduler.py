"""The scheduler process: continuous batching over one TpModelWorker.

A step is three verbs: `get_next_batch_to_run()` (a prefill batch if admission
yields one, else the running decode batch), `run_batch()`, and
`process_batch_result()`. The parts live in `scheduler_parts/`:
admission (prefill batches), memory (alloc/release/retract), results
(tokens, stop checks, outputs) and requests (incoming messages).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

from sglang.srt.managers.detokenizer_manager import byte_fallback_ids, silent_token_ids
from sglang.srt.managers.fault_injection import FaultInjector
from sglang.srt.managers.forward_clock import ForwardClock
from sglang.srt.managers.schedule_batch import PrefillBatch, Req, RunningBatch, finish_abort
from sglang.srt.managers.schedule_policy import NewTokenRatio, SchedulePolicy
from sglang.srt.managers.scheduler_parts.admission import SchedulerAdmissionMixin
from sglang.srt.managers.scheduler_parts.embedding import SchedulerEmbeddingMixin
from sglang.srt.managers.scheduler_parts.faults import SchedulerFaultsMixin
from sglang.srt.managers.scheduler_parts.grammar import SchedulerGrammarMixin
from sglang.srt.managers.scheduler_parts.load_report import NullLoadReporter
from sglang.srt.managers.scheduler_parts.memory import SchedulerMemoryMixin
from sglang.srt.managers.scheduler_parts.requests import SchedulerRequestsMixin
from sglang.srt.managers.scheduler_parts.results import SchedulerResultsMixin
from sglang.srt.managers.scheduler_parts.speculative import (
    SchedulerSpeculativeMixin,
    VerifyStep,
)
from sglang.srt.managers.scheduler_parts.tensor_parallel import (
    NullEndpoint,
    TpSync,
    init_tensor_parallel,
)
from sglang.srt.mem_cache.chunk_cache import ChunkCache
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.runtime_context import get_exec, get_memory, get_observability, get_schedule

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 50


class DecodeStep:
    """Marker for "run the running batch one token forward"."""

    def __init__(self, out_cache_loc: torch.Tensor) -> None:
        self.out_cache_loc = out_cache_loc  # int64[bs]


def stop_eos_ids(config_eos_ids: Iterable[int] | None, tokenizer: Any) -> set[int]:
    """The ids that end a generation (unless ignore_eos): the model's (config.json,
    generation_config.json) and the tokenizer's eos_token_id, as SGLang and vLLM stop
    on both (a chat model whose config names <|endoftext|> ends its turns with the
    tokenizer's <|im_end|>). Without a tokenizer (--skip-tokenizer-init), the model's."""
    ids = set(config_eos_ids or ())
    tokenizer_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tokenizer_eos, int):
        ids.add(tokenizer_eos)
    return ids


class Scheduler(
    SchedulerAdmissionMixin,
    SchedulerMemoryMixin,
    SchedulerResultsMixin,
    SchedulerRequestsMixin,
    SchedulerFaultsMixin,
    SchedulerGrammarMixin,
    SchedulerSpeculativeMixin,
    SchedulerEmbeddingMixin,
):
    def __init__(
        self,
        tp_worker: Any,
        model_config: Any,
        tokenizer: Any,
        recv_from_tokenizer: Any,
        send_to_detokenizer: Any,
        send_to_tokenizer: Any,
        tp_sync: TpSync | None = None,
        dp_rank: int = 0,
        load_reporter: NullLoadReporter | None = None,
    ):
        self.tp_worker, self.model_config, self.tokenizer = tp_worker, model_config, tokenizer
        self.silent_token_ids = silent_token_ids(tokenizer)  # what stop windows skip
        self.byte_fallback_ids = byte_fallback_ids(tokenizer)  # runs a stop window spans whole
        self.tp_sync = tp_sync or TpSync(1)
        self.dp_rank = dp_rank
        self.load_reporter = load_reporter or NullLoadReporter()
        self.recv_from_tokenizer = recv_from_tokenizer
        self.send_to_detokenizer = send_to_detokenizer
        self.send_to_tokenizer = send_to_tokenizer
        self._init_config()
        self._init_memory()
        self._init_state()
        self._init_speculative(model_config)
        self._init_embedding()
        features = get_exec().features
        self._init_grammar(
            features.grammar_backend,
            any_whitespace=not features.constrained_json_disable_any_whitespace,
            blocking=self.tp_sync.tp_size > 1,
        )

    def _init_config(self) -> None:
        sched, mem = get_schedule(), get_memory()  # fcfs without a radix cache (resolvers.py)
        self.policy = SchedulePolicy(sched.schedule_policy, seed=get_exec().random_seed or 0)
        self.chunked_prefill_size = sched.chunked_prefill_size
        self.max_prefill_tokens = sched.max_prefill_tokens
        self.enable_mixed_chunk = sched.enable_mixed_chunk
        self.max_queued_requests = sched.max_queued_requests
        self.stream_interval = max(1, sched.stream_interval)
        self.new_token_ratio = NewTokenRatio(sched.schedule_conservativeness)
        self.page_size = mem.page_size
        self.disable_radix_cache = mem.disable_radix_cache
        self._configured_max_running = sched.max_running_requests
        self.watchdog_timeout = get_observability().watchdog_timeout

    def _init_memory(self) -> None:
        runner = self.tp_worker.model_runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.max_total_num_tokens = runner.max_total_num_tokens
        limits = [runner.max_running_requests, self.req_to_token_pool.size]
        if self._configured_max_running:
            limits.append(self._configured_max_running)
        self.max_running_requests = min(limits)
        self._agree_across_ranks()
        self.device = getattr(runner, "device", "cpu")
        self.context_len = self.model_config.context_len
        self.eos_token_ids = stop_eos_ids(self.model_config.eos_token_ids, self.tokenizer)
        self.vocab_size = self.model_config.vocab_size
        if self.disable_radix_cache:
            self.tree_cache = ChunkCache(self.req_to_token_pool, self.allocator)
        else:
            self.tree_cache = RadixCache(self.req_to_token_pool, self.allocator, self.page_size)

    def _agree_across_ranks(self) -> None:
        """TP ranks must see identical pools: hold back what exceeds the smallest rank's."""
        self._reserved_slots: Any = None
        self._reserved_rows: list[int] = []
        if self.tp_sync.tp_size == 1:
            return
        figures = [
            self.max_total_num_tokens,
            self.allocator.available_size(),
            self.req_to_token_pool.available_size(),
            self.max_running_requests,
        ]
        total, self._agreed_free_kv, self._agreed_rows, running = self.tp_sync.agree_min(figures)
        self.max_total_num_tokens, self.max_running_requests = total, running
        self.reserve_excess()

    def reserve_excess(self) -> None:
        """Allocate (and never free) this rank's slots and rows beyond the agreed figures."""
        if self.tp_sync.tp_size == 1:
            return
        # After a pool clear() the old reservation is free again: take it anew.
        excess = self.allocator.available_size() - self._agreed_free_kv
        if excess > 0:
            self._reserved_slots = self.allocator.alloc(excess)
        rows = self.req_to_token_pool.available_size() - self._agreed_rows
        if rows > 0:
            self._reserved_rows = self.req_to_token_pool.alloc(rows)

    def reserved_figures(self) -> tuple[int, int]:
        """(KV slots, request rows) held back by reserve_excess."""
        slots = self._reserved_slots
        num_slots = (
            0 if slots is None else -(-int(slots.numel()) // self.page_size) * self.page_size
        )
        return num_slots, len(self._reserved_rows)

    def _init_state(self) -> None:
        self.waiting_queue: list[Req] = []
        self.running = RunningBatch()
        self.chunked_req: Req | None = None
        self.pending_outputs: list[Req] = []
        self.cache_hits = self.cache_queries = 0
        self.last_gen_throughput = 0.0
        self._tput_tokens, self._tput_t0 = 0, time.perf_counter()
        self._checked_idle = True
        self.integrity_error: str | None = None
        self.forward_clock = ForwardClock()
        # time.monotonic() of this step's receive, rank 0's under TP (recv_requests):
        # what requests' arrival and waiting are measured in
        self.clock_s = time.monotonic()
        self.num_retracted_reqs = 0
        self.fault_injector = FaultInjector.from_env()

    def ready_info(self) -> dict[str, Any]:
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "context_len": self.context_len,
            "max_req_input_len": min(self.context_len - 1, self.max_total_num_tokens - 1),
        }

    # ------------------------------------------------------------------ the loop

    def event_loop(self) -> None:
        if self.watchdog_timeout and self.watchdog_timeout > 0:
            self._start_forward_watchdog(self.watchdog_timeout)
        while True:
            self.step(block=self.is_idle())

    def step(self, block: bool = False) -> None:
        """Receive, schedule one batch, run it, process it, emit outputs."""
        self.forward_clock.step()
        msgs = self.recv_requests(block)
        self.load_reporter.note_received(msgs)
        self.process_input_requests(msgs)
        self.admit_compiled_grammars(block_s=IDLE_POLL_MS / 1e3 if self._only_compiling() else 0)
        batch = self.get_next_batch_to_run()
        if batch is not None:
            if self._checked_idle:  # the first batch after idle: the idle time is no window's
                self._tput_tokens, self._tput_t0 = 0, time.perf_counter()
            self.forward_clock.start()
            try:
                self.run_contained(batch)
            finally:
                self.forward_clock.stop()
            self._checked_idle = False
        self.emit_outputs()
        self.load_reporter.maybe_report(self)
        if batch is None and self.is_idle() and not self._checked_idle:
            self._check_idle_integrity()

    def _only_compiling(self) -> bool:
        """Nothing can run until a grammar compiles (so the loop may wait for one)."""
        return not self.has_schedulable_work() and self.num_grammar_waiting() > 0

    def _start_forward_watchdog(self, timeout_s: float) -> None:
        """Exit when one forward runs past timeout_s: the launcher then fails requests."""

        def watch() -> None:
            while True:
                time.sleep(min(timeout_s / 4, 5.0))
                busy_s = self.forward_clock.busy_for_s()
                if busy_s is not None and busy_s > timeout_s:
                    logger.error(
                        "a forward pass ran past watchdog_timeout=%g s; exiting", timeout_s
                    )
                    os._exit(1)

        threading.Thread(target=watch, name="scheduler-watchdog", daemon=True).start()

    def _check_idle_integrity(self) -> None:
        """Runs once each time the scheduler goes idle; a failure is logged and reported."""
        self._checked_idle = True
        try:
            self.check_memory_integrity()
            self.integrity_error = None
        except AssertionError as exc:
            self.integrity_error = str(exc)
            logger.error("KV memory integrity check failed while idle: %s", exc)

    def recv_requests(self, block: bool) -> list[Any]:
        """This step's messages; sets `clock_s`, the step's time on every TP rank."""
        msgs = self._recv_local(block) if self.tp_sync.is_first_rank else []
        msgs, self.clock_s = self.tp_sync.share_inputs(msgs, time.monotonic())
        return msgs

    def _recv_local(self, block: bool) -> list[Any]:
        if block:
            first = self.recv_from_tokenizer.recv(timeout_ms=IDLE_POLL_MS)
            if first is None:
                return []
            return [first, *self.recv_from_tokenizer.recv_all_nowait()]
        return self.recv_from_tokenizer.recv_all_nowait()

    def get_next_batch_to_run(self) -> PrefillBatch | DecodeStep | VerifyStep | None:
        batch = self.get_new_prefill_batch()
        if batch is None:
            return self.get_decode_batch()
        if self.enable_mixed_chunk:
            self.mix_running_into(batch)
        return batch

    def get_decode_batch(self) -> DecodeStep | VerifyStep | None:
        if not len(self.running):
            return None
        if not self.decode_fits():
            self.retract_for_decode()
        if self.drafter is not None:
            step = self.get_verify_step()
            if step is not None:
                return step
        return self.plain_decode_step()

    def plain_decode_step(self) -> DecodeStep | None:
        """One slot per running request at its kv_len (None: the batch cannot fit)."""
        out_cache_loc = self.alloc_running_slots()
        if out_cache_loc is None:
            self._abort_unfittable()
            return None
        return DecodeStep(out_cache_loc)

    def _abort_unfittable(self) -> None:
        """A single request that outgrew the whole pool: it cannot make progress."""
        reqs = list(self.running.reqs)
        self.running.remove(reqs)
        for req in reqs:
            req.finished_reason = finish_abort("The KV cache is too small for this request.")
            self.release_req(req)
            self.pending_outputs.append(req)

    def run_batch(self, batch: PrefillBatch | DecodeStep | VerifyStep) -> Any:
        if isinstance(batch, PrefillBatch):
            if self.is_embedding:
                return self.run_embedding_batch(batch)
            info = self._with_grammar_mask(self._sampling_info(batch.reqs), batch.reqs)
            return self.forward(batch.reqs, batch.to_worker_batch(info))
        info = self.running.cached_sampling_info()
        if info is None:
            kept = self.running.penalty_counts(self.vocab_size, self.device)
            info = self._sampling_info(self.running.reqs, kept)
            if not any(r.needs_fresh_sampling_info() for r in self.running.reqs):
                self.running.set_sampling_info(info)
        if isinstance(batch, VerifyStep):  # drafting rows get per-row masks instead
            drafting = [bool(d) for d in batch.drafts]
            return self.run_verify(
                batch, self._with_grammar_mask(info, self.running.reqs, drafting)
            )
        info = self._with_grammar_mask(info, self.running.reqs)
        worker_batch = self.running.to_worker_batch(batch.out_cache_loc, info)
        return self.forward(self.running.reqs, worker_batch)

    def _with_grammar_mask(self, info: Any, reqs: list[Req], skip: list[bool] | None = None) -> Any:
        """`info` with this step's grammar mask (a copy: the cached info stays mask-free)."""
        mask = self.grammar_mask(reqs, skip)
        return info if mask is None else dataclasses.replace(info, grammar_mask=mask)

    def _sampling_info(self, reqs: list[Req], kept_counts: Any = None) -> Any:
        """`kept_counts`: a running batch's (output counts, prompt mask), if it keeps them."""
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        counts, prompt_seen = kept_counts if kept_counts is not None else (None, None)
        return SamplingBatchInfo.from_requests(
            [r.sampling_params for r in reqs],
            [r.output_ids for r in reqs],
            self.vocab_size,
            self.device,
            eos_token_ids=self.eos_token_ids,
            penalty_counts=counts,
            prompt_ids=[r.origin_input_ids for r in reqs],
            prompt_seen=prompt_seen,
        )

    def process_batch_result(self, batch: PrefillBatch | DecodeStep, result: Any) -> None:
        if isinstance(batch, PrefillBatch):
            if self.is_embedding:
                self.process_embedding_result(batch, result)
            else:
                self.process_prefill_result(batch, result)
            if batch.num_decoding:  # a decode step rode along
                self.new_token_ratio.decay()
                self._count_throughput(batch.num_decoding)
            return
        if isinstance(batch, VerifyStep):
            self.process_verify_result(batch, result)
            num_tokens = sum(len(tokens) for tokens in result.accepted)
        else:
            self.process_decode_result(result)
            num_tokens = len(result.next_token_ids)
        self.new_token_ratio.decay()
        self._count_throughput(num_tokens)

    def _count_throughput(self, num_tokens: int) -> None:
        self._tput_tokens += num_tokens
        elapsed = time.perf_counter() - self._tput_t0
        if elapsed >= 2.0:
            self.last_gen_throughput = self._tput_tokens / elapsed
            self._tput_tokens, self._tput_t0 = 0, time.perf_counter()
            self._log_decode_window()

    def _log_decode_window(self) -> None:
        """One line per 2 s window of decoding (SGLang's "Decode batch" line)."""
        used = self.used_kv_tokens()
        line = (
            f"decode: {len(self.running)} running, {len(self.waiting_queue)} queued, "
            f"token usage {used / max(self.max_total_num_tokens, 1):.2f}, "
            f"gen throughput {self.last_gen_throughput:.1f} tok/s"
        )
        accept = self.window_accept_length()
        if accept is not None:
            line += f", accept length {accept:.2f}"
        logger.info(line)


# ----------------------------------------------------------------------------
# Process entry
# ----------------------------------------------------------------------------


def build_scheduler(port_args: Any, tp_rank: int, forward_clock: ForwardClock | None = None):
    """The scheduler process's build step (entry: scheduler_entry.run_scheduler_process)."""
    import zmq

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.ipc import PullEndpoint, PushEndpoint
    from sglang.srt.managers.scheduler_parts.load_report import LoadReporter
    from sglang.srt.managers.tokenizer_manager import load_tokenizer_in_child
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_device, get_parallel

    tokenizer = load_tokenizer_in_child()  # first: the fork must not copy threads
    tp_size = get_parallel().tp_size
    init_tensor_parallel(tp_size, tp_rank, port_args.dist_init_method, str(get_device().device))
    model_config = ModelConfig.from_server_args()
    tp_worker = TpModelWorker(model_config, tp_rank=tp_rank)
    reporter = None
    if tp_rank == 0:
        ctx = zmq.Context(1)  # one I/O thread: a handful of sockets, 2 cores to share
        if port_args.load_report_ipc_name:  # one of several DP ranks
            push = PushEndpoint(ctx, port_args.load_report_ipc_name)
            reporter = LoadReporter(push, port_args.dp_rank)
        endpoints = (
            PullEndpoint(ctx, port_args.scheduler_input_ipc_name),
            PushEndpoint(ctx, port_args.detokenizer_ipc_name),
            PushEndpoint(ctx, port_args.tokenizer_ipc_name),
        )
    else:
        endpoints = (NullEndpoint(), NullEndpoint(), NullEndpoint())
    scheduler = Scheduler(
        tp_worker,
        model_config,
        tokenizer,
        *endpoints,
        tp_sync=TpSync(tp_size),
        dp_rank=port_args.dp_rank,
        load_reporter=reporter,
    )
    if forward_clock is not None:
        scheduler.forward_clock = forward_clock
    return _hand_off_tokenizer(scheduler, tp_rank), scheduler.event_loop


def _hand_off_tokenizer(scheduler: Scheduler, tp_rank: int) -> dict[str, Any]:
    """Give the torch-free processes this tokenizer: the detokenizer by a first message,
    the TokenizerManager pickled in the ready info (bytes, so DP ranks' infos merge).
    The ready info, with `tokenizer_pickle` on TP rank 0."""
    import pickle

    from sglang.srt.managers.io_struct import TokenizerHandoff

    info = scheduler.ready_info()
    if tp_rank == 0:
        scheduler.send_to_detokenizer.send(TokenizerHandoff(scheduler.tokenizer))
        info["tokenizer_pickle"] = pickle.dumps(scheduler.tokenizer)
    return info
