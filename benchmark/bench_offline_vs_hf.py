"""Our offline Engine vs HF transformers static-batch `generate`, same prompts, one run.

    python benchmark/bench_offline_vs_hf.py --model-path DIR [--num-prompts 256]
        [--input-len 128] [--output-len 128] [--hf-batch-size 32] [--num-threads 2]

Prompts are random token ids (seeded, all the same length, so HF needs no
padding). Both sides are greedy and generate exactly --output-len tokens
(ignore_eos / min_new_tokens). Prints output tokens/s for each and the ratio, and
the matmul floor: the time the run's linear layers alone take at the GEMM speed of
`F.linear` on 256 rows (each weight shape timed on this machine, HF's dtype), and the
fraction of it our run reaches (floor time / our time; the issue's target is >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--hf-num-prompts", type=int, default=None,
                   help="prompts for HF (default: same as --num-prompts)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--hf-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="HF's compute dtype (ours follows --dtype auto: the log says which)")
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--engine-args", type=str, default="{}",
                   help='extra Engine fields as JSON, e.g. \'{"chunked_prefill_size": 512}\'')
    return p.parse_args(argv)


def run_ours(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    from sglang.bench_offline_throughput import run_benchmark
    from sglang.srt.entrypoints.engine import Engine

    extra = json.loads(args.engine_args)
    with Engine(model_path=args.model_path, num_threads=args.num_threads, log_level="warning",
                **extra) as engine:
        run_benchmark(engine, prompts[:4], 8)  # warm-up
        return run_benchmark(engine, prompts, args.output_len)


def run_hf(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.num_threads)
    dtype = getattr(torch, args.hf_dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).eval()
    gen = dict(max_new_tokens=args.output_len, min_new_tokens=args.output_len, do_sample=False,
               pad_token_id=0)
    bs = args.hf_batch_size
    with torch.inference_mode():
        warm = torch.tensor(prompts[:2])
        model.generate(warm, attention_mask=torch.ones_like(warm),
                       **{**gen, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        num_out = 0
        for i in range(0, len(prompts), bs):
            batch = torch.tensor(prompts[i : i + bs])
            out = model.generate(batch, attention_mask=torch.ones_like(batch), **gen)
            num_out += (out.shape[1] - batch.shape[1]) * batch.shape[0]
        elapsed = time.perf_counter() - start
    return {"elapsed_s": round(elapsed, 3), "output_tokens": num_out,
            "output_token_throughput": round(num_out / elapsed, 1),
            "matmul_floor": matmul_floor(model, args)}


def matmul_floor(model, args: argparse.Namespace, rows: int = 256, calls: int = 20) -> dict:
    """Seconds the run's linears take at `F.linear`'s speed on `rows` rows. Every layer
    linear runs on every prompt and fed-back token; the lm_head on each sampled one."""
    import torch

    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    tokens = args.num_prompts * (args.input_len + args.output_len - 1)
    sampled = args.num_prompts * args.output_len
    flop = 2 * (tokens * sum(m.weight.numel() for m in linears) + sampled * head.weight.numel())
    seconds_per_flop = {}
    with torch.inference_mode():
        for weight in {tuple(m.weight.shape): m.weight for m in [*linears, head]}.values():
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
            torch.nn.functional.linear(x, weight)  # warm-up
            start = time.perf_counter()
            for _ in range(calls):
                torch.nn.functional.linear(x, weight)
            seconds = (time.perf_counter() - start) / calls
            seconds_per_flop[tuple(weight.shape)] = seconds / (2 * rows * weight.numel())
    floor_s = 2 * sampled * head.weight.numel() * seconds_per_flop[tuple(head.weight.shape)]
    floor_s += sum(2 * tokens * m.weight.numel() * seconds_per_flop[tuple(m.weight.shape)]
                   for m in linears)  # fmt: skip
    return {"floor_s": round(floor_s, 3), "gflop": round(flop / 1e9, 1),
            "gflop_per_s": round(flop / floor_s / 1e9, 1)}


def main(argv: list[str] | None = None) -> dict:
    from sglang.bench_offline_throughput import random_prompts
    from sglang.srt.configs.model_config import ModelConfig

    args = parse_args(argv)
    vocab = ModelConfig(args.model_path).vocab_size
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
    hf_prompts = prompts[: args.hf_num_prompts or args.num_prompts]
    ours = run_ours(args, prompts)
    hf = run_hf(args, hf_prompts)
    ratio = ours["output_token_throughput"] / hf["output_token_throughput"]
    floor = hf["matmul_floor"]
    floor["fraction_of_ours"] = round(floor["floor_s"] / ours["elapsed_s"], 2)
    report = {"ours": ours, "hf": hf, "ratio": round(ratio, 2),
              "config": {k: v for k, v in vars(args).items()}}
    sys.stdout.write(
        f"ours: {ours['output_token_throughput']} out tok/s ({len(prompts)} prompts)\n"
        f"HF generate (batch {args.hf_batch_size}): {hf['output_token_throughput']} out tok/s "
        f"({len(hf_prompts)} prompts)\n"
        f"ratio ours/HF: {ratio:.2f}\n"
        f"matmul floor: {floor['floor_s']} s ({floor['gflop']} GFLOP at F.linear's "
        f"{floor['gflop_per_s']} GFLOP/s on 256 rows); ours {ours['elapsed_s']} s = "
        f"{floor['fraction_of_ours']:.2f} of the floor's speed\n"
        f"{json.dumps(report)}\n"
    )
    return report


if __name__ == "__main__":
    main()
