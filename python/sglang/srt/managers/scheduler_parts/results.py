"""Processing a forward's result: append tokens, stop checks, free KV, emit outputs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sglang.srt.constrained.base import InvalidGrammarError, key_of
from sglang.srt.layers.listed_logprobs import split_listed
from sglang.srt.layers.sampler import NO_ALLOWED_TOKEN
from sglang.srt.managers.detokenizer_manager import (
    find_stop,
    last_token_start,
    stop_window,
    trim_incomplete_utf8,
)
from sglang.srt.managers.fault_injection import is_fatal
from sglang.srt.managers.io_struct import (
    INPUT_LOGPROB_FIELDS,
    LOGPROB_FIELDS,
    OUTPUT_LOGPROB_FIELDS,
    BatchTokenIDOutput,
    DecodeParams,
)
from sglang.srt.managers.request_errors import internal_error_reason, invalid_request_reason
from sglang.srt.managers.schedule_batch import finish_length, finish_stop
from sglang.srt.managers.scheduler_parts.grammar import grammar_param

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import PrefillBatch, Req, RunningBatch
    from sglang.srt.model_executor.forward_batch_info import GenerationBatchResult

logger = logging.getLogger(__name__)


class SchedulerResultsMixin:
    running: RunningBatch
    chunked_req: Req | None
    eos_token_ids: set[int]
    tokenizer: Any
    context_len: int
    stream_interval: int
    send_to_detokenizer: Any
    pending_outputs: list[Req]
    req_to_token_pool: Any
    tp_worker: Any

    # ------------------------------------------------------------------ prefill

    def process_prefill_result(self, batch: PrefillBatch, result: GenerationBatchResult) -> None:
        prefill_reqs = batch.prefill_reqs
        if batch.num_decoding:  # the rows after the prompts': the running batch, a step
            assert batch.decoding_reqs == self.running.reqs, "mixed rows out of step"
            self.process_decode_result(result, first_row=len(prefill_reqs))
        joined: list[Req] = []
        for i, req in enumerate(prefill_reqs):
            req.kv_len += req.extend_len
            self._record_input_logprobs(req, result, i)
            if req.is_chunked:
                self._cache_chunk(req)
                self.chunked_req = req
                continue
            if req.finished:  # aborted while its prefill ran
                self.release_req(req)
                continue
            if req.max_new_tokens == 0:
                req.finished_reason = finish_length(0)
            else:
                self._append_token(req, result, i)
            if req.finished:
                self.release_req(req)
                self.pending_outputs.append(req)
            else:
                joined.append(req)
                self._maybe_stream(req)
        self.running.add(joined)

    def _cache_chunk(self, req: Req) -> None:
        """Lock a chunked prompt's KV so far in the prefix cache. Where the cache already
        held the same tokens it keeps its slots and the request's row is remapped to
        them; the worker's carried logprob row (keyed by the chunk's last slot) moves
        along, else the next chunk's first input logprob would be lost."""
        last = req.kv_len - 1
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        slot_before = int(row[last]) if req.wants_input_logprobs() else None
        self.tree_cache.cache_unfinished_req(req, req.all_ids()[: req.kv_len])
        if slot_before is not None and int(row[last]) != slot_before:
            self.tp_worker.move_logprob_carry(slot_before, int(row[last]))

    # ------------------------------------------------------------------ decode

    def process_decode_result(self, result: GenerationBatchResult, first_row: int = 0) -> None:
        """The running batch's step: its requests' tokens are rows first_row... of `result`
        (after a prefill batch's prompts, when mixed in)."""
        self.running.advance()
        done: list[Req] = []
        for i, req in enumerate(self.running.reqs):
            self._append_token(req, result, first_row + i)
            req.spec_verify_ct += self.drafter is not None  # a round without drafts
            self.settle(req, done)
        self.running.remove(done)

    def settle(self, req: Req, done: list[Req]) -> None:
        """After a decode round: a finished request leaves (KV released, output queued,
        added to `done`); a running one may stream."""
        if req.finished:
            done.append(req)
            self.release_req(req)
            self.pending_outputs.append(req)
        else:
            self._maybe_stream(req)

    # ------------------------------------------------------------------ per request

    def _append_token(self, req: Req, result: GenerationBatchResult, i: int) -> None:
        logprob = top = None
        if req.logprobs is not None:
            if result.next_token_logprobs is not None:
                logprob = result.next_token_logprobs[i]
            if req.lists_logprobs() and result.next_token_top_logprobs is not None:
                top = result.next_token_top_logprobs[i]
        self.accept_token(req, result.next_token_ids[i], logprob, top)

    def accept_token(
        self,
        req: Req,
        token: int,
        logprob: float | None = None,
        top: list[tuple[float, int]] | None = None,
    ) -> None:
        """Append one generated token: logprobs, grammar, stop and length checks. `top`:
        the position's listed logprobs (listed_logprobs.py)."""
        if token == NO_ALLOWED_TOKEN:  # this request's bans left nothing to sample
            req.finished_reason = _no_allowed_token_reason(req)
            return
        req.output_ids.append(token)
        try:
            if req.logprobs is not None:
                self._record_output_logprobs(req, token, logprob, top)
            if req.grammar is not None:
                self.advance_grammar(req, token)
            if not req.finished:
                self.check_finished(req)
        except InvalidGrammarError as exc:
            req.finished_reason = invalid_request_reason(str(exc), grammar_param(exc.param))
        except Exception as exc:  # this request's bookkeeping failed: it ends, not the loop
            if is_fatal(exc):
                raise
            logger.exception("request %s: processing its token failed", req.rid)
            req.finished_reason = internal_error_reason(exc)

    def check_finished(self, req: Req) -> None:
        """Stops before length (as vLLM): a stop token or string that the last allowed
        token completes ends the request as "stop", and the text is trimmed at it."""
        out = req.output_ids
        params = req.sampling_params
        if len(out) >= params.min_new_tokens:
            token = out[-1]
            if token in params.stop_token_ids or (
                not params.ignore_eos and token in self.eos_token_ids
            ):
                req.finished_reason = finish_stop(token)
                return
            if params.stop_strs and self.tokenizer is not None and self._check_stop_strs(req):
                return
        if len(out) >= req.max_new_tokens:
            req.finished_reason = finish_length(req.max_new_tokens)
        elif req.seq_len >= self.context_len:
            req.finished_reason = finish_length(len(out))

    def _check_stop_strs(self, req: Req) -> bool:
        """Stop strings are matched on decoded text, as the detokenizer trims them.

        A stop string checked after every token ends inside the last token, so
        it lies within the last len(stop in UTF-8 bytes) tokens (a token is at
        least one byte; special tokens a skip_special_tokens decode drops are not
        counted, see stop_window_start). STOP_WINDOW_MARGIN more tokens in front keep the
        decode of the stop's first token in context (a leading space, the rest
        of a split character); an incomplete character at the end decodes to
        U+FFFD, which matches no stop until the token that completes it. Stops
        are not checked before min_new_tokens: in the first window after it, one
        must end in the last token (an earlier one was let pass)."""
        params = req.sampling_params
        silent = self.silent_token_ids if params.skip_special_tokens else ()
        tail = stop_window(req.output_ids, params.stop_strs, silent, self.byte_fallback_ids)

        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(
                ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )

        ends_after = 0
        if params.min_new_tokens and len(req.output_ids) - params.min_new_tokens < len(tail):
            ends_after = last_token_start(decode, tail, len(tail))
        hit = find_stop(trim_incomplete_utf8(decode(tail)), params.stop_strs, ends_after)
        if hit is not None:
            req.finished_reason = finish_stop(hit[1])
        return hit is not None

    def _maybe_stream(self, req: Req) -> None:
        # The first token goes out at once (time to first token); then every
        # stream_interval tokens.
        if not req.stream:
            return
        if req.send_offset == 0 or len(req.output_ids) - req.send_offset >= self.stream_interval:
            self.pending_outputs.append(req)

    # ------------------------------------------------------------------ logprobs

    def _record_output_logprobs(
        self, req: Req, token: int, logprob: float | None, top: list[tuple[float, int]] | None
    ) -> None:
        if logprob is not None:
            req.logprobs.output_token_logprobs.append((logprob, token))
        if not req.lists_logprobs() or top is None:
            return
        top, picked = split_listed(top, req.top_logprobs_num)
        if req.top_logprobs_num:
            req.logprobs.output_top_logprobs.append(top)
        if req.logprob_token_ids:
            req.logprobs.output_token_ids_logprobs.append(picked)

    def _record_input_logprobs(self, req: Req, result: Any, i: int) -> None:
        if not req.wants_input_logprobs() or result.input_token_logprobs is None:
            return
        logprobs = result.input_token_logprobs[i]
        end = req.kv_len
        start = end - len(logprobs)
        skip = max(req.logprob_start_len - start, 0)  # asked only to carry the last row
        ids = req.origin_input_ids[start + skip : end]
        req.logprobs.input_token_logprobs.extend(zip(logprobs[skip:], ids))
        if not req.lists_logprobs() or result.input_top_logprobs is None:
            return
        # position 0 of a prompt has no logprobs: its list is None, so are its parts
        for entry in result.input_top_logprobs[i][skip:]:
            top, picked = split_listed(entry, req.top_logprobs_num) if entry else (None, None)
            if req.top_logprobs_num:
                req.logprobs.input_top_logprobs.append(top)
            if req.logprob_token_ids:
                req.logprobs.input_token_ids_logprobs.append(picked)

    # ------------------------------------------------------------------ emission

    def emit_outputs(self) -> None:
        """Send one BatchTokenIDOutput for every request that has something new."""
        reqs, self.pending_outputs = self.pending_outputs, []
        if not reqs:
            return
        seen: set[int] = set()
        reqs = [r for r in reqs if not (id(r) in seen or seen.add(id(r)))]
        msg = BatchTokenIDOutput(
            rids=[r.rid for r in reqs],
            new_output_ids=[r.output_ids[r.send_offset :] for r in reqs],
            finished_reasons=[r.finished_reason for r in reqs],
            prompt_tokens=[len(r.origin_input_ids) for r in reqs],
            completion_tokens=[len(r.output_ids) for r in reqs],
            cached_tokens=[r.num_cached_tokens for r in reqs],
            queue_times=[r.queue_time_s for r in reqs],
            decode_params=[_decode_params_once(r) for r in reqs],
        )
        if self.drafter is not None:
            msg.spec_verify_ct = [r.spec_verify_ct for r in reqs]
        if any(r.logprobs is not None for r in reqs):
            _attach_logprobs(msg, reqs)
        self.attach_embeddings(msg, reqs)
        for req in reqs:
            req.send_offset = len(req.output_ids)
        self.send_to_detokenizer.send(msg)


