"""Decode step time under OpenMP wait policies, idle and with a busy core.

    python benchmark/bench_omp_wait.py [--rounds 3] [--burners 0 1]

Each configuration runs `sglang.bench_one_batch` (demo-sized tiny llama, 2
threads, batch 1 and 32) in a fresh process, since libgomp reads its wait policy
when it loads; configurations alternate round by round, and medians are printed.
`--burners N` keeps N pure-Python busy loops running meanwhile, as another
program on the same machine would.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

POLICIES = {
    "default": {},
    "GOMP_SPINCOUNT=100000": {"GOMP_SPINCOUNT": "100000"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
}
STEP = re.compile(r"decode\s+([\d.]+) ms/step")


def decode_ms(env_extra: dict[str, str], output_len: int) -> list[float]:
    cmd = [sys.executable, "-m", "sglang.bench_one_batch", "--batch-size", "1", "32",
           "--input-len", "128", "--output-len", str(output_len), "--no-hf"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run(cmd, env={**env, **env_extra}, capture_output=True, text=True, check=True)
    return [float(m) for m in STEP.findall(out.stdout + out.stderr)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burners", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--output-len", type=int, default=96)
    args = parser.parse_args()
    for burners in args.burners:
        procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)
        ]
        try:
            times: dict[str, list[list[float]]] = {name: [] for name in POLICIES}
            for _ in range(args.rounds):
                for name, env in POLICIES.items():
                    times[name].append(decode_ms(env, args.output_len))
        finally:
            for proc in procs:
                proc.kill()
        print(
            f"\n{burners} busy core(s): decode ms/step, median of {args.rounds} (batch 1 | batch 32)"
        )
        for name, runs in times.items():
            b1 = statistics.median(r[0] for r in runs)
            b32 = statistics.median(r[1] for r in runs)
            print(f"  {name:26s} {b1:8.2f} | {b32:8.2f}")


if __name__ == "__main__":
    main()
