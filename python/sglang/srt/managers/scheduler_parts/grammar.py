"""Constrained requests in the scheduler: compile, wait, mask, advance.

A request with a constraint (json_schema, regex, ebnf, structural_tag) waits in
the GrammarManager's queue while its grammar compiles on a worker thread, then
joins the waiting queue holding a matcher (`req.grammar`). Each forward fills
the token mask of the batch's constrained rows; each accepted token advances the
matcher; a matcher that reaches its end finishes the request.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from sglang.srt.constrained.backends import (
    GrammarBackendUnavailable,
    check_grammar_backend,
    create_grammar_backend,
)
from sglang.srt.constrained.base import InvalidGrammarError, key_of
from sglang.srt.constrained.grammar_manager import GrammarManager, GrammarMask
from sglang.srt.constrained.reasoning_gate import ReasoningGate
from sglang.srt.environ import envs
from sglang.srt.managers.request_errors import internal_error_reason, invalid_request_reason
from sglang.srt.managers.schedule_batch import finish_stop
from sglang.srt.runtime_context import get_context

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_parts.tensor_parallel import TpSync

logger = logging.getLogger(__name__)


class SchedulerGrammarMixin:
    tp_sync: TpSync
    waiting_queue: list[Req]
    pending_outputs: list[Req]
    tokenizer: Any
    vocab_size: int
    eos_token_ids: set[int]

    def _init_grammar(self, backend_name: str, any_whitespace: bool, blocking: bool) -> None:
        """Check the backend can run (it is built by the first constrained request); if it
        cannot, record the fallback to "none"."""
        self.grammar_manager: GrammarManager | None = None
        self.grammar_backend_name = backend_name
        self.grammar_unavailable = "the server runs with --grammar-backend none"
        if backend_name == "none":
            return
        try:
            check_grammar_backend(backend_name, self.tokenizer)
        except GrammarBackendUnavailable as exc:
            self._fall_back_from_grammar(exc)
            return
        make_backend = functools.partial(
            create_grammar_backend,
            backend_name,
            self.tokenizer,
            self.vocab_size,
            sorted(self.eos_token_ids),
            any_whitespace,
        )
        timeout_s = envs.SGLANG_GRAMMAR_TIMEOUT.get()
        self.grammar_manager = GrammarManager(make_backend, timeout_s, blocking=blocking)

    def _fall_back_from_grammar(self, exc: GrammarBackendUnavailable) -> None:
        """Run without a grammar backend from now on; the readback shows "none"."""
        name = self.grammar_backend_name
        logger.warning("grammar backend %s unavailable, running without: %s", name, exc)
        get_context().override("grammar_fallback", grammar_backend="none")
        self.grammar_unavailable = f"grammar backend {name} is unavailable ({exc})"
        self.grammar_manager = None

    def submit_if_constrained(self, req: Req) -> bool:
        """True if `req` carries a constraint (it now waits for its grammar, or failed)."""
        key = key_of(req.sampling_params)
        if key is None:
            return False
        if self.grammar_manager is None:
            self._refuse_constrained(req, key.kind)
        else:
            self.grammar_manager.submit(req, key)
        return True

    def _refuse_constrained(self, req: Req, kind: str) -> None:
        message = f"constrained decoding ({kind}) is not available: {self.grammar_unavailable}"
        req.finished_reason = invalid_request_reason(message, grammar_param(kind))
        self.pending_outputs.append(req)

    def num_grammar_waiting(self) -> int:
        return len(self.grammar_manager) if self.grammar_manager is not None else 0

    def admit_compiled_grammars(self, block_s: float = 0.0) -> None:
        """Move requests whose grammar compiled into the waiting queue; fail the rest.
        `block_s` > 0 waits that long for a compile when nothing else can run."""
        manager = self.grammar_manager
        if manager is None or not len(manager):
            return
        if block_s > 0:
            manager.wait(block_s)
        queued = manager.waiting_reqs()
        ready, failed = manager.pop_ready()
        if self.tp_sync.tp_size > 1:
            ready, failed = self._agree_compiled(queued, ready, failed)
        for req in ready:
            if req.reasoning_end_token_id is not None:  # constrained after the reasoning
                req.grammar = ReasoningGate(req.grammar, req.reasoning_end_token_id)
        self.waiting_queue.extend(ready)
        if manager.backend_error is not None:  # the first constrained request built it
            self._fall_back_from_grammar(manager.backend_error)
            failed += [(req, manager.backend_error) for req in manager.drain()]
            manager.shutdown()
        for req, error in failed:
            self._fail_grammar(req, error)

    def _agree_compiled(
        self, queued: list[Req], ready: list[Req], failed: list[tuple[Req, Exception]]
    ) -> tuple[list[Req], list[tuple[Req, Exception]]]:
        """(ready, failed) as every TP rank agrees. Each rank compiles and times out on
        its own clock, and a request admitted by some ranks only ran a batch the others
        did not (the forward's collectives hung, then failed). A request is ready where
        every rank compiled it; else, where this rank had it ready or still compiling, it
        fails as a timeout (what can differ between ranks)."""
        ready_here = {id(req) for req in ready}
        agreed = self.tp_sync.agree_min([int(id(req) in ready_here) for req in queued])
        failed_here = {id(req) for req, _ in failed}
        manager = self.grammar_manager
        for req, ok in zip(queued, agreed):
            if ok or id(req) in failed_here:
                continue
            if id(req) not in ready_here:  # still compiling here: out of the queue
                manager.remove(req.rid)
            req.grammar = None
            failed.append((req, manager.timeout_error(key_of(req.sampling_params).kind)))
        agreed_ready = {id(req) for req, ok in zip(queued, agreed) if ok}
        return [req for req in ready if id(req) in agreed_ready], failed

    def _fail_grammar(self, req: Req, error: Exception) -> None:
        if isinstance(error, GrammarBackendUnavailable):
            self._refuse_constrained(req, key_of(req.sampling_params).kind)
            return
        param = error.param if isinstance(error, InvalidGrammarError) else None
        if param is None:
            logger.error("request %s: grammar compile failed: %r", req.rid, error)
            req.finished_reason = internal_error_reason(error)
        else:
            req.finished_reason = invalid_request_reason(str(error), grammar_param(param))
        self.pending_outputs.append(req)

    def remove_grammar_waiting(self, rid: str) -> Req | None:
        return self.grammar_manager.remove(rid) if self.grammar_manager is not None else None

    def grammar_mask(self, reqs: list[Req], skip: list[bool] | None = None) -> Any:
        """This step's token mask for `reqs`, or None when none is constrained."""
        if self.grammar_manager is None:
            return None
        return self.grammar_manager.mask_for(reqs, skip)

    def grammar_prefix_len(self, req: Req, draft: list[int]) -> int:
        """How many leading draft tokens the request's grammar accepts (state unchanged)."""
        grammar, accepted = req.grammar, 0
        for token in draft:
            if not grammar.accept_token(token):
                break
            if grammar.is_terminated():  # the end is the target's to choose: no row after it
                grammar.rollback(1)
                break
            accepted += 1
        if accepted:
            grammar.rollback(accepted)
        return accepted

    def grammar_verify_mask(self, reqs: list[Req], drafts: list[list[int]]) -> Any:
        """Token masks for the verify rows of constrained requests with drafts: row j of
        a request gets the grammar's mask after its first j drafts (None: no such row)."""
        if self.grammar_manager is None:
            return None
        if not any(r.grammar is not None and d for r, d in zip(reqs, drafts)):
            return None
        backend = self.grammar_manager.backend
        bitmask = backend.allocate_bitmask(sum(len(d) + 1 for d in drafts))
        rows, offset = [], 0
        for req, draft in zip(reqs, drafts):
            if req.grammar is not None and draft:
                for j in range(len(draft) + 1):
                    req.grammar.fill_bitmask(bitmask, offset + j)
                    rows.append(offset + j)
                    if j < len(draft):
                        req.grammar.accept_token(draft[j])  # within the grammar: cut before
                req.grammar.rollback(len(draft))
            offset += len(draft) + 1
        return GrammarMask(backend, bitmask, rows)

    def advance_grammar(self, req: Req, token: int) -> None:
        """Feed the sampled token to the request's matcher; a complete grammar stops it."""
        if not req.grammar.accept_token(token):
            # The mask allows only grammar tokens, so this means every token was banned
            # (say min_new_tokens banned the only token the grammar allowed: EOS).
            raise InvalidGrammarError(
                f"token {token} breaks the constraint: no allowed token was left to sample",
                key_of(req.sampling_params).kind,
            )
        if req.grammar.is_terminated() and not req.finished:
            req.finished_reason = finish_stop(token)


def grammar_param(kind: str) -> str:
    """The constraint's field path in the native request (routes rename it)."""
    return f"sampling_params.{kind}"
