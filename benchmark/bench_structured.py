"""Cost of grammar-constrained decoding: decode tokens/s with half the batch held to a
JSON schema vs none, the per-step mask cost, and grammar compile times.

    python benchmark/bench_structured.py [--batch-size 1 32] [--output-len 128]
        [--rounds 2] [engine flags as keywords: --num-threads 2]

Default model: the bundled demo model. Two parts, one process:
1. Engine runs, alternating plain / half-constrained (batch 1: the one request) per round (--rounds each), same
   prompts: completion tokens / wall seconds, and the median over rounds. The schema
   forces a long string (minLength) so constrained requests run to --output-len like
   the plain ones (ignore_eos), and the two runs decode the same number of tokens.
2. In-process, the scheduler's own mask path (GrammarManager.mask_for + apply) for a
   batch of --batch-size rows, half constrained, matchers inside a JSON string (the
   state of a long decode): median ms per step, and its share of the decode step
   measured in part 1 (wall / output_len of the plain run).
Compile time: each schema of test/srt/test_structured_output.py, cold (no cache).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import torch
from transformers import AutoTokenizer

import sglang as sgl
from sglang.demo_models import demo_target_path
from sglang.srt.constrained.base import GrammarKey
from sglang.srt.constrained.grammar_manager import GrammarManager
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

logger = logging.getLogger(__name__)

LONG_TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 4000}},
    "required": ["text"],
}
COMPILE_SCHEMAS = {
    "flat": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
             "required": ["a", "b"]},  # fmt: skip
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["x", "y"]}}}}}},
    "long_text": LONG_TEXT_SCHEMA,
}  # fmt: skip


def prompts(n: int) -> list[str]:
    return [f"Item {i}: write a JSON description of a {i}-legged animal." for i in range(n)]


def is_constrained(row: int, batch_size: int) -> bool:
    """Every other row; the only row at batch 1."""
    return row % 2 == 1 or batch_size == 1


def engine_round(engine, batch_size: int, output_len: int, constrained: bool) -> float:
    base = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    schema = {**base, "json_schema": json.dumps(LONG_TEXT_SCHEMA)}
    params = [schema if constrained and is_constrained(i, batch_size) else base
              for i in range(batch_size)]  # fmt: skip
    start = time.perf_counter()
    outs = engine.generate(prompts(batch_size), params)
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert tokens == batch_size * output_len, tokens  # both runs decode the same work
    return tokens / wall


def mask_ms(backend: XGrammarBackend, tokenizer, batch_size: int, iters: int = 300) -> float:
    manager = GrammarManager(lambda: backend, timeout_s=60)
    compiled = backend.compile(GrammarKey("json_schema", json.dumps(LONG_TEXT_SCHEMA)))
    reqs = []
    for i in range(batch_size):
        grammar = None
        if is_constrained(i, batch_size):
            grammar = backend.new_grammar(compiled)
            for token in tokenizer.encode('{"text": "a walking', add_special_tokens=False):
                assert grammar.accept_token(token)
        reqs.append(type("R", (), {"grammar": grammar})())
    logits = torch.randn(batch_size, backend.vocab_size)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        manager.mask_for(reqs).apply(logits)
        times.append(time.perf_counter() - start)
    manager.shutdown()
    return statistics.median(times) * 1e3


def compile_times(backend: XGrammarBackend) -> dict[str, float]:
    out = {}
    for name, schema in COMPILE_SCHEMAS.items():
        start = time.perf_counter()
        backend.compile(GrammarKey("json_schema", json.dumps(schema)))
        out[name] = (time.perf_counter() - start) * 1e3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=str(demo_target_path()))
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-threads", type=int, default=None)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tokenizer = AutoTokenizer.from_pretrained(ns.model_path)
    vocab = json.load(open(f"{ns.model_path}/config.json"))["vocab_size"]
    backend = XGrammarBackend(tokenizer, vocab, [tokenizer.eos_token_id])
    print(
        "compile ms (cold): " + ", ".join(f"{k} {v:.1f}" for k, v in compile_times(backend).items())
    )
    engine = sgl.Engine(model_path=ns.model_path, num_threads=ns.num_threads, log_level="warning",
                        random_seed=0)  # fmt: skip
    try:
        print(
            "| batch | plain tok/s | half constrained tok/s | ratio | step ms | mask ms | mask/step |"
        )
        print("|---|---|---|---|---|---|---|")
        for bs in ns.batch_size:
            engine_round(engine, bs, 8, True)  # warm-up (and compile the schema once)
            plain, constrained = [], []
            for _ in range(ns.rounds):
                plain.append(engine_round(engine, bs, ns.output_len, False))
                constrained.append(engine_round(engine, bs, ns.output_len, True))
            tps_plain, tps_con = statistics.median(plain), statistics.median(constrained)
            step_ms = bs / tps_plain * 1e3  # per decode step: bs tokens
            mask = mask_ms(backend, tokenizer, bs)
            print(f"| {bs} | {tps_plain:.0f} | {tps_con:.0f} | {tps_con / tps_plain:.2f} | "
                  f"{step_ms:.2f} | {mask:.3f} | {mask / step_ms:.1%} |", flush=True)  # fmt: skip
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
