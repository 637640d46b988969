"""Decode attention over K/V pools of each --kv-cache-dtype, the CPU kernel, in one process.

    python benchmark/bench_kv_dtype_attention.py [--batch-size 1 32 256] [--kv-len 192]
        [--shape demo qwen3-0.6b] [--kv-dtypes float32 bfloat16 fp8_e4m3 fp8_e5m2]
        [--calls 30] [--rounds 5]

One decode attention call (`paged_attention`, float32 q, save_kv off) per layer over a
pool of `batch x kv_len` keys per layer, with as many layers as the model shape has, so
that a batch's pool does not stay in cache from one call to the next (as in a decode
step, where the other layers' K/V and weights pass through in between). Each request's
slots are a contiguous run, as a fresh pool hands them out. The dtypes take turns,
A B C D A B C D, `--rounds` times `--calls` calls each; the table gives the median
per-layer time of each dtype, its GB/s of K/V read, and its speed-up over bfloat16 (the
default pool of a bf16 checkpoint on a CPU without native bf16).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglang.srt.layers import cpu_kernels

KV_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
# name -> (query heads, KV heads, head_dim, layers)
SHAPES = {"demo": (4, 2, 64, 6), "qwen3-0.6b": (16, 8, 128, 28)}
NO_EXTEND = torch.empty(0, dtype=torch.int64)


class Case:
    """One dtype's pools (one per layer), queries and call arguments."""

    def __init__(self, dtype: torch.dtype, shape: tuple, batch: int, kv_len: int) -> None:
        hq, hkv, d, layers = shape
        gen = torch.Generator().manual_seed(0)
        slots = batch * kv_len + 1  # slot 0: padding
        self.pools = [torch.randn(slots, 2, hkv, d, generator=gen).to(dtype) for _ in range(layers)]
        self.q = torch.randn(batch, hq * d, generator=gen)
        self.out = torch.empty_like(self.q)
        table = 1 + torch.arange(batch * kv_len, dtype=torch.int32).view(batch, kv_len)
        self.table = table
        self.rows = torch.arange(batch, dtype=torch.int64)
        self.lens = torch.full((batch,), kv_len, dtype=torch.int64)
        self.loc = table[:, -1].to(torch.int64)
        self.scale = d**-0.5
        self.kv_bytes = batch * kv_len * 2 * hkv * d * self.pools[0].element_size()

    def step_s(self, kernels) -> float:
        """Seconds per layer of one pass over every layer's pool."""
        start = time.perf_counter()
        for pool in self.pools:
            kernels.paged_attention(self.out, self.q, self.q, self.q, pool, self.loc, self.table,
                                    self.rows, self.lens, NO_EXTEND, self.scale, 0.0, 0, False)  # fmt: skip
        return (time.perf_counter() - start) / len(self.pools)


def run(kernels, args: argparse.Namespace, shape_name: str, batch: int) -> None:
    cases = {n: Case(KV_DTYPES[n], SHAPES[shape_name], batch, args.kv_len) for n in args.kv_dtypes}
    times: dict[str, list[float]] = {n: [] for n in cases}
    for case in cases.values():  # warm-up
        case.step_s(kernels)
    for _ in range(args.rounds):
        for n, case in cases.items():
            times[n] += [case.step_s(kernels) for _ in range(args.calls)]
    base = statistics.median(times["bfloat16"]) if "bfloat16" in times else None
    for n, case in cases.items():
        med = statistics.median(times[n])
        vs = f"{base / med:.2f}x" if base else "-"
        print(f"| {shape_name} | {batch} | {args.kv_len} | {n} | {med * 1e3:.3f} | "
              f"{case.kv_bytes / med / 1e9:.1f} | {vs} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--kv-len", type=int, default=192)
    p.add_argument("--shape", nargs="+", default=["demo"], choices=list(SHAPES))
    p.add_argument("--kv-dtypes", nargs="+", default=list(KV_DTYPES), choices=list(KV_DTYPES))
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    kernels = cpu_kernels.load()
    if kernels is None:
        raise SystemExit("the CPU kernels could not be built (see the log)")
    print(f"threads: {torch.get_num_threads()}")
    print("| shape | batch | kv_len | KV dtype | ms per layer | K/V GB/s | vs bfloat16 |")
    print("|---|---|---|---|---|---|---|")
    for shape_name in args.shape:
        for batch in args.batch_size:
            run(kernels, args, shape_name, batch)


if __name__ == "__main__":
    main()
