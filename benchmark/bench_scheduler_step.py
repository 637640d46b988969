"""Scheduler CPU work per decode step, in-process (no server): where the time outside
the model forward goes.

    python benchmark/bench_scheduler_step.py [--batch-size 1 32] [--output-len 128]
        [--num-threads 2] [--rounds 3] [--max-total-tokens N]

Runs the real Scheduler on the bundled demo model with fake queues (as
test/srt/test_scheduler.py does): `--batch-size` greedy requests of 128 prompt
tokens, streamed, decoded to `--output-len`. Each decode step is split into
  model    ModelRunner.forward (the model itself, logits included)
  worker   the rest of TpModelWorker.forward_batch_generation (ForwardBatch,
           attention metadata, sampling, .tolist())
  sched    the rest of Scheduler.step (receive, schedule, build the batch,
           process results, stop checks, emit the output message)
and the median of each over decode steps is printed per round. With
`--stub-model` the worker returns token 7 for every request without running the
model: "sched" alone, free of the forward's noise on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from sglang.test.fake_queue import FakeQueue

PROMPT_LEN = 128


class Clock:
    """Seconds spent inside a wrapped callable since the last reset."""

    def __init__(self) -> None:
        self.spent_s = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.spent_s += time.perf_counter() - start

        return timed


def build_scheduler(num_threads: int, max_total_tokens: int | None = None):
    from sglang.demo_models import demo_target_path
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context

    model_dir = str(demo_target_path())
    ctx = get_context().override_server_args(
        model_path=model_dir, device="cpu", num_threads=num_threads,
        max_total_tokens=max_total_tokens,
    )
    ctx.install()
    # the published model bag's dtype, as a server's scheduler builds it: dtype auto
    # resolved (float32 compute over a bf16 checkpoint on a CPU without native bf16);
    # ModelConfig(model_dir) alone would run the checkpoint's bf16 through F.linear
    config = ModelConfig.from_server_args()
    return Scheduler(TpModelWorker(config), config, None, FakeQueue(), FakeQueue(), FakeQueue())


def requests(batch_size: int, output_len: int, round_idx: int, vocab: int) -> list:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(round_idx)
    out = []
    for i in range(batch_size):
        params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
        params.normalize()
        ids = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
        out.append(
            TokenizedGenerateReqInput(
                rid=f"r{round_idx}-{i}", input_text=None, input_ids=ids,
                sampling_params=params, stream=True,
            )
        )  # fmt: skip
    return out


def stub_forward(batch):
    """forward_batch_generation without the model: token 7 for every request."""
    from sglang.srt.model_executor.forward_batch_info import GenerationBatchResult

    return GenerationBatchResult(next_token_ids=[7] * batch.batch_size)


def run_round(
    sched, batch_size: int, output_len: int, round_idx: int, stub: bool = False
) -> dict[str, float]:
    """Median ms per decode step of model / worker / sched over one round."""
    model, worker = Clock(), Clock()
    runner = sched.tp_worker.model_runner
    runner.forward = model.wrap(type(runner).forward.__get__(runner))
    tp_worker = sched.tp_worker
    forward = stub_forward if stub else type(tp_worker).forward_batch_generation.__get__(tp_worker)
    tp_worker.forward_batch_generation = worker.wrap(forward)
    for msg in requests(batch_size, output_len, round_idx, sched.vocab_size):
        sched.recv_from_tokenizer.send(msg)
    rows: dict[str, list[float]] = {"model": [], "worker": [], "sched": [], "step": []}
    while True:
        model.spent_s = worker.spent_s = 0.0
        decoding = len(sched.running) == batch_size and not sched.waiting_queue
        start = time.perf_counter()
        sched.step()
        step_s = time.perf_counter() - start
        sched.send_to_detokenizer.items.clear()
        if decoding and len(sched.running) == batch_size:
            rows["model"].append(model.spent_s)
            rows["worker"].append(worker.spent_s - model.spent_s)
            rows["sched"].append(step_s - worker.spent_s)
            rows["step"].append(step_s)
        if sched.is_idle():
            break
    return {name: statistics.median(v) * 1e3 for name, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--output-len", type=int, default=128)  # 128 + this <= 512 (context)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stub-model", action="store_true")
    parser.add_argument("--max-total-tokens", type=int, default=None,
                        help="KV pool size (the CPU default, 64 contexts, is 32,768 tokens of the demo "
                             "model: too few for 256 requests of 256 tokens)")
    args = parser.parse_args()
    sched = build_scheduler(args.num_threads, args.max_total_tokens)
    run_round(sched, 1, 8, -1)  # warm-up
    for r in range(args.rounds):
        for bs in args.batch_size:
            ms = run_round(sched, bs, args.output_len, r, args.stub_model)
            print(
                f"round {r} batch {bs:3d}: step {ms['step']:.3f} ms = model {ms['model']:.3f}"
                f" + worker {ms['worker']:.3f} + sched {ms['sched']:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
