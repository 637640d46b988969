"""Data parallelism: the DP controller's routing cost, and throughput dp=1 vs dp=2.

    python benchmark/bench_dp.py [--model-path DIR] [--num-prompts 128]
        [--input-len 128] [--output-len 32] [--skip-e2e]

Routing cost (one process, no model): per request, the policy's `route` alone and
the controller's whole `dispatch` (decode the message, route, send it on an ipc
socket to a rank; the ranks' sockets are drained outside the timed loop) for
each --load-balance-method, over prompts of --input-len tokens, a LoadReport per
rank every 16 requests. Target: < 100 microseconds a request.

End to end (Engines on the tiny llama, --num-threads 1, greedy, ignore_eos): the
same prompts at once through dp=1 (1 thread, and 2 threads: the same cores as
dp=2), dp=2, and dp=2 with each DP rank's scheduler pinned to its own core
(os.sched_setaffinity on the scheduler pids, so rank d runs on core d). Output
tokens per second of wall time, best of --rounds.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import tempfile
import time
from pathlib import Path

from sglang.srt.managers.data_parallel_policy import LOAD_BALANCE_METHODS, make_load_balancer
from sglang.srt.managers.io_struct import LoadReport, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

REPORT_EVERY = 16


def prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    """Half the prompts share one of 8 prefixes (3/4 of their length), half are unique."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 4000) for _ in range(length * 3 // 4)] for _ in range(8)]
    out = []
    for k in range(num):
        if k % 2:
            out.append([rng.randrange(3, 4000) for _ in range(length)])
        else:
            head = prefixes[k % 8]
            out.append(head + [rng.randrange(3, 4000) for _ in range(length - len(head))])
    return out


def report_all(policy, dp_size: int, sent: int) -> None:
    for rank in range(dp_size):
        policy.on_report(LoadReport(rank, 8, 2, 30000, 32768, sent // dp_size))


def bench_route(method: str, reqs: list[list[int]], dp_size: int) -> float:
    policy = make_load_balancer(method, dp_size)
    start = time.perf_counter()
    for k, ids in enumerate(reqs):
        if k % REPORT_EVERY == 0:
            report_all(policy, dp_size, k)
        policy.route(ids)
    return (time.perf_counter() - start) / len(reqs) * 1e6


def bench_dispatch(method: str, reqs: list[list[int]], dp_size: int) -> float:
    import zmq

    from sglang.srt.managers.data_parallel_controller import DataParallelController
    from sglang.srt.managers.ipc import PortArgs, PullEndpoint

    port_args = PortArgs.init_new(None, dp_size)
    ctx = zmq.Context(1)
    sinks = [PullEndpoint(ctx, name) for name in port_args.dp_scheduler_input_ipc_names]
    controller = DataParallelController(port_args, make_load_balancer(method, dp_size))
    frames = [_Frame(pickle.dumps(_message(k, ids))) for k, ids in enumerate(reqs)]
    elapsed = 0.0
    for k, frame in enumerate(frames):
        if k % REPORT_EVERY == 0:
            report_all(controller.policy, dp_size, k)
            for sink in sinks:
                sink.recv_frames_nowait()
        start = time.perf_counter()
        controller.dispatch(frame)
        elapsed += time.perf_counter() - start
    port_args.cleanup()
    return elapsed / len(reqs) * 1e6


class _Frame:
    """What the controller reads off a zmq Frame: `.bytes`."""

    def __init__(self, data: bytes) -> None:
        self.bytes = data


def _message(k: int, ids: list[int]) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(f"r{k}", None, ids, SamplingParams(max_new_tokens=32))


def routing_table(input_len: int, num: int = 20000) -> list[str]:
    reqs = prompts(num, input_len)
    lines = [
        f"Routing cost per request, {input_len}-token prompts, dp 2 ({num} requests)",
        "",
        "| method | route (us) | dispatch: decode + route + send (us) |",
        "|---|---|---|",
    ]
    for method in LOAD_BALANCE_METHODS:
        route_us = min(bench_route(method, reqs, 2) for _ in range(3))
        dispatch_us = min(bench_dispatch(method, reqs, 2) for _ in range(3))
        lines.append(f"| {method} | {route_us:.1f} | {dispatch_us:.1f} |")
    return lines


def run_engine(
    model: str, reqs, params, dp_size: int, pin: bool, rounds: int, threads: int = 1
) -> float:
    import sglang as sgl

    kw = {"num_threads": threads, "log_level": "warning", "max_total_tokens": 32768}
    with sgl.Engine(model_path=model, dp_size=dp_size, **kw) as llm:
        if pin:
            pids = llm.child_pids()
            for rank in range(dp_size):
                os.sched_setaffinity(pids[f"scheduler (dp rank {rank})"], {rank})
        llm.generate(input_ids=reqs[:8], sampling_params=params)  # warm-up
        best = 0.0
        for _ in range(rounds):
            llm.flush_cache()
            start = time.perf_counter()
            outs = llm.generate(input_ids=reqs, sampling_params=params)
            wall_s = time.perf_counter() - start
            best = max(best, sum(len(o["output_ids"]) for o in outs) / wall_s)
        return best


def e2e_table(model: str, args: argparse.Namespace) -> list[str]:
    reqs = prompts(args.num_prompts, args.input_len, seed=1)
    params = {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}
    runs = [
        ("dp 1", 1, False, 1),
        ("dp 1, --num-threads 2", 1, False, 2),
        ("dp 2", 2, False, 1),
        ("dp 2, rank d pinned to core d", 2, True, 1),
    ]
    lines = [
        f"End to end: {args.num_prompts} prompts x {args.input_len} in / {args.output_len} out, "
        f"--num-threads 1 unless noted, {os.cpu_count()} cores, best of {args.rounds}",
        "",
        "| run | out tok/s | vs dp 1 |",
        "|---|---|---|",
    ]
    base = None
    for name, dp_size, pin, threads in runs:
        tput = run_engine(model, reqs, params, dp_size, pin, args.rounds, threads)
        base = base or tput
        lines.append(f"| {name} | {tput:,.0f} | {tput / base:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: a tiny llama built here")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args()
    for length in (args.input_len, 1024):
        print("\n".join(routing_table(length)), end="\n\n")
    if args.skip_e2e:
        return
    model = args.model_path
    if model is None:
        from sglang.test.make_tiny_model import make_tiny_model

        model = str(make_tiny_model("llama", Path(tempfile.mkdtemp()) / "tiny-llama"))
    print("\n".join(e2e_table(model, args)))


if __name__ == "__main__":
    main()
