"""Decode and prefill with our CPU kernels (sgl-kernel/csrc/cpu) vs the torch ops, in one
process, steps alternating.

    python benchmark/bench_cpu_kernels.py [--batch-size 1 8 32] [--input-len 128]
        [--output-len 64] [--rounds 3] [--profile] [server flags, e.g. --num-threads 1]

One TpModelWorker (default: the bundled demo model) and two static batches of the same
prompts; one runs with the kernels, the other inside `cpu_kernels.disabled()`. Their
steps alternate, A B A B, so load from other processes hits both alike; the table gives
the median decode step and prefill of each, and the speed-up. `--profile` prints the
top ops of 20 decode steps of each side (torch.profiler).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics

import torch

from sglang.bench_one_batch import OursRunner
from sglang.srt.layers import cpu_kernels
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import prepare_server_args

logger = logging.getLogger(__name__)


class SideRunner:
    """An OursRunner whose steps run with the kernels on or off."""

    def __init__(self, inner: OursRunner, kernels: bool) -> None:
        self.inner, self.kernels = inner, kernels

    def _mode(self):
        return contextlib.nullcontext() if self.kernels else cpu_kernels.disabled()

    def prefill(self) -> float:
        with self._mode():
            return self.inner.prefill()

    def decode(self) -> float:
        with self._mode():
            return self.inner.decode()

    def close(self) -> None:
        self.inner.close()


def measure(worker, bs: int, input_len: int, output_len: int, rounds: int) -> dict:
    vocab = worker.model_config.vocab_size
    prompts = torch.randint(3, vocab, (bs, input_len)).tolist()
    sides = [SideRunner(OursRunner(worker, prompts), k) for k in (True, False)]
    for side in sides:  # warm-up: the first prefill of a shape pays one-time set-up
        side.prefill()
        side.decode()
        side.close()
    decode: list[list[float]] = [[], []]
    prefill: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, side in enumerate(sides):
            prefill[i].append(side.prefill())
        for _ in range(output_len - 1):
            for i, side in enumerate(sides):
                decode[i].append(side.decode())
        for side in sides:
            side.close()
    row = {"bs": bs}
    for name, d, p in zip(("kernels", "torch"), decode, prefill):
        row[f"{name} decode ms"] = statistics.median(d) * 1e3
        row[f"{name} prefill ms"] = statistics.median(p) * 1e3
    row["decode speed-up"] = row["torch decode ms"] / row["kernels decode ms"]
    row["prefill speed-up"] = row["torch prefill ms"] / row["kernels prefill ms"]
    return row


def profile(worker, bs: int, input_len: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    prompts = torch.randint(3, worker.model_config.vocab_size, (bs, input_len)).tolist()
    for kernels in (True, False):
        side = SideRunner(OursRunner(worker, prompts), kernels)
        side.prefill()
        for _ in range(5):
            side.decode()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                side.decode()
        side.close()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        print(f"\n{'kernels' if kernels else 'torch ops'}, batch {bs}, 20 decode steps\n{table}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args, server_argv = parser.parse_known_args()
    publish(prepare_server_args(server_argv), role="scheduler")
    worker = TpModelWorker()
    if cpu_kernels.load() is None:
        raise SystemExit("the CPU kernels could not be built (see the log)")
    logger.info("%s, torch threads %d", worker.model_config, torch.get_num_threads())
    rows = [
        measure(worker, bs, args.input_len, args.output_len, args.rounds) for bs in args.batch_size
    ]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print(
            "| "
            + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values())
            + " |"
        )
    if args.profile:
        profile(worker, args.batch_size[0], args.input_len)


if __name__ == "__main__":
    main()
