"""A fake TokenizerManager that honours the interfaces.md section 3 contract.

Tokens are characters (id = code point, vocab 256). The "model" writes the
cycle of OUTPUT_ALPHABET starting at a position chosen by the prompt (greedy) or
by the seed (sampling), so outputs are deterministic, and stop strings, lengths,
logprobs and aborts behave like the real runtime's.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import jinja2

from sglang.srt.managers.request_errors import ServerUnavailableError
from sglang.srt.managers.tokenizer_manager import _sampling_params, check_request_fields
from sglang.srt.sampling.param_types import InvalidParamError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
OUTPUT_ALPHABET = "hello world, the quick brown fox. "
VOCAB_SIZE = 256


class FakeTokenizer:
    chat_template = CHATML

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % VOCAB_SIZE for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)  # no special tokens

    def apply_chat_template(self, messages, chat_template=None, tokenize=False,
                            add_generation_prompt=True, continue_final_message=False, **_):  # fmt: skip
        template = jinja2.Template(chat_template or self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


@dataclass
class FakeModelConfig:
    vocab_size: int = VOCAB_SIZE


@dataclass
class FakeTokenizerManager:
    context_len: int = 256
    served_model_name: str = "fake-model"
    step_delay_s: float = 0.0
    fail_after_tokens: int | None = None  # a dead runtime after this many tokens
    alive: bool = True
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    model_config: FakeModelConfig = field(default_factory=FakeModelConfig)
    requests: list[Any] = field(default_factory=list)
    aborted: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    flush_outcome: tuple[list[int], list[int]] | None = None  # (flushed, busy) DP ranks
    config: dict[str, Any] = field(default_factory=lambda: {"model_path": "/models/fake"})
    is_embedding: bool = False  # a generation model (embedding fakes override this)
    allow_auto_truncate: bool = False  # the fake refuses long prompts (no truncation)

    # --- generation -------------------------------------------------------------------

    def check_request_size(self, num_prompts: int, n: int, prompt_param: str) -> None:
        """The fake has no --max-queued-requests: any size fits."""

    async def generate_request(self, obj):
        self.requests.append(obj)
        input_ids = self._input_ids(obj)
        check_request_fields(obj, VOCAB_SIZE)
        params = dict(obj.sampling_params or {})
        self._validate(input_ids, params)
        self.running.add(obj.rid)
        try:
            async for out in self._decode(obj, input_ids, params):
                yield out
        finally:
            self.running.discard(obj.rid)

    def _input_ids(self, obj) -> list[int]:
        return list(obj.input_ids) if obj.input_ids is not None else self.tokenizer.encode(obj.text)

    def _validate(self, input_ids: list[int], params: dict[str, Any]) -> None:
        """The real runtime's length checks, naming the native fields as it does."""
        if len(input_ids) >= self.context_len:
            raise InvalidParamError(
                f"The input ({len(input_ids)} tokens) is longer than the model's context "
                f"length ({self.context_len})",
                "input_ids",
            )
        max_new = params.get("max_new_tokens")
        if isinstance(max_new, int) and len(input_ids) + max_new > self.context_len:
            raise InvalidParamError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens: {len(input_ids)} in the input plus {max_new} "
                f"max_new_tokens.",
                "sampling_params.max_new_tokens",
            )
        _sampling_params(params, VOCAB_SIZE)

    def _start(self, input_ids: list[int], params: dict[str, Any]) -> int:
        if params.get("temperature", 1.0) > 0:
            return random.Random(params.get("seed")).randrange(len(OUTPUT_ALPHABET))
        return sum(input_ids) % len(OUTPUT_ALPHABET)

    async def _decode(self, obj, input_ids, params):
        default = obj.default_max_new_tokens if obj.default_max_new_tokens is not None else 128
        max_new = params.get("max_new_tokens", default)
        if max_new is None:  # up to the context, as the real one
            max_new = self.context_len - len(input_ids)
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        start, text, ids = self._start(input_ids, params), "", []
        reason = {"type": "length", "matched": None} if max_new == 0 else None
        while reason is None:
            await asyncio.sleep(self.step_delay_s)
            if obj.rid in self.aborted:
                reason = {"type": "abort", "matched": None, "message": "aborted"}
                break
            if self.fail_after_tokens is not None and len(ids) >= self.fail_after_tokens:
                raise ServerUnavailableError("The scheduler process exited unexpectedly.")
            char = OUTPUT_ALPHABET[(start + len(ids)) % len(OUTPUT_ALPHABET)]
            ids.append(ord(char))
            text += char
            reason = self._finish(text, ids, max_new, stops)
            if reason is not None and reason["type"] == "stop":
                text = text[: text.rindex(reason["matched"])]
            if reason is None:
                yield self._output(obj, input_ids, text, ids, None)
        yield self._output(obj, input_ids, text, ids, reason)

    @staticmethod
    def _finish(text, ids, max_new, stops) -> dict[str, Any] | None:
        for stop in stops:
            if text.endswith(stop):
                return {"type": "stop", "matched": stop}
        if len(ids) >= max_new:
            return {"type": "length", "matched": None}
        return None

    def _output(self, obj, input_ids, text, ids, reason) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": obj.rid,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": min(len(input_ids), 2),
            "queue_time": 0.003,
            "finish_reason": reason,
        }
        if obj.return_logprob:
            meta.update(self._logprobs(obj, input_ids, ids))
        return {"text": text, "output_ids": list(ids), "meta_info": meta}

    def _logprobs(self, obj, input_ids, ids) -> dict[str, Any]:
        def entry(token_id, logprob):
            return (logprob, token_id, chr(token_id) if obj.return_text_in_logprobs else None)

        def tops(token_id):
            return [entry(token_id, -0.5), entry((token_id + 1) % VOCAB_SIZE, -1.5)][
                : obj.top_logprobs_num
            ]

        out = {
            "output_token_logprobs": [entry(t, -0.5) for t in ids],
            "output_top_logprobs": [tops(t) for t in ids],
        }
        if obj.logprob_start_len >= 0:
            prompt = input_ids[obj.logprob_start_len :]
            out["input_token_logprobs"] = [
                entry(t, None if i == 0 else -2.0) for i, t in enumerate(prompt)
            ]
            out["input_top_logprobs"] = [None if i == 0 else tops(t) for i, t in enumerate(prompt)]
        return out

    # --- control ------------------------------------------------------------------------

    def abort_own_request(self, obj) -> None:
        if obj.rid in self.running:
            self.abort_request(obj.rid)

    def abort_request(self, rid: str, message: str = "", *, with_samples: bool = False) -> bool:
        self.aborted.add(rid)
        return rid in self.running

    async def flush_cache(self) -> bool:
        return not self.running

    async def flush_cache_ranks(self) -> tuple[list[int], list[int]]:
        if self.flush_outcome is not None:
            return self.flush_outcome
        return ([], [0]) if self.running else ([0], [])

    def text_to_encode(self, text: str, param: str) -> str:
        self.check_text_can_fit(text, param)
        return text

    def check_text_can_fit(self, text: str, param: str) -> None:
        if len(text) > self.context_len * 4:  # the fake tokenizer: one char per token
            raise InvalidParamError("The input is longer than the context length", param)

    def scheduler_busy_for_s(self) -> float | None:
        return None

    def seconds_since_output(self) -> float:
        return float("inf")  # /health always asks get_internal_state

    def stalled_ranks(self, limit_s: float) -> list[int]:
        return []

    def updating_weights(self) -> bool:
        return False

    def reasoning_end_token_id(self, parser: str | None) -> int | None:
        return None if parser is None else 7  # the fake tokenizer: one char per token

    async def get_internal_state(self) -> list[dict[str, Any]]:
        return [{"num_running_reqs": len(self.running), "num_queued_reqs": 0, "token_usage": 0.1,
                 "cache_hit_rate": 0.5, "last_gen_throughput": 12.0,
                 "model_path": self.config["model_path"]}]  # fmt: skip

    def abort_all(self, message: str = "") -> int:
        self.aborted |= self.running
        return len(self.running)

    async def update_weights_from_disk(self, model_path: str, load_format=None,
                                       abort_all_requests: bool = False):  # fmt: skip
        if model_path.startswith("/missing"):
            return False, f"no checkpoint at {model_path}"
        self.record_config_updates("update_weights_from_disk", model_path=model_path)
        return True, "ok"

    def record_config_updates(self, source: str, **kw: Any) -> None:
        self.config.update(kw)

    def config_value(self, name: str) -> Any:
        return self.config.get(name)

    def resolved_config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    def is_alive(self) -> bool:
        return self.alive

    async def aclose(self) -> None:
        self.alive = False
