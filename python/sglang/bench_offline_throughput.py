"""Offline throughput of the Engine on random-token prompts.

    python -m sglang.bench_offline_throughput --model-path DIR --num-prompts 256 \\
        --random-input-len 128 --random-output-len 128

Every server flag is accepted too (e.g. --num-threads 2, --disable-radix-cache).
Prompts are random token ids (seeded); outputs run to max_new_tokens (ignore_eos).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from typing import Any

from sglang.srt.server_args import (
    ServerArgs,
    build_parser,
    resolution_result,
    server_args_from_namespace,
)

logger = logging.getLogger(__name__)

PROG = "python -m sglang.bench_offline_throughput"
WARMUP_OUTPUT_LEN = 8  # tokens each warm-up prompt generates (at most --random-output-len)
# (flag, lowest accepted value) of the benchmark's counts and lengths
_LOWEST = (
    ("--num-prompts", 1),
    ("--random-input-len", 1),
    ("--random-output-len", 1),
    ("--warmup-prompts", 0),
)

_BENCH_ARGS = (
    "num_prompts",
    "random_input_len",
    "random_output_len",
    "seed",
    "warmup_prompts",
    "result_file",
)


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("benchmark")
    group.add_argument("--num-prompts", type=int, default=256)
    group.add_argument("--random-input-len", type=int, default=128)
    group.add_argument("--random-output-len", type=int, default=128)
    group.add_argument("--seed", type=int, default=1)
    group.add_argument("--warmup-prompts", type=int, default=4)
    group.add_argument("--result-file", type=str, default=None, help="append a JSON line")


def random_prompts(num: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Token-id prompts, avoiding the lowest ids (special tokens in our tokenizers)."""
    rng = random.Random(seed)
    low = min(16, vocab_size - 1)
    return [[rng.randrange(low, vocab_size) for _ in range(input_len)] for _ in range(num)]


def run_benchmark(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    num_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    num_in = sum(len(p) for p in prompts)
    return {
        "num_prompts": len(prompts),
        "elapsed_s": round(elapsed, 3),
        "request_throughput": round(len(prompts) / elapsed, 3),
        "output_token_throughput": round(num_out / elapsed, 1),
        "total_token_throughput": round((num_in + num_out) / elapsed, 1),
        "output_tokens": num_out,
    }


def build_bench_parser() -> argparse.ArgumentParser:
    """The server's flags plus the benchmark's, under this script's name."""
    parser = build_parser(prog=PROG)
    add_bench_args(parser)
    return parser


def checked_server_args(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> ServerArgs:
    """The resolved ServerArgs of `ns`; a count, length or server flag the run cannot
    take exits 2 through `parser`, naming the flag, before any engine starts."""
    check_counts(parser, ns)
    server_args = server_args_from_namespace(parser, ns)
    try:
        server_args.resolve_once()  # the Engine's own resolution, done early: idempotent
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    check_context(parser, ns, resolution_result(server_args, "context_length"))
    return server_args


def check_counts(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    for flag, lowest in _LOWEST:
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value < lowest:
            parser.error(f"{flag} {value}: must be >= {lowest}")


def check_context(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, context_len: int | None
) -> None:
    """Refuse prompts + outputs past the context (None: not known before the model
    loads, e.g. a hub id: the engine checks each request)."""
    if context_len is None:
        return
    il, ol = ns.random_input_len, ns.random_output_len
    if il + ol > context_len:
        parser.error(
            f"--random-input-len {il} + --random-output-len {ol} is longer than the model's "
            f"context length ({context_len}); pass --context-length or shorter lengths"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_bench_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(ns.log_level).upper(), logging.INFO))
    server_args = checked_server_args(parser, ns)
    from sglang.srt.entrypoints.engine import Engine

    with Engine(server_args=server_args) as engine:
        vocab = engine.tokenizer_manager.model_config.vocab_size
        warm = random_prompts(ns.warmup_prompts, ns.random_input_len, vocab, ns.seed + 1)
        if warm:
            run_benchmark(engine, warm, min(WARMUP_OUTPUT_LEN, ns.random_output_len))
        prompts = random_prompts(ns.num_prompts, ns.random_input_len, vocab, ns.seed)
        result = run_benchmark(engine, prompts, ns.random_output_len)
    _report(result, ns)
    return result


def _report(result: dict[str, Any], ns: argparse.Namespace) -> None:
    lines = [
        "============ Offline Throughput Benchmark Result ============",
        f"Prompts:                    {result['num_prompts']}",
        f"Input / output len:         {ns.random_input_len} / {ns.random_output_len}",
        f"Elapsed (s):                {result['elapsed_s']}",
        f"Request throughput (req/s): {result['request_throughput']}",
        f"Output tokens/s:            {result['output_token_throughput']}",
        f"Total tokens/s:             {result['total_token_throughput']}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    if ns.result_file:
        with open(ns.result_file, "a") as fh:
            fh.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
