"""Latency of one static batch: prefill, then decode steps, ours vs HF transformers.

    python -m sglang.bench_one_batch --model-path DIR --batch-size 1 32 \\
        --input-len 128 --output-len 32 [--num-threads 2] [--no-hf] [server flags]

Runs the model through TpModelWorker (no scheduler, no server) and, in the same
process, HF transformers' forward with its KV cache on the same token batch,
the two interleaved step by step; reports median latency, throughput and the
HF/ours latency ratio (> 1: we are faster).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang.bench_args import at_least_one
from sglang.srt.server_args import prepare_server_args

logger = logging.getLogger("sglang.bench_one_batch")
PROG = "python -m sglang.bench_one_batch"


@dataclass
class BenchArgs:
    batch_size: list[int]
    input_len: list[int]
    output_len: list[int]
    run_hf: bool
    seed: int


@dataclass
class Timing:
    prefill_s: float
    decode_s: float | None  # median seconds per decode step; None: none ran (output-len 1)

    def line(self, name: str, bs: int, input_len: int) -> str:
        prefill_tps = bs * input_len / self.prefill_s
        head = f"{name:>5}  prefill {self.prefill_s * 1e3:8.2f} ms {prefill_tps:9.0f} tok/s"
        if self.decode_s is None:
            return f"{head} | decode n/a (--output-len 1: no decode step)"
        decode_tps = bs / self.decode_s
        return f"{head} | decode {self.decode_s * 1e3:7.2f} ms/step {decode_tps:8.0f} tok/s"


def ratio_line(ours: Timing, hf: Timing) -> str:
    """HF's latency over ours (> 1: we are faster); decode n/a without a decode step."""
    decode = "n/a" if ours.decode_s is None else f"{hf.decode_s / ours.decode_s:.2f}x"
    return f"ratio hf/ours: prefill {hf.prefill_s / ours.prefill_s:.2f}x, decode {decode}"


def parse_args(argv: list[str] | None = None) -> tuple[BenchArgs, list[str]]:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="Every other flag is the server's (python -m sglang.launch_server --help): "
        "--model-path DIR, --dtype, --load-format, --num-threads, ...",
    )
    parser.add_argument("--batch-size", type=at_least_one, nargs="+", default=[1])
    parser.add_argument("--input-len", type=at_least_one, nargs="+", default=[128])
    parser.add_argument(
        "--output-len",
        type=at_least_one,
        nargs="+",
        default=[32],
        help="tokens generated per sequence, the first by the prefill (1: no decode step)",
    )
    parser.add_argument("--no-hf", action="store_true", help="skip the HF comparison")
    parser.add_argument("--seed", type=int, default=0)
    ns, server_argv = parser.parse_known_args(argv)
    bench = BenchArgs(ns.batch_size, ns.input_len, ns.output_len, not ns.no_hf, ns.seed)
    return bench, server_argv


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # HF's step returns before its kernels finish
    return time.perf_counter() - start


class OursRunner:
    """Our TpModelWorker on a static batch, driven by the test MiniScheduler."""

    def __init__(self, worker, prompts: list[list[int]]) -> None:
        from sglang.test.runner_utils import MiniScheduler

        self.sched, self.prompts, self.reqs = MiniScheduler(worker), prompts, []

    def prefill(self) -> float:
        from sglang.test.runner_utils import MiniReq

        self.close()
        self.reqs = [MiniReq(list(p)) for p in self.prompts]
        batch = self.sched.build_extend(self.reqs)  # scheduler bookkeeping is not timed
        return _timed(lambda: self.sched.run(self.reqs, batch))

    def decode(self) -> float:
        batch = self.sched.build_decode(self.reqs)
        return _timed(lambda: self.sched.run(self.reqs, batch))

    def close(self) -> None:
        self.sched.release(self.reqs)


class HFRunner:
    """HF forward with its own KV cache, greedy, on the same batch (equal lengths)."""

    def __init__(self, model, prompts: list[list[int]]) -> None:
        self.model, self.ids, self.out = model, torch.tensor(prompts, device=model.device), None

    @torch.inference_mode()
    def prefill(self) -> float:
        return _timed(lambda: setattr(self, "out", self.model(self.ids, use_cache=True)))

    @torch.inference_mode()
    def decode(self) -> float:
        nxt = self.out.logits[:, -1].argmax(-1, keepdim=True)
        past = self.out.past_key_values
        return _timed(lambda: setattr(self, "out", self.model(nxt, past_key_values=past)))

    def close(self) -> None:
        self.out = None


