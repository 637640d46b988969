"""CPU matmul micro-benchmark: F.linear on [out, in] vs x @ W_t on a contiguous [in, out]
(--variants layout), or vs our small-M kernel over float32 and bf16 weights (--variants
small-m), or our kernel's one-row GEMV over bf16 weights with float32 and bf16 x, in GB/s of
weight read (--variants one-row; use --ms 1 and --cold-mib past the L3), or float32 x over
a bf16 weight's rows vs its load-time panels (--variants panels-f32 [--march x86-64-v3]).

    python benchmark/bench_linear_layout.py [--threads 1 2] [--ms 1 4 8 32 256] [--reps 100]
        [--cold-mib 64] [--variants layout|small-m|one-row] [--shapes demo|qwen3-0.6b]

For each weight shape (the demo model's linears and lm_head, plus the shapes of
issue 13) and each batch M, the variants run interleaved in one process
(A, B, C, A, B, C, ... for --reps rounds) so machine noise hits all alike; the
table gives each variant's median in microseconds and its speed-up over F.linear.

By default one weight is multiplied again and again, so it stays in L2 (hot).
With --cold-mib N each call takes the next of enough copies of the weight to
fill N MiB, as in a model forward, where ~26 MB of weights (demo model) pass
through a 2 MiB-per-core L2 every step and each matmul reads its weight from L3.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from sglang.srt import huge_pages
from sglang.srt.layers import cpu_kernels

# (in, out): demo model qkv 256->512, o 256->256, gate_up 256->1408, down 704->256,
# lm_head 256->8192, and the brief's 256->768, 256->1376, 688->256
SHAPES = [(256, 512), (256, 768), (256, 256), (256, 1408), (256, 1376), (704, 256),
          (688, 256), (256, 8192)]
# Qwen3-0.6B: qkv 1024->4096, o 2048->1024, gate_up 1024->6144, down 3072->1024
QWEN3_SHAPES = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]


def variants(w: torch.Tensor, bias: torch.Tensor):
    """name -> fn(x) over one copy of the weight, in each layout."""
    w_t = w.t().contiguous()
    return {
        "F.linear": lambda x: F.linear(x, w),
        "F.linear+b": lambda x: F.linear(x, w, bias),
        "x@W_t": lambda x: x @ w_t,
        "mm(W_t)": lambda x: torch.mm(x, w_t),
        "addmm(b,W_t)": lambda x: torch.addmm(bias, x, w_t),
        # the [out, in] parameter a layer keeps when its storage is [in, out]
        "F.linear(W_t.t())": lambda x: F.linear(x, w_t.t()),
    }


def small_m_variants(w: torch.Tensor, bias: torch.Tensor):
    """name -> fn(x): F.linear, our kernel (sgl-kernel gemm.cpp) over the float32 weight
    and over its bf16 copy (a bf16 checkpoint's weights kept in bf16 under float32
    compute), and F.linear over that bf16 copy widened per call (the large-M path)."""
    kernel = cpu_kernels.load()
    w_bf16 = w.bfloat16()

    def ours(x, weight):
        out = torch.empty(x.shape[0], weight.shape[0])
        kernel.linear_small_m(out, x, weight)
        return out

    return {
        "F.linear": lambda x: F.linear(x, w),
        "ours": lambda x: ours(x, w),
        "ours(bf16 w)": lambda x: ours(x, w_bf16),
        "F.linear(bf16 w widened)": lambda x: F.linear(x, w_bf16.float()),
    }


def one_row_variants(w: torch.Tensor, bias: torch.Tensor):
    """name -> fn(x): F.linear, and our kernel over the weight's bf16 copy with float32 x
    (the half-weight path) and with bf16 x (`dtype auto` on a CPU with the bf16 dot)."""
    kernel = cpu_kernels.load()
    w_bf16 = huge_pages.empty(w.shape, torch.bfloat16).copy_(w)  # as the loader places it

    def ours(x, out_dtype):
        out = torch.empty(x.shape[0], w_bf16.shape[0], dtype=out_dtype)
        kernel.linear_small_m(out, x.to(out_dtype), w_bf16)
        return out

    return {
        "F.linear": lambda x: F.linear(x, w),
        "ours(f32 x, bf16 w)": lambda x: ours(x, torch.float32),
        "ours(bf16 x, bf16 w)": lambda x: ours(x, torch.bfloat16),
    }


def bf16_variants(w: torch.Tensor, bias: torch.Tensor):
    """name -> fn(x) for bf16 x over a bf16 weight (`dtype auto` on a CPU with native bf16):
    F.linear (oneDNN, which reorders the weight per call), our small-M kernel, linear_packed
    over the load-time panels (AMX tiles where the CPU has them, else the bf16 dot
    product), and oneDNN over a weight reordered once (torch.ops.mkldnn, what inductor's
    freezing uses)."""
    kernel = cpu_kernels.load()
    w_bf16 = huge_pages.empty(w.shape, torch.bfloat16).copy_(w)
    panels = kernel.pack_weight_panels(w_bf16)
    reordered = torch.ops.mkldnn._reorder_linear_weight(w_bf16)

    def ours(x, fn, *extra):
        out = torch.empty(x.shape[0], w_bf16.shape[0], dtype=torch.bfloat16)
        fn(out, x, w_bf16, None, *extra)
        return out

    return {
        "F.linear": lambda x: F.linear(x, w_bf16),
        "small-M": lambda x: ours(x, kernel.linear_small_m),
        "packed (panels)": lambda x: ours(x, kernel.linear_packed, panels),
        "oneDNN prepacked": lambda x: torch.ops.mkldnn._linear_pointwise(
            x, reordered, None, "none", [], ""
        ),
    }


def panels_f32_variants(w: torch.Tensor, bias: torch.Tensor, kernel=None):
    """name -> fn(x) for float32 x over a bf16 weight (a bf16 checkpoint under float32
    compute): the small-M kernel over the row-major weight, the GEMV over the load-time
    panels (linear_panels_small_m), and linear_packed's tiles over the same panels."""
    kernel = kernel or cpu_kernels.load()
    w_bf16 = huge_pages.empty(w.shape, torch.bfloat16).copy_(w)
    panels = kernel.pack_weight_panels(w_bf16)
    shape_only = torch.empty(w.shape, dtype=torch.bfloat16, device="meta")

    def ours(x, fn, weight, *extra):
        out = torch.empty(x.shape[0], weight.shape[0])
        fn(out, x, weight, None, *extra)
        return out

    return {
        "F.linear": lambda x: F.linear(x, w),
        "small-M (rows)": lambda x: ours(x, kernel.linear_small_m, w_bf16),
        "GEMV (panels)": lambda x: ours(x, kernel.linear_panels_small_m, shape_only, panels),
        "packed (panels)": lambda x: ours(x, kernel.linear_packed, shape_only, panels),
    }


