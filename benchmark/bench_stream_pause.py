"""How long a stream pauses while other requests' long prompts are prefilled.

    python benchmark/bench_stream_pause.py --model-path DIR [--rounds 2]
        [--prompt-len 2048] [--long-prompts 3] [--stream-tokens 200]
        [--config "--chunked-prefill-size 2048" --config "... --enable-mixed-chunk"]

For each config (server flags, one string each), alternating over the rounds: a fresh
`python -m sglang.launch_server`, one warm-up request, then a stream of
--stream-tokens tokens from a 32-token prompt; half a second in, --long-prompts prompts
of --prompt-len random tokens are sent one after another (one output token each).
Prints, per run, the longest gap between two of the stream's tokens, the median gap,
and each long prompt's latency. Without --enable-mixed-chunk the running requests
decode only when no prefill batch is left, so the stream stops for a whole prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

DEFAULT_CONFIGS = [
    "--chunked-prefill-size 2048",
    "--chunked-prefill-size 512",
    "--chunked-prefill-size 2048 --enable-mixed-chunk",
    "--chunked-prefill-size 512 --enable-mixed-chunk",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> urllib.request.Request:
    data = json.dumps(body).encode()
    return urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(base_url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the server did not become healthy")


def stream_gaps_s(base_url: str, prompt: list[int], tokens: int, gaps: list[float]) -> None:
    """Stream `tokens` tokens; append each gap between two chunks to `gaps`."""
    body = {"input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}  # fmt: skip
    last = None
    with urllib.request.urlopen(post(base_url + "/generate", body)) as resp:
        for line in resp:
            if not line.startswith(b"data:") or b"[DONE]" in line:
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now


def one_run(model_path: str, flags: str, args: argparse.Namespace, seed: int) -> dict:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
           "--port", str(port), "--log-level", "warning", *flags.split()]  # fmt: skip
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, args.vocab_high) for _ in range(n)]

    try:
        wait_healthy(base_url, proc)
        warm = {"input_ids": prompt(64), "sampling_params": {"max_new_tokens": 4}}
        urllib.request.urlopen(post(base_url + "/generate", warm)).read()
        gaps: list[float] = []
        streamer = threading.Thread(
            target=stream_gaps_s, args=(base_url, prompt(32), args.stream_tokens, gaps)
        )
        streamer.start()
        time.sleep(0.5)
        latencies_s = []
        for _ in range(args.long_prompts):
            body = {"input_ids": prompt(args.prompt_len), "sampling_params": {"max_new_tokens": 1}}
            start = time.perf_counter()
            urllib.request.urlopen(post(base_url + "/generate", body)).read()
            latencies_s.append(time.perf_counter() - start)
        streamer.join()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    gaps.sort()
    return {"flags": flags, "max_gap_ms": gaps[-1] * 1e3, "median_gap_ms": gaps[len(gaps) // 2] * 1e3,
            "long_prompt_s": latencies_s}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--config", action="append", default=None, help="server flags, one string")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--long-prompts", type=int, default=3)
    p.add_argument("--stream-tokens", type=int, default=200)
    p.add_argument("--vocab-high", type=int, default=8000, help="prompt token ids below this")
    args = p.parse_args()
    for round_idx in range(args.rounds):
        for flags in args.config or DEFAULT_CONFIGS:
            r = one_run(args.model_path, flags, args, seed=round_idx)
            latencies = ", ".join(f"{s:.2f}" for s in r["long_prompt_s"])
            print(f"round {round_idx} | {flags:50s} | longest pause {r['max_gap_ms']:6.0f} ms | "
                  f"median gap {r['median_gap_ms']:5.1f} ms | long prompts {latencies} s",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
