"""Run HF transformers on a checkpoint directory, as the reference our runner must match."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=4)
def load_hf_model(model_dir: str, dtype: torch.dtype = torch.float32):
    """The HF causal LM (eager attention, eval mode), cached per (dir, dtype)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager"
    )
    return model.eval()


@torch.inference_mode()
def hf_logits(model, input_ids: list[int]) -> torch.Tensor:
    """float32[len, vocab]: logits at every position of one sequence."""
    return model(torch.tensor([input_ids])).logits[0].float()


@torch.inference_mode()
def hf_prompt_logprobs(model, input_ids: list[int]) -> list[float]:
    """logprob of input_ids[i] given input_ids[:i], for i >= 1."""
    logprobs = torch.log_softmax(hf_logits(model, input_ids), dim=-1)
    targets = torch.tensor(input_ids[1:]).unsqueeze(1)
    return logprobs[:-1].gather(1, targets).squeeze(1).tolist()


@torch.inference_mode()
def hf_greedy(model, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF `generate` greedy continuation (no EOS stop)."""
    out = model.generate(
        torch.tensor([input_ids]),
        attention_mask=torch.ones(1, len(input_ids), dtype=torch.int64),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(input_ids) :].tolist()
