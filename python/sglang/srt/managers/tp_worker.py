"""TpModelWorker: the scheduler's handle on one TP rank's model execution.

The scheduler builds a `ModelWorkerBatch` (plain data) and gets back a
`GenerationBatchResult` (plain Python lists); tensors stay on this side.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import SampleOutput
from sglang.srt.model_executor.forward_batch_info import (
    EmbeddingBatchResult,
    ForwardBatch,
    GenerationBatchResult,
    ModelWorkerBatch,
)
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.speculative.verify_batch import VerifyOutput, verify

logger = logging.getLogger(__name__)


class TpModelWorker:
    def __init__(self, model_config: ModelConfig | None = None, **runner_kwargs: Any) -> None:
        """`model_config` None = ModelConfig.from_server_args(); `runner_kwargs` are
        ModelRunner's keywords (tp_rank, is_draft_worker, context_length, load_format,
        attention_backend, settings); the rest comes from the bags."""
        self.model_config = model_config or ModelConfig.from_server_args()
        self.model_runner = ModelRunner(self.model_config, **runner_kwargs)
        self.tp_rank = self.model_runner.tp_rank
        self.is_draft_worker = self.model_runner.is_draft_worker

    # -- facts the scheduler sizes itself by ---------------------------------------------

    @property
    def max_total_num_tokens(self) -> int:
        return self.model_runner.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.model_runner.max_running_requests

    @property
    def req_to_token_pool(self):
        return self.model_runner.req_to_token_pool

    @property
    def token_to_kv_pool_allocator(self):
        return self.model_runner.token_to_kv_pool_allocator

    @property
    def context_len(self) -> int:
        return self.model_runner.context_len

    @property
    def device(self) -> torch.device:
        return self.model_runner.device

    def get_worker_info(self) -> dict:
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "context_len": self.context_len,
            "vocab_size": self.model_config.vocab_size,
            "eos_token_ids": sorted(self.model_config.eos_token_ids),
            "device": str(self.device),
        }

    # -- forward -------------------------------------------------------------------------

    @torch.inference_mode()
    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Run one step and sample one token per request."""
        if batch.forward_mode.is_idle() or batch.batch_size == 0:
            return GenerationBatchResult(next_token_ids=[])
        forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        logits_output = self.model_runner.forward(forward_batch)
        sample = self.model_runner.sample(logits_output, forward_batch)
        return _to_result(sample, logits_output, batch.return_logprob)

    @torch.inference_mode()
    def forward_batch_embedding(self, batch: ModelWorkerBatch) -> EmbeddingBatchResult:
        """Run one prefill (EXTEND) step and pool each request's last hidden state."""
        forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        out = self.model_runner.model.forward(
            forward_batch.input_ids, forward_batch.positions, forward_batch, get_embedding=True
        )
        return EmbeddingBatchResult(embeddings=out.embeddings.cpu().tolist())

    def check_can_generate(self) -> None:
        """Refuse (at launch) to generate with a checkpoint that has no lm_head."""
        if getattr(self.model_runner.model, "has_lm_head", True) is False:
            raise ValueError(
                "the checkpoint has no lm_head weights (an embedding model's checkpoint): "
                "serve it with --is-embedding"
            )

    def check_can_embed(self) -> None:
        """Refuse (at launch) a model class without a pooling path."""
        if getattr(self.model_runner.model, "pooler", None) is None:
            raise ValueError(
                f"--is-embedding: {self.model_config.architecture} has no embedding "
                "(pooling) path; embedding serving covers the Llama, Qwen2 and Qwen3 "
                "families"
            )

    @torch.inference_mode()
    def forward_batch_verify(
        self,
        batch: ModelWorkerBatch,
        drafts: list[list[int]],
        draft_probs: torch.Tensor | None = None,
        row_mask: Any = None,
    ) -> VerifyOutput:
        """Run a speculative verify step (an EXTEND of each request's last token and its
        drafts, logits at every position) and decide the tokens each request keeps.
        `row_mask` (a GrammarMask over verify rows) constrains the rows of constrained
        requests that drafted."""
        forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        logits = self.model_runner.forward(forward_batch).next_token_logits
        if row_mask is not None:
            row_mask.apply(logits)
        asks = (batch.top_logprobs_nums, batch.logprob_token_ids) if batch.return_logprob else None
        return verify(
            logits, batch.sampling_info, drafts, draft_probs, self.model_runner.sampler, asks
        )

    @torch.inference_mode()
    def forward_batch_logits(self, batch: ModelWorkerBatch) -> LogitsProcessorOutput:
        """Run one step and return the logits without sampling (tests, scoring)."""
        forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        return self.model_runner.forward(forward_batch)

    def move_logprob_carry(self, old_slot: int, new_slot: int) -> None:
        """A chunk's last token now reads its KV from `new_slot` (the prefix cache kept its
        own copy of the same tokens and freed `old_slot`): its carried logprob row, if
        any, follows, so the next chunk's first input logprob is found."""
        carry = self.model_runner.logprob_carry
        if old_slot in carry:
            carry[new_slot] = carry.pop(old_slot)

    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None
    ) -> tuple[bool, str]:
        try:
            self.model_runner.update_weights_from_disk(model_path, load_format)
        except Exception as e:  # any failure leaves the old weights in place
            logger.warning("update_weights_from_disk(%s) failed: %s", model_path, e)
            return False, f"failed to update weights from {model_path}: {e}"
        self.model_config = self.model_runner.model_config
        return True, f"updated weights from {model_path}"


def _to_result(
    sample: SampleOutput, logits_output: LogitsProcessorOutput, return_logprob: bool
) -> GenerationBatchResult:
    result = GenerationBatchResult(next_token_ids=sample.next_token_ids.tolist())
    if return_logprob:
        result.next_token_logprobs = sample.logprobs.tolist()
        result.next_token_top_logprobs = sample.top_logprobs
        result.input_token_logprobs = logits_output.input_token_logprobs
        result.input_top_logprobs = logits_output.input_top_logprobs
    return result