def measure(runners: list, output_len: int, prefill_repeats: int = 3) -> list[Timing]:
    """Median prefill and decode-step latency of each runner, their steps interleaved so
    load from other processes hits all of them alike."""
    prefill: list[list[float]] = [[] for _ in runners]
    decode: list[list[float]] = [[] for _ in runners]
    for _ in range(prefill_repeats):
        for times, runner in zip(prefill, runners):
            times.append(runner.prefill())
    for _ in range(output_len - 1):
        for times, runner in zip(decode, runners):
            times.append(runner.decode())
    for runner in runners:
        runner.close()
    return [
        Timing(statistics.median(p), statistics.median(d) if d else None)
        for p, d in zip(prefill, decode)
    ]


def _runners(worker, hf_model, prompts: list[list[int]]) -> list:
    runners = [OursRunner(worker, prompts)]
    if hf_model is not None:
        runners.append(HFRunner(hf_model, prompts))
    return runners


def run(bench: BenchArgs, worker, hf_model) -> list[dict]:
    gen = torch.Generator().manual_seed(bench.seed)
    vocab = worker.model_config.vocab_size
    results = []
    for bs, il, ol in itertools.product(bench.batch_size, bench.input_len, bench.output_len):
        prompts = torch.randint(3, vocab, (bs, il), generator=gen).tolist()
        measure(_runners(worker, hf_model, prompts[:1]), 2, 1)  # warm up this shape's paths
        timings = measure(_runners(worker, hf_model, prompts), ol)
        logger.info("batch %d, input %d, output %d", bs, il, ol)
        row = {"bs": bs, "input_len": il, "output_len": ol}
        for name, timing in zip(("ours", "hf"), timings):
            logger.info(timing.line(name, bs, il))
            row[name] = timing
        if len(timings) == 2:
            logger.info(ratio_line(*timings))
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import publish

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench, server_argv = parse_args(argv)
    publish(prepare_server_args(server_argv, prog=PROG), role="scheduler")
    worker = TpModelWorker()
    runner = worker.model_runner
    check_lengths(bench, runner.context_len)
    check_fits_pool(bench, runner.max_total_num_tokens, runner.req_to_token_pool.size)
    logger.info("%s, torch threads %d", worker.model_config, torch.get_num_threads())
    hf_model = load_hf_for_bench(worker) if bench.run_hf else None
    return run(bench, worker, hf_model)


def check_lengths(bench: BenchArgs, context_len: int) -> None:
    """A ValueError naming the case whose input + output is past the context (it would
    fail deep in the KV bookkeeping)."""
    for il, ol in itertools.product(bench.input_len, bench.output_len):
        if il + ol > context_len:
            raise ValueError(
                f"--input-len {il} + --output-len {ol} is longer than the model's context "
                f"length ({context_len}); pass --context-length or shorter lengths"
            )


def check_fits_pool(bench: BenchArgs, pool_tokens: int, request_slots: int) -> None:
    """A ValueError naming the case whose batch the KV pool or its request slots cannot
    hold at once (it failed on an assertion deep in the slot bookkeeping)."""
    for bs, il, ol in itertools.product(bench.batch_size, bench.input_len, bench.output_len):
        if bs > request_slots:
            raise ValueError(
                f"--batch-size {bs} is more than the {request_slots} request slots; pass "
                "--max-running-requests or a smaller batch"
            )
        if bs * (il + ol) > pool_tokens:
            raise ValueError(
                f"--batch-size {bs} x (--input-len {il} + --output-len {ol}) tokens is more "
                f"than the KV pool holds ({pool_tokens}); pass --max-total-tokens or smaller "
                "shapes"
            )


def load_hf_for_bench(worker):
    """HF transformers' model on our device and dtype. Attention: eager on cpu (the figures
    in benchmark/RESULTS.md), HF's default sdpa on a GPU. With `--load-format dummy`,
    random weights from the config (the timing compares no outputs)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path, dtype = worker.model_config.model_path, worker.model_config.dtype
    attn = "eager" if worker.device.type == "cpu" else "sdpa"
    if worker.model_runner.load_format == "dummy":
        config = AutoConfig.from_pretrained(path)
        with torch.device(worker.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    return model.to(worker.device).eval()


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as exc:  # a refused flag or length: one line
        sys.exit(f"bench_one_batch: error: {exc}")
