"""Speculative decoding on the demo pair: decode tokens/s with and without, same run.

    python benchmark/bench_speculative.py [--batch-size 1 4 16 64] [--output-len 128]
        [--rounds 2] [--num-threads 2] [--threshold 1000]

One Engine per configuration (plain; NGRAM --ngram-k; STANDALONE --standalone-k), all alive at
once; each round runs every configuration on the same prompts, in turn, so load
from elsewhere hits all alike; the table gives the median over rounds of output
tokens / wall seconds (greedy, ignore_eos: equal work), its ratio to plain, and
the accept length (completion tokens / spec_verify_ct, so > 1 means rounds kept
more than one token). Two prompt sets: "repetitive" (rewrite a 20-line function
with type hints: the answer repeats the prompt) and "free" (short story starts).
--threshold sets --speculative-disable-by-batch-size for every spec engine (the
default 1000 measures raw speculation at every batch size; pass the server's
default to see the fallback at work). Per-forward decode times of the target and
the draft (bench_one_batch, batch 1) come first.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import sglang as sgl
from sglang.demo_models import demo_draft_path, demo_target_path

FUNCTION = "\n".join(
    f"def step_{i}(values, offset):\n    return [v * {i} + offset for v in values]"
    for i in range(10)
)


def configs(ngram_ks: list[int], standalone_ks: list[int]) -> dict[str, dict]:
    out: dict[str, dict] = {"plain": {}}
    for k in ngram_ks:
        out[f"ngram k={k}"] = dict(speculative_algorithm="NGRAM", speculative_num_steps=k)
    for k in standalone_ks:
        out[f"standalone k={k}"] = dict(speculative_algorithm="STANDALONE", speculative_num_steps=k)
    return out


def prompt_sets(batch_size: int) -> dict[str, list[str]]:
    return {
        "repetitive": [f"# file {i}\nRewrite with type hints:\n{FUNCTION}\n" for i in range(batch_size)],
        "free": [f"Story {i}: once upon a time, a little" for i in range(batch_size)],
    }  # fmt: skip


def decode_ms(model_path: str, threads: int) -> float:
    """bench_one_batch's median decode step at batch 1 (input 128)."""
    cmd = [sys.executable, "-m", "sglang.bench_one_batch", "--model-path", model_path,
           "--batch-size", "1", "--input-len", "128", "--output-len", "64", "--no-hf",
           "--num-threads", str(threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = done.stdout + done.stderr
    return float(re.search(r"decode\s+([\d.]+) ms/step", out).group(1))


def run_once(engine, texts: list[str], output_len: int) -> tuple[float, float]:
    params = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    outs = engine.generate(texts, params)
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    rounds = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    return tokens / wall, (tokens / rounds if rounds else float("nan"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--threshold", type=int, default=1000)
    p.add_argument("--ngram-k", type=int, nargs="*", default=[3])
    p.add_argument("--standalone-k", type=int, nargs="*", default=[1, 2, 3, 4])
    ns = p.parse_args()
    target, draft = str(demo_target_path()), str(demo_draft_path())
    t_ms, d_ms = decode_ms(target, ns.num_threads), decode_ms(draft, ns.num_threads)
    print(f"decode step at batch 1: target {t_ms:.2f} ms, draft {d_ms:.2f} ms "
          f"(draft/target {d_ms / t_ms:.2f})")  # fmt: skip
    common = dict(model_path=target, num_threads=ns.num_threads, log_level="warning",
                  random_seed=0, max_running_requests=max(ns.batch_size))  # fmt: skip
    engines = {}
    try:
        for name, extra in configs(ns.ngram_k, ns.standalone_k).items():
            if extra:
                extra = {**extra, "speculative_disable_by_batch_size": ns.threshold}
            engines[name] = sgl.Engine(**common, **extra)
        print("| prompts | batch | config | tok/s | vs plain | accept length |")
        print("|---|---|---|---|---|---|")
        for bs in ns.batch_size:
            for kind, texts in prompt_sets(bs).items():
                for engine in engines.values():
                    run_once(engine, texts, 8)  # warm-up
                tps = {name: [] for name in engines}
                accept = {name: [] for name in engines}
                for _ in range(ns.rounds):
                    for name, engine in engines.items():
                        t, a = run_once(engine, texts, ns.output_len)
                        tps[name].append(t)
                        accept[name].append(a)
                plain = statistics.median(tps["plain"])
                for name in engines:
                    med = statistics.median(tps[name])
                    acc = statistics.median(accept[name])
                    acc_text = "" if acc != acc else f"{acc:.2f}"  # nan: plain
                    print(f"| {kind} | {bs} | {name} | {med:.0f} | {med / plain:.2f} | "
                          f"{acc_text} |", flush=True)  # fmt: skip
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
