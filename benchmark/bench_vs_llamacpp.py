"""Ours vs llama.cpp's llama-server: streamed serving throughput on the demo model.

    python benchmark/bench_vs_llamacpp.py [--llama-server PATH] [--concurrency 1 8 32]
        [--num-prompts 128] [--input-len 128] [--output-len 128] [--runs 2] [--check-greedy]

Both servers get the same workload: `--num-prompts` streamed `/v1/completions` requests
of `--input-len` random token ids (sent as a list of ints, so both see the same tokens),
`--output-len` greedy tokens each with ignore_eos, at most `--concurrency` in flight
(a fresh prompt set per level, seeded by the level). For each level the servers run
alternately, `--runs` times each, each run on a fresh server after one warm-up request:
ours is `python -m sglang.launch_server` with default flags, llama.cpp's is
`llama-server -m demo.gguf --no-webui -np 32 -t 2 -c <32 slots x (input + output)>`.
The load generator is `sglang.bench_serving` (openai backend), used as a library. RSS
is summed over the server's process tree (psutil) when the load has finished.

Prints a markdown table of medians over the runs (ITL: each run's median and mean gap
between streamed chunks, the mean shows stalls that the median hides; p99 TTFT: each
run's 99th percentile time to first token). `--check-greedy`
first compares both servers' greedy tokens on a few prompts. On a machine shared with
other work, 2-thread servers can stall; `--ours-args="--num-threads 1" --llama-threads 1`
runs both at one thread. A request llama-server drops unanswered on a kept-alive
connection it had closed is sent again by bench_serving (counted in the log and the
JSON as resends).

Cache (`--cache-dir`, default ~/.cache/sglang-bench), reused by later runs:
  llama.cpp/                 vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist
  llama.cpp/build/bin/llama-server   built here if absent (cmake, -j2, nice 19; 7-10 min)
  convert-<hash>/            copy of convert_hf_to_gguf.py + conversion/ with the
                             pre-tokenizer workaround (unknown hash -> "gpt-2") and
                             a BPE fallback when sentencepiece is not installed (any
                             arch, for a checkpoint without tokenizer.model)
  gguf/demo-<hash>-<type>.gguf  the checkpoint (the demo model unless --model-path) in
                             GGUF f32 (or bf16: --gguf-type), keyed by its files' hash
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from sglang import bench_serving
from sglang.demo_models import demo_target_path

logger = logging.getLogger("bench_vs_llamacpp")

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
]
# Edits to a copy of the converter, (file, text, replacement). It refuses our byte-level
# BPE tokenizer's pre-tokenizer hash; they use the GPT-2 split, so an unknown hash maps to
# "gpt-2". And Llama's set_vocab tries sentencepiece first: without the module it fails
# instead of falling back to the BPE vocab. Other archs (Qwen2/Qwen3, ...) try it first too
# and fall back only on FileNotFoundError, but the sentencepiece import came before the
# tokenizer.model check: checked first, a checkpoint without one gets the BPE vocab.
_SP_IMPORT = "        from sentencepiece import SentencePieceProcessor\n"
_SP_FILE_CHECK = ("        tokenizer_path = self.dir_model / 'tokenizer.model'\n\n"
                  "        if not tokenizer_path.is_file():\n"
                  '            raise FileNotFoundError(f"File not found: {tokenizer_path}")\n')  # fmt: skip
CONVERTER_PATCHES = [
    ("conversion/base.py", "        if res is None:\n            logger.warning",
     '        if res is None:  # sglang bench: byte-level BPE, GPT-2 split\n'
     '            res = "gpt-2"\n        if res is None:\n            logger.warning'),
    ("conversion/llama.py", "self._set_vocab_sentencepiece()\n        except FileNotFoundError:",
     "self._set_vocab_sentencepiece()\n        except (FileNotFoundError, ModuleNotFoundError):"),
    ("conversion/base.py", _SP_IMPORT + "\n" + _SP_FILE_CHECK, _SP_FILE_CHECK + "\n" + _SP_IMPORT),
]  # fmt: skip
SERVERS = ("ours", "llama")
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
RUN_ATTEMPTS = 2  # a server that fails to start (or a failed request) gets one more try


# --- llama.cpp: source, build, GGUF ---------------------------------------------------------


def llama_cpp_source(cache_dir: Path) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist, unpacked once into the cache."""
    src_dir = cache_dir / "llama.cpp"
    if (src_dir / "CMakeLists.txt").exists():
        return src_dir
    sdist = download_sdist(cache_dir)  # creates cache_dir
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        vendor = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
        shutil.move(str(vendor), src_dir)
    return src_dir


