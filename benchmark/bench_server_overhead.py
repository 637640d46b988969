"""Per-token server cost at a given concurrency: ITL from bench_serving plus the CPU
time each process spends per generated token.

    python benchmark/bench_server_overhead.py [--concurrency 1] [--num-prompts 12]
        [--logprobs N] [--pythonpath DIR] [--port 31100] [-- server flags]

Launches `python -m sglang.launch_server` (with PYTHONPATH=DIR to time another
checkout, e.g. a `git worktree` of an older commit), runs

    bench_serving --backend openai --dataset-name random --random-input-len 128
        --random-output-len 128 --random-range-ratio 1.0 --request-rate inf
        --max-concurrency C

and reads utime+stime of the launcher (TokenizerManager + HTTP), scheduler and
detokenizer from /proc around it, and the client's from its rusage. CPU ms per
token is steadier than wall-clock ITL on a shared machine: it counts what each
hop costs, whoever else runs.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.request

from sglang.test.soak import maps_libtorch

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def role(pid: int) -> str | None:
    """scheduler (maps libtorch), detokenizer (a spawn child without it), None otherwise."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"spawn_main" not in f.read():
            return None
    return "scheduler" if maps_libtorch(pid) else "detokenizer"


def wait_healthy(port: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("server did not become healthy")


def bench_cmd(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "sglang.bench_serving", "--port", str(args.port),
        "--backend", "openai", "--dataset-name", "random",
        "--num-prompts", str(args.num_prompts), "--random-input-len", "128",
        "--random-output-len", "128", "--random-range-ratio", "1.0",
        "--request-rate", "inf", "--max-concurrency", str(args.concurrency),
        *(["--logprobs", str(args.logprobs)] if args.logprobs is not None else []),
    ]  # fmt: skip


def figure(text: str, label: str) -> float:
    match = re.search(rf"{re.escape(label)}:\s+([\d.]+)", text)
    return float(match.group(1)) if match else float("nan")


def measure(args: argparse.Namespace, pids: dict[str, int]) -> dict:
    """The client is this checkout's bench_serving whatever --pythonpath the server runs."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(bench_cmd(args), capture_output=True, text=True).stdout
    client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
    spent["client"] = (client_after.ru_utime + client_after.ru_stime) - (
        client_before.ru_utime + client_before.ru_stime
    )
    tokens = figure(out, "Total generated tokens")
    return {
        "median_itl_ms": figure(out, "Median ITL (ms)"),
        "mean_itl_ms": figure(out, "Mean ITL (ms)"),
        "median_tpot_ms": figure(out, "Median TPOT (ms)"),
        "p99_itl_ms": figure(out, "P99 ITL (ms)"),
        "p99_ttft_ms": figure(out, "P99 TTFT (ms)"),
        "tokens": tokens,
        "cpu_ms_per_token": {k: 1e3 * v / tokens for k, v in spent.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--port", type=int, default=31100)
    parser.add_argument("--label", default="")
    parser.add_argument("--logprobs", type=int, default=None,
                        help="requests ask for logprobs with this many top alternatives")  # fmt: skip
    args, server_argv = parser.parse_known_args()
    if server_argv[:1] == ["--"]:  # argparse keeps the separator
        server_argv = server_argv[1:]
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(args.port), *server_argv]
    server = subprocess.Popen(
        cmd, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_healthy(args.port)
        pids = {"launcher": server.pid}
        for pid in children(server.pid):
            name = role(pid)
            if name is not None:
                pids[name] = pid
        res = measure(args, pids)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    cpu = " ".join(f"{k} {v:.2f}" for k, v in res["cpu_ms_per_token"].items())
    print(
        f"{args.label} c{args.concurrency}: median ITL {res['median_itl_ms']:.2f} ms, "
        f"mean ITL {res['mean_itl_ms']:.2f}, p99 ITL {res['p99_itl_ms']:.2f}, "
        f"median TPOT {res['median_tpot_ms']:.2f}, p99 TTFT {res['p99_ttft_ms']:.0f} | "
        f"CPU ms/token: {cpu}",
        flush=True,
    )


if __name__ == "__main__":
    main()
