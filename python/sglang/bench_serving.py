"""Online serving benchmark: send a random workload to a server, report latency figures.

    python -m sglang.bench_serving --base-url http://127.0.0.1:30000 --backend sglang \
        --dataset-name random --num-prompts 64 --random-input-len 128 \
        --random-output-len 64 --request-rate 16 --max-concurrency 8

`--backend sglang` streams from our native `/generate`; `--backend openai` streams
from `/v1/completions` of any OpenAI-compatible server. Requests arrive as a
Poisson process of `--request-rate` per second (inf: all at once), at most
`--max-concurrency` in flight. Prints throughput and mean / median / p99 of
TTFT, TPOT, ITL and end-to-end latency.

The client is aiohttp, read as raw bytes split into SSE lines and parsed with orjson:
on a small machine the load generator shares the cores with the server under test,
and its cost per streamed token is a cost the server is measured with. Against the
demo model at 8 streams on 2 cores, httpx's line iterator held the measured
throughput at 5,567-5,924 out tok/s where this client reads 7,186-7,636 from the same
server (benchmark/RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

from sglang.bench_args import at_least_one

# --- workload --------------------------------------------------------------------------------


@dataclass
class BenchRequest:
    prompt: str
    prompt_len: int
    output_len: int
    input_ids: list[int] | None = None  # exact-length prompt, sent where the backend takes ids


def _lengths(mean_len: int, range_ratio: float, count: int, rng: random.Random) -> list[int]:
    low = max(1, int(mean_len * range_ratio))
    return [rng.randint(low, max(low, mean_len)) for _ in range(count)]


def _word_prompt(num_words: int, rng: random.Random) -> str:
    words = ("alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud", "light")
    return " ".join(rng.choice(words) for _ in range(num_words))


def random_requests(args: argparse.Namespace, tokenizer: Any | None) -> list[BenchRequest]:
    """Random prompts of `--random-input-len` tokens (exact with a tokenizer, else words)."""
    rng = random.Random(args.seed)
    input_lens = _lengths(args.random_input_len, args.random_range_ratio, args.num_prompts, rng)
    output_lens = _lengths(args.random_output_len, args.random_range_ratio, args.num_prompts, rng)
    requests = []
    for input_len, output_len in zip(input_lens, output_lens):
        if tokenizer is not None:
            ids = [rng.randrange(100, len(tokenizer) - 1) for _ in range(input_len)]
            requests.append(BenchRequest(tokenizer.decode(ids), input_len, output_len, ids))
        else:
            requests.append(BenchRequest(_word_prompt(input_len, rng), input_len, output_len))
    return requests


def load_tokenizer(args: argparse.Namespace) -> Any | None:
    name = args.tokenizer
    if name is None and args.backend == "sglang":
        name = _server_tokenizer_path(args)
    if name is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def _get_json(args: argparse.Namespace, path: str) -> Any:
    request = urllib.request.Request(args.base_url + path, headers=_headers(args))
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _server_tokenizer_path(args: argparse.Namespace) -> str | None:
    try:
        info = _get_json(args, "/model_info")
    except (OSError, ValueError):  # urllib's errors are OSErrors
        return None
    path = info.get("tokenizer_path") or info.get("model_path")
    return path if path and os.path.isdir(path) else None  # only a tokenizer we can read


# --- one request -------------------------------------------------------------------------------


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    connection_lost: bool = False  # with its kept-alive connection, before any answer
    resends: int = 0  # tries lost that way before this one


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def build_payload(args: argparse.Namespace, req: BenchRequest) -> tuple[str, dict[str, Any]]:
    if args.backend == "sglang":
        params = {"max_new_tokens": req.output_len, "temperature": 0.0,
                  "ignore_eos": not args.disable_ignore_eos}  # fmt: skip
        prompt = {"text": req.prompt} if req.input_ids is None else {"input_ids": req.input_ids}
        body = {**prompt, "sampling_params": params, "stream": True}
        if args.logprobs is not None:
            body.update(return_logprob=True, top_logprobs_num=args.logprobs,
                        return_text_in_logprobs=True)  # fmt: skip
        return "/generate", body
    payload = {
        "model": args.model,
        "prompt": req.prompt,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": True,
        # usage on every chunk where the server can (SGLang's, vLLM's): the tokens each
        # chunk carries, for per-token ITL; otherwise one token a chunk is assumed
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if not args.disable_ignore_eos:
        payload["ignore_eos"] = True
    if args.logprobs is not None:
        payload["logprobs"] = args.logprobs
    return "/v1/completions", payload


@dataclass
class ChunkProgress:
    """What one stream event says of its request's progress."""

    has_output: bool  # it carries generated tokens (not only a usage count)
    prompt_tokens: int | None
    completion_tokens: int | None  # so far (cumulative), where the server says
    finish: str | None  # the finish reason's type, on the last event