def time_interleaved(copies: list[dict], x: torch.Tensor, reps: int, inner: int) -> dict:
    """Median us per call of each variant; call i uses copy i mod len(copies)."""
    names = list(copies[0])
    samples: dict[str, list[float]] = {k: [] for k in names}
    calls = max(inner, len(copies))
    for name in names:  # warm up
        for c in copies[:5]:
            c[name](x)
    for _ in range(reps):
        for name in names:
            fns = [c[name] for c in copies]
            t0 = time.perf_counter()
            for i in range(calls):
                fns[i % len(fns)](x)
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 4, 8, 32, 256])
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--cold-mib", type=float, default=0,
                   help="cycle through copies of each weight filling this many MiB (0: one copy)")
    p.add_argument("--variants", choices=["layout", "small-m", "one-row", "bf16", "panels-f32"],
                   default="layout")
    p.add_argument("--march", default=None,
                   help="panels-f32: kernels built for this -march (x86-64-v3: the AVX2 build)")
    p.add_argument("--shapes", choices=["demo", "qwen3-0.6b"], default="demo")
    args = p.parse_args()
    make = {"layout": variants, "small-m": small_m_variants, "one-row": one_row_variants,
            "bf16": bf16_variants, "panels-f32": panels_f32_variants}[args.variants]
    if args.march and args.variants != "panels-f32":
        p.error("--march applies to --variants panels-f32")
    if args.march:
        kernel = cpu_kernels.build_for_march(args.march)
        print(f"kernels built for -march={args.march}: {kernel.vector_isa} vectors")
        make = functools.partial(make, kernel=kernel)
    shapes = SHAPES if args.shapes == "demo" else QWEN3_SHAPES
    torch.manual_seed(0)
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            cache = f"cold, {args.cold_mib:g} MiB of copies" if args.cold_mib else "hot"
            print(f"\n## threads {threads}, {cache} (median us; speed-up vs F.linear in brackets)")
            names = None
            for k, n in shapes:
                n_copies = max(1, int(args.cold_mib * 2**20 // (k * n * 4)))
                copies = [make(torch.randn(n, k) * 0.02, torch.randn(n) * 0.02)
                          for _ in range(n_copies)]
                if names is None:
                    names = list(copies[0])
                    print("| in x out | M | " + " | ".join(names) + " |")
                    print("|---" * (len(names) + 2) + "|")
                for m in args.ms:
                    x = torch.randn(m, k)
                    if args.variants == "bf16":
                        x = x.bfloat16()
                    inner = max(1, int(2e6 // (m * k * n) + 1))
                    med = time_interleaved(copies, x, args.reps, min(inner, 50))
                    base = med["F.linear"]
                    cells = [f"{med[v]:.1f} ({base / med[v]:.2f})" for v in names]
                    if args.variants == "one-row":  # bf16 weight bytes per microsecond
                        cells[1:] = [f"{c} {k * n * 2 / med[v] / 1e3:.1f} GB/s"
                                     for c, v in zip(cells[1:], names[1:])]  # fmt: skip
                    print(f"| {k}x{n} | {m} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