def download_sdist(cache_dir: Path) -> Path:
    sdist_dir = cache_dir / "sdist"
    found = sorted(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
    if found:
        return found[0]
    logger.info("downloading the llama-cpp-python %s sdist", LLAMA_CPP_PYTHON_VERSION)
    cache_dir.mkdir(parents=True, exist_ok=True)  # a fresh machine has no ~/.cache yet
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:  # private TMPDIR for pip
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(sdist_dir)]  # fmt: skip
        subprocess.run(cmd, check=True, env={**os.environ, "TMPDIR": tmp})
    return next(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))


def find_or_build_llama_server(explicit: str | None, cache_dir: Path) -> Path:
    if explicit:
        return Path(explicit).resolve()
    src_dir = llama_cpp_source(cache_dir)
    binary = src_dir / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    build_llama_server(src_dir)
    return binary


def build_llama_server(src_dir: Path) -> None:
    log_path = src_dir / "build-llama-server.log"
    logger.info("building llama-server in %s (7-10 min on 2 cores; log %s)", src_dir, log_path)
    start_s = time.perf_counter()
    nice = ["nice", "-n", "19"]
    with tempfile.TemporaryDirectory() as tmp, open(log_path, "w") as log:
        env = {**os.environ, "TMPDIR": tmp}
        for cmd in (
            [*nice, "cmake", "-B", "build", *CMAKE_FLAGS],
            [*nice, "cmake", "--build", "build", "-t", "llama-server", "-j2"],
        ):
            subprocess.run(cmd, cwd=src_dir, check=True, env=env, stdout=log, stderr=log)
    logger.info("built llama-server in %.0f s", time.perf_counter() - start_s)


def patched_converter(src_dir: Path, cache_dir: Path) -> Path:
    """A copy of convert_hf_to_gguf.py and conversion/ with the pre-tokenizer workaround."""
    patches_hash = hashlib.sha256(repr(CONVERTER_PATCHES).encode()).hexdigest()[:8]
    conv_dir = cache_dir / f"convert-{patches_hash}"
    script = conv_dir / "convert_hf_to_gguf.py"
    if script.exists():
        return script
    tmp_dir = cache_dir / "convert.tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    shutil.copytree(src_dir / "conversion", tmp_dir / "conversion")
    shutil.copy2(src_dir / "convert_hf_to_gguf.py", tmp_dir / "convert_hf_to_gguf.py")
    for rel_path, text, replacement in CONVERTER_PATCHES:
        patch_file(tmp_dir / rel_path, text, replacement)
    tmp_dir.rename(conv_dir)
    return script


def patch_file(path: Path, text: str, replacement: str) -> None:
    source = path.read_text()
    if source.count(text) != 1:
        raise RuntimeError(f"{text!r} not found once in {path}; update CONVERTER_PATCHES")
    path.write_text(source.replace(text, replacement))


def model_hash(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def convert_to_gguf(model_dir: Path, src_dir: Path, cache_dir: Path, out_type: str) -> Path:
    """The checkpoint in GGUF of `out_type` (f32, or bf16: the demo checkpoint's own dtype,
    which our server keeps where dtype auto runs bf16)."""
    out_path = cache_dir / "gguf" / f"demo-{model_hash(model_dir)}-{out_type}.gguf"
    if out_path.exists():
        return out_path
    out_path.parent.mkdir(parents=True, exist_ok=True)
    script = patched_converter(src_dir, cache_dir)
    tmp_path = out_path.with_suffix(".tmp")
    logger.info("converting %s to %s", model_dir, out_path)
    env = {**os.environ, "PYTHONPATH": str(src_dir / "gguf-py")}
    cmd = [sys.executable, str(script), str(model_dir), "--outtype", out_type,
           "--outfile", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env)
    tmp_path.rename(out_path)
    return out_path


# --- servers ----------------------------------------------------------------------------------


@dataclass
class ServerSpec:
    name: str
    cmd: list[str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ours_spec(model_dir: Path, port: int, args: argparse.Namespace) -> ServerSpec:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), *shlex.split(args.ours_args)]  # fmt: skip
    return ServerSpec("ours", cmd)