def _chunk_progress(backend: str, data: dict[str, Any]) -> ChunkProgress:
    if backend == "sglang":
        meta = data.get("meta_info", {})
        finish = meta.get("finish_reason")
        return ChunkProgress(
            True,  # every native event is an output (a --skip-tokenizer-init one: ids)
            meta.get("prompt_tokens"),
            meta.get("completion_tokens"),
            finish.get("type") if isinstance(finish, dict) else finish,
        )
    usage = data.get("usage") or {}
    choices = data.get("choices") or [{}]
    return ChunkProgress(
        any(c.get("text") for c in choices),
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        choices[0].get("finish_reason"),
    )


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The body's lines (without their newline) as the bytes arrive: a line may span
    reads and be of any length (its pieces are joined once, at its newline); the last
    needs no newline."""
    pieces: list[bytes] = []  # the line being read
    async for data in content.iter_any():
        if b"\n" not in data:
            pieces.append(data)
            continue
        *lines, rest = b"".join([*pieces, data]).split(b"\n")
        pieces = [rest]
        for line in lines:
            yield line
    yield b"".join(pieces)


async def sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The payload of each `data: ` line of an SSE body."""
    async for line in _lines(content):
        if line.startswith(b"data: "):
            yield line[len(b"data: ") :].rstrip(b"\r")


# aiohttp's errors for a kept-alive connection the server had closed, on writing the
# request or on reading its answer. aiohttp does not retry a POST, and finds a pooled
# connection closed by an idle server (llama-server's cpp-httplib closes them) only when
# it uses it. Not a connection that could not be opened (ClientConnectorError, also an
# OSError): a server that is down fails each request at once.
CONNECTION_LOST_ERRORS = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientConnectionResetError,
)


async def send_request(
    session: aiohttp.ClientSession, args: argparse.Namespace, req: BenchRequest
) -> RequestResult:
    """One request, streamed and timed. Sent again while it is lost with its connection
    before any answer: each pooled connection may be a closed one, so up to the pool's
    size plus one tries; only the answered one is timed."""
    tries = session.connector.limit + 1 if session.connector is not None else 1
    resends = 0
    result = await _send_once(session, args, req)
    while result.connection_lost and resends + 1 < tries:
        resends += 1
        result = await _send_once(session, args, req)
    result.resends = resends
    return result