def _decode_params_once(req: Req) -> DecodeParams | None:
    if req.sent_decode_params:
        return None
    req.sent_decode_params = True
    p = req.sampling_params
    return DecodeParams(
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        no_stop_trim=p.no_stop_trim,
        stop_strs=tuple(p.stop_strs),
        stream=req.stream,
    )


def _attach_logprobs(msg: BatchTokenIDOutput, reqs: list[Req]) -> None:
    for name in LOGPROB_FIELDS:
        setattr(msg, name, [])
    for req in reqs:
        lp = req.logprobs
        send_input = lp is not None and not lp.input_sent and bool(req.output_ids or req.finished)
        for name in OUTPUT_LOGPROB_FIELDS:
            getattr(msg, name).append(getattr(lp, name)[req.send_offset :] if lp else [])
        for name in INPUT_LOGPROB_FIELDS:
            getattr(msg, name).append(getattr(lp, name) if send_input else [])
        if lp is not None:
            lp.input_sent = lp.input_sent or send_input


def _no_allowed_token_reason(req: Req) -> dict[str, Any]:
    """The 400 of a request whose every token was banned: only a constraint's mask and
    min_new_tokens ban tokens outright (logit_bias adds at most -100)."""
    params, position = req.sampling_params, len(req.output_ids)
    if req.grammar is not None and position < params.min_new_tokens:
        kind = grammar_param(key_of(params).kind).removeprefix("sampling_params.")
        return invalid_request_reason(
            f"no token can follow output token {position}: the {kind} constraint allows "
            f"only EOS or stop tokens there, and min_new_tokens={params.min_new_tokens} "
            "bans them until that many tokens are out; lower min_new_tokens",
            "sampling_params.min_new_tokens",
        )
    return invalid_request_reason(
        f"no token can follow output token {position}: this request's constraint and "
        "bans leave none allowed",
        grammar_param(key_of(params).kind) if req.grammar is not None else None,
    )
