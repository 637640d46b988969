"""Speculative decoding in the scheduler: draft, verify in one forward, keep what agrees.

A verify step replaces a decode step: every running request extends by its last
token plus its drafts (k_i >= 0 of them) in one EXTEND forward over the paged KV,
with logits at every position; the worker returns, per request, the accepted
drafts and one token of the target's. Rejected positions' KV slots are freed at
once (the radix cache only ever receives accepted tokens), and each kept token
goes through the same stop / length / logprob bookkeeping as a decoded one.

Requests whose next-token distribution depends on per-position state the
verify rows do not model (penalties, logit_bias, min_new_tokens pending, a
seed) take part with k = 0: their row is an ordinary decode. A constrained
request drafts within its grammar: each verify row gets the grammar's mask for
the state after the drafts before it, and the matcher rolls back to advance
only on the tokens kept.
Above --speculative-disable-by-batch-size running requests, the scheduler
decodes without drafting.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.fault_injection import is_fatal
from sglang.srt.managers.request_errors import internal_error_reason
from sglang.srt.managers.schedule_batch import logprob_token_ids
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch
from sglang.srt.model_executor.model_runner import RunnerSettings
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.drafters import NgramDrafter, StandaloneDrafter

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, RunningBatch
    from sglang.srt.speculative.verify_batch import VerifyOutput

logger = logging.getLogger(__name__)


class VerifyStep:
    """Marker for "verify the running batch's drafts" (see the module docstring)."""

    def __init__(
        self,
        out_cache_loc: torch.Tensor,
        drafts: list[list[int]],
        draft_probs: torch.Tensor | None,
        kv_lens: list[int],
    ) -> None:
        self.out_cache_loc = out_cache_loc  # int64[sum(1 + k_i)]
        self.drafts = drafts
        self.draft_probs = draft_probs  # float32[sum(k_i), vocab] or None
        self.kv_lens = kv_lens  # per request, before the step (position of its last token)


class SchedulerSpeculativeMixin:
    running: RunningBatch
    context_len: int
    pending_outputs: list[Req]
    req_to_token_pool: Any
    allocator: Any

    def _init_speculative(self, model_config: Any) -> None:
        spec = get_spec()
        self.spec_algorithm = spec.speculative_algorithm
        self.drafter: NgramDrafter | StandaloneDrafter | None = None
        self.spec_rounds = self.spec_round_tokens = self.spec_fallback_steps = 0
        self._window_rounds = self._window_round_tokens = 0  # since the last decode log line
        if self.spec_algorithm is None:
            return
        self.spec_num_steps = spec.speculative_num_steps
        # Chain drafting (validated at resolution): one draft per step, k + 1 verified.
        assert spec.speculative_eagle_topk == 1
        assert spec.speculative_num_draft_tokens == self.spec_num_steps + 1
        self.spec_disable_by_batch_size = spec.speculative_disable_by_batch_size
        if self.spec_algorithm == "NGRAM":
            self.drafter = NgramDrafter(
                spec.speculative_ngram_min_match_window_size,
                spec.speculative_ngram_max_match_window_size,
            )
        else:
            self.drafter = StandaloneDrafter(
                self._build_draft_worker(spec, model_config), model_config.vocab_size
            )
        logger.info(
            "speculative decoding: %s, %d draft tokens per round, off above %d running requests",
            self.spec_algorithm,
            self.spec_num_steps,
            self.spec_disable_by_batch_size,
        )

    def _build_draft_worker(self, spec: Any, target_config: Any) -> Any:
        """The draft runner: the target's context length; its own load format, attention
        backend (constructor facts) and KV pool, as many tokens and rows as the target's."""
        target = self.tp_worker.model_runner
        draft_config = ModelConfig(
            spec.speculative_draft_model_path,
            context_length=target.context_len,
            dtype=target_config.dtype,
            longer_context_ok=True,  # the draft runs at its target's context
        )
        if draft_config.vocab_size > target_config.vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({draft_config.vocab_size}) is larger than the "
                f"target's ({target_config.vocab_size}): not the same tokenizer"
            )
        settings = replace(
            RunnerSettings.from_bags(),
            max_total_tokens=target.max_total_num_tokens,
            max_running_requests=target.max_running_requests,
        )
        worker = TpModelWorker(
            draft_config,
            is_draft_worker=True,
            context_length=target.context_len,
            settings=settings,
        )
        runner = worker.model_runner
        logger.info(
            "draft runner: %s, %d KV tokens, backend %s, load format %s",
            draft_config.model_path,
            runner.max_total_num_tokens,
            runner.attention_backend_name,
            runner.load_format,
        )
        return worker

    # ------------------------------------------------------------------ building a step

    def get_verify_step(self) -> VerifyStep | None:
        """Draft for the running batch and reserve KV for the verify; None = plain decode."""
        reqs = self.running.reqs
        if len(reqs) > self.spec_disable_by_batch_size:
            self.spec_fallback_steps += 1
            return None
        budgets = [self._draft_budget(r) for r in reqs]
        if not any(budgets):
            return None
        drafts, draft_probs = self.drafter.propose(reqs, budgets)
        drafts, draft_probs = self._within_grammars(reqs, drafts, draft_probs)
        if not any(drafts):
            self._drop_drafts(reqs)
            return None
        kv_lens = [r.kv_len for r in reqs]
        seq_lens = [n + 1 + len(d) for n, d in zip(kv_lens, drafts)]
        pool_indices = [r.req_pool_idx for r in reqs]
        loc = self.alloc_extend(kv_lens, seq_lens, pool_indices)
        if loc is None:  # no room for the drafts: decode plainly this round
            self._drop_drafts(reqs)
            return None
        offset = 0
        for req, start, end in zip(reqs, kv_lens, seq_lens):
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(start, end)), loc[offset : offset + end - start]
            )
            offset += end - start
        return VerifyStep(loc.to(torch.int64), drafts, draft_probs, kv_lens)

    def _within_grammars(
        self, reqs: list[Req], drafts: list[list[int]], draft_probs: torch.Tensor | None
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Cut each constrained request's drafts at the first token its grammar refuses
        (the matcher is rolled back: it advances only on kept tokens)."""
        if not any(r.grammar is not None and d for r, d in zip(reqs, drafts)):
            return drafts, draft_probs
        kept_rows, offset, cut = [], 0, []
        for req, draft in zip(reqs, drafts):
            keep = len(draft) if req.grammar is None else self.grammar_prefix_len(req, draft)
            cut.append(draft[:keep])
            kept_rows.extend(range(offset, offset + keep))
            offset += len(draft)
        if draft_probs is not None:
            draft_probs = draft_probs.index_select(0, torch.tensor(kept_rows, dtype=torch.int64))
        return cut, draft_probs

    def _draft_budget(self, req: Req) -> int:
        """Draft tokens this request may verify this round (0 = an ordinary decode row)."""
        if req.needs_fresh_sampling_info() or req.sampling_params.logit_bias:
            return 0
        if req.grammar is not None and not req.sampling_params.is_greedy:
            # Drafts a grammar refuses are cut before verification; for a draw from q
            # that cut depends on the draw and biases the output away from p (0.75 /
            # 0.25 for p = 0.5 / 0.5), so such requests decode without drafts.
            if self.drafter.draws_from_q:
                return 0
        remaining = req.max_new_tokens - len(req.output_ids)
        room = self.context_len - req.seq_len
        return max(0, min(self.spec_num_steps, remaining - 1, room - 1))

    def to_verify_batch(self, step: VerifyStep, info: Any) -> ModelWorkerBatch:
        reqs = self.running.reqs
        input_ids = [t for r, d in zip(reqs, step.drafts) for t in (r.output_ids[-1], *d)]
        extend_lens = [1 + len(d) for d in step.drafts]
        return_logprob = any(r.return_logprob for r in reqs)
        return ModelWorkerBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            req_pool_indices=self.running.req_pool_indices(),
            seq_lens=torch.tensor([n + e for n, e in zip(step.kv_lens, extend_lens)]),
            out_cache_loc=step.out_cache_loc,
            sampling_info=info,
            extend_seq_lens=extend_lens,
            extend_prefix_lens=list(step.kv_lens),
            return_logprob=return_logprob,
            top_logprobs_nums=[r.top_logprobs_num for r in reqs] if return_logprob else None,
            logprob_token_ids=logprob_token_ids(reqs),
            return_all_logits=True,
        )

    def run_verify(self, step: VerifyStep, info: Any) -> VerifyOutput:
        batch = self.to_verify_batch(step, info)
        rids = [r.rid for r in self.running.reqs]
        self.fault_injector.check("forward", rids)
        self.fault_injector.check("verify", rids)
        row_mask = self.grammar_verify_mask(self.running.reqs, step.drafts)
        return self.tp_worker.forward_batch_verify(batch, step.drafts, step.draft_probs, row_mask)

    def undo_verify_step(self, step: VerifyStep) -> None:
        """A verify forward failed: give back every slot it reserved (the requests are then
        decoded one at a time by the fault isolation)."""
        self.allocator.free(step.out_cache_loc)
        self._drop_drafts(self.running.reqs)

    # ------------------------------------------------------------------ its result

    def process_verify_result(self, step: VerifyStep, result: VerifyOutput) -> None:
        done: list[Req] = []
        for i, req in enumerate(self.running.reqs):
            try:
                self._keep_verified(req, step, result, i)
            except Exception as exc:  # this request's bookkeeping failed: it ends alone
                if is_fatal(exc):
                    raise
                logger.exception("request %s: processing its verified tokens failed", req.rid)
                req.finished_reason = internal_error_reason(exc)
            self.settle(req, done)
        self.running.remove(done)
        self.running.lens_changed()

    def _keep_verified(self, req: Req, step: VerifyStep, result: VerifyOutput, i: int) -> None:
        """Append the kept tokens until one finishes the request; free the KV of positions
        whose tokens were not kept."""
        base, num_drafts = step.kv_lens[i], len(step.drafts[i])
        tokens = result.accepted[i]
        kept = 0
        for j, token in enumerate(tokens):
            logprob = result.logprobs[i][j] if result.logprobs is not None else None
            top = result.top_logprobs[i][j] if result.top_logprobs is not None else None
            self.accept_token(req, token, logprob, top)
            kept += 1
            if req.finished:
                break
        # KV holds the last token and the kept drafts: positions [base, base + 1 + kept drafts)
        req.kv_len = base + 1 + min(kept, len(tokens) - 1)
        self._free_uncomputed(req, base + 1 + num_drafts)  # slots of tokens not kept
        req.spec_verify_ct += 1
        self.drafter.commit(req, min(kept, len(tokens) - 1))
        if num_drafts:
            self.spec_rounds += 1
            self.spec_round_tokens += kept

    def _drop_drafts(self, reqs: list[Req]) -> None:
        """The drafts were not verified: the drafter keeps only what precedes them."""
        for req in reqs:
            self.drafter.commit(req, 0)

    # ------------------------------------------------------------------ figures

    def spec_live_figures(self) -> dict[str, Any]:
        if self.drafter is None:
            return {}
        rounds = max(self.spec_rounds, 1)
        return {
            "avg_spec_accept_length": round(self.spec_round_tokens / rounds, 4),
            "spec_verify_rounds": self.spec_rounds,
            "spec_fallback_steps": self.spec_fallback_steps,
            **self.drafter.live_figures(),
        }

    def window_accept_length(self) -> float | None:
        """Tokens kept per verify round since the last call (None: no rounds, or spec off)."""
        rounds = self.spec_rounds - self._window_rounds
        tokens = self.spec_round_tokens - self._window_round_tokens
        self._window_rounds, self._window_round_tokens = self.spec_rounds, self.spec_round_tokens
        return tokens / rounds if rounds else None

    def check_draft_integrity(self) -> None:
        """Idle: the draft pool holds nothing (it caches no prefixes)."""
        figures = self.drafter.live_figures() if self.drafter is not None else {}
        if not figures:
            return
        free, total = figures["draft_available_kv_tokens"], figures["draft_max_total_num_tokens"]
        if free != total:
            raise AssertionError(f"draft KV leak: {total - free} slots held while idle")
        if figures["draft_free_req_slots"] != figures["draft_total_req_slots"]:
            raise AssertionError("draft request slot leak while idle")
