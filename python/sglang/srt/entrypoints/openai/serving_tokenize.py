"""/v1/tokenize and /v1/detokenize (also served as /tokenize, /detokenize): the served
model's tokenizer, as SGLang (and vLLM) expose it, so a client can count a prompt's
tokens or read ids back without loading the tokenizer itself.

Tokenize: `prompt` a text (answers `tokens` [ids], `count` int) or a list of texts
(`tokens` [[ids]], `count` [ints]); `add_special_tokens` (default true) as the
tokenizer's encode takes it, so the ids are what a /generate `text` prompt becomes
(which encodes with the special tokens). Detokenize: `tokens` a list of ids or of id
lists, `skip_special_tokens` (default true); ids must be in the vocabulary (a 400
naming `tokens`, as /generate's `input_ids`). Neither touches the scheduler: they run
in the launcher, a long text in a worker thread so it does not stall the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from sglang.srt.entrypoints.openai.serving_base import check_input_count, check_model_name
from sglang.srt.managers.tokenizer_manager import INLINE_TOKENIZE_CHARS


class OpenAIServingTokenize:
    def __init__(self, tokenizer_manager: Any) -> None:
        self.tokenizer_manager = tokenizer_manager

    def _tokenizer(self, model: str) -> Any:
        check_model_name(self.tokenizer_manager, model)
        tokenizer = self.tokenizer_manager.tokenizer
        if tokenizer is None:
            raise APIError(
                "this server runs without a tokenizer (--skip-tokenizer-init)",
                param="model",
                code="tokenizer_not_loaded",
            )
        return tokenizer

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        tokenizer = self._tokenizer(request.model)
        texts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
        check_input_count(len(texts), "prompt")

        def encode() -> list[list[int]]:
            return [
                list(tokenizer.encode(t, add_special_tokens=request.add_special_tokens))
                for t in texts
            ]

        chars = sum(len(t) for t in texts)  # all prompts together, as one long text
        ids = await asyncio.to_thread(encode) if chars > INLINE_TOKENIZE_CHARS else encode()
        max_model_len = self.tokenizer_manager.context_len
        if isinstance(request.prompt, str):
            return TokenizeResponse(tokens=ids[0], count=len(ids[0]), max_model_len=max_model_len)
        counts = [len(i) for i in ids]
        return TokenizeResponse(tokens=ids, count=counts, max_model_len=max_model_len)

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        tokenizer = self._tokenizer(request.model)
        nested = bool(request.tokens) and isinstance(request.tokens[0], list)
        lists = request.tokens if nested else [request.tokens]
        check_input_count(len(lists), "tokens")
        vocab = self.tokenizer_manager.model_config.vocab_size
        if any(t >= vocab for ids in lists for t in ids):
            raise APIError(
                f"tokens must be token ids in [0, {vocab})", param="tokens", code="invalid_value"
            )

        def decode() -> list[str]:
            skip = request.skip_special_tokens
            return [tokenizer.decode(ids, skip_special_tokens=skip) for ids in lists]

        count = sum(len(ids) for ids in lists)  # ~4 characters of text per id
        texts = await asyncio.to_thread(decode) if 4 * count > INLINE_TOKENIZE_CHARS else decode()
        return DetokenizeResponse(text=texts if nested else texts[0])
