"""RSS of each server process (launcher, children) at idle and after N requests.

    python benchmark/process_rss.py [--model-path DIR] [--requests 200]

Starts `python -m sglang.launch_server` (demo model by default, 1 thread), reads
/proc/<pid>/status VmRSS for the launcher and each child, and whether libtorch is
mapped (/proc/<pid>/maps), at idle and after the requests (concurrency 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_rows(launcher_pid: int) -> list[tuple[str, int, float, bool]]:
    """(label, pid, RSS MiB, libtorch mapped) for the launcher and its children."""
    rows = []
    launcher = psutil.Process(launcher_pid)
    for proc in [launcher, *launcher.children()]:
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        cmd = " ".join(proc.cmdline())
        label = "launcher" if proc.pid == launcher_pid else "child"
        if "resource_tracker" in cmd:
            label = "mp resource tracker"
        rows.append((label, proc.pid, proc.memory_info().rss / 2**20, "libtorch" in maps))
    return rows


def report(title: str, rows: list[tuple[str, int, float, bool]]) -> None:
    print(f"## {title}")
    for label, pid, rss_mib, torch in rows:
        print(f"  {label:20s} pid {pid:7d}  RSS {rss_mib:7.1f} MiB  libtorch {torch}")
    print(f"  total RSS {sum(r[2] for r in rows):.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port),
           "--num-threads", "1", "--log-level", "warning"]  # fmt: skip
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        time.sleep(2)
        report("idle", process_rows(proc.pid))
        body = {"text": "The quick brown fox", "sampling_params": {
            "max_new_tokens": args.max_new_tokens, "temperature": 0.0}}  # fmt: skip
        for _ in range(args.requests):
            requests.post(base + "/generate", json=body, timeout=120).raise_for_status()
        report(f"after {args.requests} requests", process_rows(proc.pid))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError("server not healthy")


if __name__ == "__main__":
    main()