async def _send_once(
    session: aiohttp.ClientSession, args: argparse.Namespace, req: BenchRequest
) -> RequestResult:
    path, payload = build_payload(args, req)
    result = RequestResult(prompt_len=req.prompt_len)
    start = last = time.perf_counter()
    answered = False  # the response's status line arrived
    try:
        async with session.post(args.base_url + path, json=payload) as response:
            answered = True
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return result
            async for event in sse_data(response.content):
                if event == b"[DONE]":
                    continue
                data = orjson.loads(event)
                if "error" in data:  # the server failed it mid-stream (then [DONE])
                    result.error = f"stream error: {str(data['error'])[:200]}"
                    return result
                progress = _chunk_progress(args.backend, data)
                now = time.perf_counter()
                new_tokens = _new_tokens(progress, result.output_len)
                if new_tokens and progress.has_output:  # not a closing usage count
                    if not result.output_len:
                        result.ttft_s = now - start
                    else:  # a chunk of k tokens: k gaps of 1/k of its wait (as SGLang)
                        result.itl_s.extend([(now - last) / new_tokens] * new_tokens)
                    last = now
                result.output_len += new_tokens
                result.prompt_len = progress.prompt_tokens or result.prompt_len
                if progress.finish == "abort":  # cut short by the server (abort_request)
                    result.error = f"aborted by the server after {result.output_len} tokens"
                    return result
        result.latency_s = time.perf_counter() - start
        result.success = True
    except CONNECTION_LOST_ERRORS as exc:
        result.error = repr(exc)
        result.connection_lost = not (answered or isinstance(exc, aiohttp.ClientConnectorError))
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as exc:
        result.error = repr(exc)
    return result


def _new_tokens(progress: ChunkProgress, tokens_so_far: int) -> int:
    """Tokens this event adds: by the server's count where it gives one, else one for an
    event that carries output."""
    if progress.completion_tokens is not None:
        return max(progress.completion_tokens - tokens_so_far, 0)
    return 1 if progress.has_output else 0


# --- the run -------------------------------------------------------------------------------------


async def _arrivals(requests: list[BenchRequest], rate: float, seed: int):
    rng = np.random.default_rng(seed)
    for i, req in enumerate(requests):
        if i and rate != float("inf"):  # no wait after the last: it is not in the run
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))
        yield req