def llama_spec(binary: Path, gguf: Path, port: int, args: argparse.Namespace) -> ServerSpec:
    ctx_tokens = args.llama_parallel * (args.input_len + args.output_len)
    cmd = [str(binary), "-m", str(gguf), "--no-webui", "-np", str(args.llama_parallel),
           "-t", str(args.llama_threads), "-c", str(ctx_tokens),
           "--host", "127.0.0.1", "--port", str(port), *shlex.split(args.llama_args)]  # fmt: skip
    return ServerSpec("llama", cmd)


def server_spec(name: str, port: int, ctx: BenchContext) -> ServerSpec:
    if name == "ours":
        return ours_spec(ctx.model_dir, port, ctx.args)
    return llama_spec(ctx.llama_server, ctx.gguf, port, ctx.args)


@contextlib.contextmanager
def running_server(spec: ServerSpec, port: int, log_dir: Path) -> Iterator[tuple[str, int]]:
    """Start the server in its own process group; yield (base URL, pid); always kill it."""
    log_path = log_dir / f"{spec.name}-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(spec.cmd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_ready(base_url, proc, log_path)
        yield base_url, proc.pid
    finally:
        stop_process_group(proc)


def wait_ready(base_url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline_s = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"server exited with {proc.returncode}; log {log_path}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"server not ready in {READY_TIMEOUT_S:.0f} s; log {log_path}")


def stop_process_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.warning("server %d ignored SIGTERM; killing its group", proc.pid)
    with contextlib.suppress(ProcessLookupError):  # children left behind, if any
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def rss_tree_mib(pid: int) -> float:
    root = psutil.Process(pid)
    total_bytes = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total_bytes += proc.memory_info().rss
    return total_bytes / 2**20


# --- workload ----------------------------------------------------------------------------------


def token_prompts(seed: int, count: int, input_len: int, vocab_size: int) -> list[list[int]]:
    """Random token ids, past the special tokens (as bench_serving draws them)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab_size - 1) for _ in range(input_len)] for _ in range(count)]


def bench_args(base_url: str, concurrency: int) -> argparse.Namespace:
    args = bench_serving.parse_args(["--backend", "openai", "--base-url", base_url,
                                     "--max-concurrency", str(concurrency)])  # fmt: skip
    args.model = bench_serving.default_model(args)
    return args


def run_load(base_url: str, prompts: list[list[int]], output_len: int, concurrency: int) -> dict:
    """bench_serving's openai backend; a list of ints as `prompt` goes out as token ids."""
    args = bench_args(base_url, concurrency)
    requests = [
        bench_serving.BenchRequest(prompt=ids, prompt_len=len(ids), output_len=output_len)
        for ids in prompts
    ]
    results, duration_s = asyncio.run(bench_serving.run_benchmark(args, requests))
    return bench_serving.summarize(results, duration_s)


def check_summary(name: str, summary: dict, num_prompts: int, output_len: int) -> None:
    if summary["failed"]:
        raise RuntimeError(f"{name}: {summary['failed']} requests failed: {summary['errors']}")
    expected_tokens = num_prompts * output_len
    if summary["total_output_tokens"] != expected_tokens:
        logger.warning("%s: %d output tokens, expected %d", name,
                       summary["total_output_tokens"], expected_tokens)  # fmt: skip


# --- the benchmark -------------------------------------------------------------------------------


@dataclass
class BenchContext:
    args: argparse.Namespace
    model_dir: Path
    llama_server: Path
    gguf: Path
    vocab_size: int
    log_dir: Path


@dataclass
class RunResult:
    server: str
    concurrency: int
    run: int
    output_tok_s: float
    itl_median_ms: float
    itl_mean_ms: float
    ttft_p99_ms: float
    rss_mib: float
    summary: dict[str, Any]


def one_run(name: str, concurrency: int, prompts: list[list[int]], ctx: BenchContext) -> dict:
    port = free_port()
    args = ctx.args
    with running_server(server_spec(name, port, ctx), port, ctx.log_dir) as (base_url, pid):
        warmup = token_prompts(-1, 1, args.input_len, ctx.vocab_size)
        run_load(base_url, warmup, args.output_len, 1)
        summary = run_load(base_url, prompts, args.output_len, concurrency)
        summary["rss_mib"] = rss_tree_mib(pid)
    if summary["resends"]:
        logger.info("%s: %d requests sent again", name, summary["resends"])
    check_summary(name, summary, len(prompts), args.output_len)
    return summary


def run_with_retry(
    name: str, concurrency: int, prompts: list[list[int]], ctx: BenchContext
) -> dict:
    for attempt in range(1, RUN_ATTEMPTS + 1):
        try:
            return one_run(name, concurrency, prompts, ctx)
        except (RuntimeError, TimeoutError) as exc:
            if attempt == RUN_ATTEMPTS:
                raise
            logger.warning("%s failed (%s); again on a fresh server", name, str(exc)[-500:])
    raise AssertionError("unreachable")


def run_level(concurrency: int, ctx: BenchContext) -> list[RunResult]:
    args = ctx.args
    prompts = token_prompts(concurrency, args.num_prompts, args.input_len, ctx.vocab_size)
    results = []
    for run in range(args.runs):
        order = SERVERS if run % 2 == 0 else SERVERS[::-1]  # alternate who goes first
        for name in order:
            summary = run_with_retry(name, concurrency, prompts, ctx)
            result = RunResult(name, concurrency, run, summary["output_throughput"],
                               summary["itl_ms"]["median"], summary["itl_ms"]["mean"],
                               summary["ttft_ms"]["p99"], summary["rss_mib"], summary)  # fmt: skip
            logger.info("concurrency %d run %d %s: %.1f out tok/s, ITL median %.2f mean %.2f ms, "
                        "p99 TTFT %.0f ms, RSS %.0f MiB", concurrency, run, name,
                        result.output_tok_s, result.itl_median_ms, result.itl_mean_ms,
                        result.ttft_p99_ms, result.rss_mib)  # fmt: skip
            results.append(result)
    return results


def median_of(results: list[RunResult], server: str, concurrency: int, attr: str) -> float:
    values = [
        getattr(r, attr) for r in results if r.server == server and r.concurrency == concurrency
    ]
    return statistics.median(values)


def itl_cell(results: list[RunResult], server: str, concurrency: int) -> str:
    median_ms = median_of(results, server, concurrency, "itl_median_ms")
    mean_ms = median_of(results, server, concurrency, "itl_mean_ms")
    return f"{median_ms:.2f} / {mean_ms:.2f}"


def markdown_table(results: list[RunResult], levels: list[int]) -> str:
    lines = [
        "| concurrency | ours out tok/s | llama-server | ours / llama | ours ITL ms "
        "(median / mean) | llama ITL ms | p99 TTFT ours / llama | RSS ours / llama |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        ours_tok_s, llama_tok_s = (median_of(results, s, level, "output_tok_s") for s in SERVERS)
        ours_itl, llama_itl = (itl_cell(results, s, level) for s in SERVERS)
        ours_rss, llama_rss = (median_of(results, s, level, "rss_mib") for s in SERVERS)
        ours_ttft, llama_ttft = (median_of(results, s, level, "ttft_p99_ms") for s in SERVERS)
        lines.append(
            f"| {level} | {ours_tok_s:,.0f} | {llama_tok_s:,.0f} | {ours_tok_s / llama_tok_s:.2f} "
            f"| {ours_itl} | {llama_itl} | {ours_ttft:,.0f} / {llama_ttft:,.0f} ms "
            f"| {ours_rss:,.0f} / {llama_rss:,.0f} MiB |"
        )
    return "\n".join(lines)


# --- greedy check --------------------------------------------------------------------------------


GREEDY_TEXTS = ("The quick brown fox", "def fibonacci(n):", "Once upon a time, there was")


def greedy_prompts(ctx: BenchContext) -> list[list[int]]:
    """A few text prompts (our tokenizer's ids) and a few random-id prompts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
    texts = [tokenizer.encode(t, add_special_tokens=False) for t in GREEDY_TEXTS]
    return texts + token_prompts(-2, 3, ctx.args.input_len, ctx.vocab_size)


def ours_greedy(base_url: str, ids: list[int], max_tokens: int) -> list[int]:
    params = {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": params}
    response = httpx.post(base_url + "/generate", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["output_ids"]


def llama_greedy(base_url: str, ids: list[int], max_tokens: int) -> list[int]:
    body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False}  # fmt: skip
    response = httpx.post(base_url + "/completion", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["tokens"]


def greedy_outputs(name: str, prompts: list[list[int]], ctx: BenchContext) -> list[list[int]]:
    port = free_port()
    generate = ours_greedy if name == "ours" else llama_greedy
    with running_server(server_spec(name, port, ctx), port, ctx.log_dir) as (base_url, _):
        return [generate(base_url, ids, ctx.args.greedy_tokens) for ids in prompts]


def common_prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_greedy(ctx: BenchContext) -> str:
    prompts = greedy_prompts(ctx)
    ours, llama = (greedy_outputs(name, prompts, ctx) for name in SERVERS)
    same = [common_prefix_len(a, b) for a, b in zip(ours, llama)]
    equal = sum(a == b for a, b in zip(ours, llama))
    line = (f"greedy check: {equal}/{len(prompts)} prompts give identical "
            f"{ctx.args.greedy_tokens}-token outputs; common prefix lengths {same}")  # fmt: skip
    logger.info(line)
    for i, (a, b) in enumerate(zip(ours, llama)):
        if a != b:
            logger.warning("prompt %d differs at token %d: ours %s llama %s", i, same[i],
                           a[same[i] : same[i] + 5], b[same[i] : same[i] + 5])  # fmt: skip
    return line


# --- CLI ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: cache)")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "sglang-bench"))
    p.add_argument("--model-path", default=None, help="HF checkpoint (default: demo model)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--runs", type=int, default=2, help="runs per server and level")
    p.add_argument("--llama-parallel", type=int, default=32, help="llama-server -np")
    p.add_argument("--llama-threads", type=int, default=2, help="llama-server -t")
    p.add_argument("--ours-args", default="", help="extra launch_server flags, one string")
    p.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    p.add_argument("--check-greedy", action="store_true", help="compare greedy tokens first")
    p.add_argument("--gguf-type", choices=["f32", "bf16"], default="f32",
                   help="llama-server's weights: f32, or bf16 (what our dtype auto keeps on "
                        "CPUs with native bf16; the log line 'dtype auto: ...' says which)")
    p.add_argument("--greedy-tokens", type=int, default=64)
    p.add_argument("--output-json", default=None, help="write every run's summary here")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> BenchContext:
    cache_dir = Path(args.cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model_path or demo_target_path()).resolve()
    llama_server = find_or_build_llama_server(args.llama_server, cache_dir)
    gguf = convert_to_gguf(model_dir, llama_cpp_source(cache_dir), cache_dir, args.gguf_type)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    log_dir = Path(tempfile.mkdtemp(prefix="bench_vs_llamacpp-"))
    logger.info("llama-server %s, GGUF %s, server logs in %s", llama_server, gguf, log_dir)
    return BenchContext(args, model_dir, llama_server, gguf, vocab_size, log_dir)


def write_json(path: str, results: list[RunResult], greedy: str | None) -> None:
    rows = [{k: v for k, v in vars(r).items()} for r in results]
    with open(path, "w") as f:
        json.dump({"greedy_check": greedy, "runs": rows}, f, indent=1, default=str)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the servers
    args = parse_args(argv)
    ctx = prepare(args)
    greedy = check_greedy(ctx) if args.check_greedy else None
    results = []
    for level in args.concurrency:
        results += run_level(level, ctx)
        if args.output_json:  # after every level, so an interrupted run keeps its figures
            write_json(args.output_json, results, greedy)
    date = datetime.date.today().isoformat()
    print(f"\n{date}, {platform.node()}, {os.cpu_count()} CPUs, medians of {args.runs} runs")
    print("python benchmark/bench_vs_llamacpp.py " + shlex.join(sys.argv[1:]))
    print(markdown_table(results, args.concurrency))
    if greedy:
        print(greedy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