async def run_benchmark(
    args: argparse.Namespace, requests: list[BenchRequest]
) -> tuple[list[RequestResult], float]:
    limit = args.max_concurrency or len(requests)
    semaphore = asyncio.Semaphore(limit)
    connector = aiohttp.TCPConnector(limit=limit)
    # --timeout-s bounds each wait (connecting, and between two reads of a stream), not a
    # whole request: a long generation behind a long queue is not cut off.
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=args.timeout_s, sock_read=args.timeout_s
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=_headers(args)
    ) as session:

        async def limited(req: BenchRequest) -> RequestResult:
            async with semaphore:
                return await send_request(session, args, req)

        start = time.perf_counter()
        tasks = []
        async for req in _arrivals(requests, args.request_rate, args.seed):
            tasks.append(asyncio.create_task(limited(req)))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def _stats_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    arr = np.asarray(values) * 1000.0
    return {
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "p99": float(np.percentile(arr, 99)),
    }


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    input_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_len for r in ok)
    tpot = [(r.latency_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": input_tokens / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_throughput": (input_tokens + output_tokens) / duration_s,
        "concurrency": sum(r.latency_s for r in ok) / duration_s,
        "e2e_ms": _stats_ms([r.latency_s for r in ok]),
        "ttft_ms": _stats_ms([r.ttft_s for r in ok]),
        "tpot_ms": _stats_ms(tpot),
        "itl_ms": _stats_ms([gap for r in ok for gap in r.itl_s]),
        "errors": sorted({r.error for r in results if not r.success})[:5],
        "resends": sum(r.resends for r in results),
    }


def format_report(args: argparse.Namespace, summary: dict[str, Any]) -> str:
    rows = [
        ("Backend", args.backend),
        ("Traffic request rate", args.request_rate),
        ("Max request concurrency", args.max_concurrency or "not set"),
        ("Successful requests", summary["completed"]),
        ("Failed requests", summary["failed"]),
        ("Benchmark duration (s)", f"{summary['duration_s']:.2f}"),
        ("Total input tokens", summary["total_input_tokens"]),
        ("Total generated tokens", summary["total_output_tokens"]),
        ("Request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
        ("Input token throughput (tok/s)", f"{summary['input_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{summary['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{summary['total_throughput']:.2f}"),
        ("Concurrency", f"{summary['concurrency']:.2f}"),
    ]
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]
    lines += [f"{name + ':':<44}{value:>16}" for name, value in rows]
    for key, title in (("e2e_ms", "E2E Latency"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                       ("itl_ms", "ITL")):  # fmt: skip
        lines.append("{s:{c}^60}".format(s=f" {title} ", c="-"))
        for stat in ("mean", "median", "p99"):
            name = f"{stat.capitalize() if stat != 'p99' else 'P99'} {title} (ms):"
            lines.append(f"{name:<44}{summary[key][stat]:>16.2f}")
    lines.append("=" * 60)
    if summary["resends"]:
        lines.append(f"sent again after a kept-alive connection was lost: {summary['resends']}")
    if summary["errors"]:
        lines.append("errors: " + "; ".join(summary["errors"]))
    return "\n".join(lines)


# --- CLI -------------------------------------------------------------------------------------------


def _positive_rate(text: str) -> float:
    rate = float(text)
    if not rate > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r}: a rate of requests per second is > 0")
    return rate


def _range_ratio(text: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = float("nan")
    if not 0.0 <= ratio <= 1.0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r}: a number in [0, 1]")
    return ratio


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sglang.bench_serving",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--backend", choices=["sglang", "openai"], default="sglang")
    p.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:30000")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default=None, help="Model name (default: the server's first).")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer for exact prompt lengths.")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset-name", choices=["random"], default="random")
    p.add_argument("--num-prompts", type=at_least_one, default=100)
    p.add_argument("--random-input-len", type=at_least_one, default=256)
    p.add_argument("--random-output-len", type=at_least_one, default=64)
    p.add_argument("--random-range-ratio", type=_range_ratio, default=1.0,
                   help="In [0, 1]: lengths are uniform in [ratio * len, len]; 1.0 = fixed.")  # fmt: skip
    p.add_argument("--request-rate", type=_positive_rate, default=float("inf"),
                   help="Requests per second, > 0 (inf: all at once).")  # fmt: skip
    p.add_argument("--max-concurrency", type=at_least_one, default=None,
                   help="Most requests in flight, >= 1 (default: no limit).")  # fmt: skip
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--logprobs", type=int, default=None,
                   help="Ask for each token's logprob and this many top alternatives.")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="Longest wait to connect, or between two reads of a stream.")  # fmt: skip
    p.add_argument("--output-file", default=None, help="Append the summary as a JSON line.")
    args = p.parse_args(argv)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    return args


def default_model(args: argparse.Namespace) -> str:
    """The first model the server lists at /v1/models (what SGLang serves as one model)."""
    return _get_json(args, "/v1/models")["data"][0]["id"]


def recorded_args(args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments as the output file keeps them: valid JSON (a rate of inf as
    "inf", not a bare Infinity), the API key not written out."""
    recorded = {}
    for name, value in vars(args).items():
        if isinstance(value, float) and not np.isfinite(value):
            value = str(value)
        recorded[name] = "<set>" if name == "api_key" and value else value
    return recorded


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "openai" and args.model is None:
        try:
            args.model = default_model(args)
        except (OSError, ValueError, LookupError) as exc:  # urllib's errors are OSErrors
            sys.stderr.write(
                f"bench_serving: cannot read the model name from {args.base_url}/v1/models "
                f"({exc}); is the server up (and --api-key right)? Or pass --model\n"
            )
            return 2
    requests = random_requests(args, load_tokenizer(args))
    results, duration_s = asyncio.run(run_benchmark(args, requests))
    summary = summarize(results, duration_s)
    sys.stdout.write(format_report(args, summary) + "\n")
    if args.output_file:
        with open(args.output_file, "a", encoding="utf-8") as f:
            f.write(json.dumps({"args": recorded_args(args), **summary}, default=str) + "\n")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
