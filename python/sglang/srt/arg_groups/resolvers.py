"""The resolvers `ServerArgs.resolve_once()` runs, in order.

Each resolver reads the resolution so far through a `ResolvedView` and returns
`(source, {field: value})` to declare, or None. None of them writes a field.
None imports torch: `--device auto` asks the CUDA driver (cuda_probe), so the
launcher stays torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang.srt.arg_groups.attention_support import (
    attention_kv_dtype,
    config_head_dim,
    default_attention_backend,
)
from sglang.srt.arg_groups.schedule import PREFIX_POLICIES
from sglang.srt.arg_groups.spec import DRAFT_MODEL_ALGORITHMS
from sglang.srt.configs.context_length import (
    check_context_override,
    model_context_len,
    window_capped_context,
)
from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

Resolved = tuple[str, dict[str, Any]] | None
Resolver = Callable[[Any], Resolved]

HALF_DTYPES = ("float16", "bfloat16", "half")
# /proc/cpuinfo flags under which a half-precision checkpoint keeps its dtype on CPU, by
# vendor_id ("*": any vendor). AMX tiles: oneDNN runs bf16 (fp16) GEMMs several times faster
# than float32. avx512_bf16 on AMD (Zen 4+): oneDNN's bf16 GEMM ran 370-420 GFLOP/s against
# MKL float32's 90-160 at 128-2048 rows, and our small-M kernel takes the bf16 dot product
# for decode (the demo model's decode step at batch 8-128 took 0.55-0.75x float32's time,
# prefill 0.6x; benchmark/RESULTS.md). On an Intel Xeon with avx512_bf16/avx512_fp16 but no
# AMX, torch's bf16 linear was 1.4-1.6x slower than float32 at 256 rows, so Intel needs AMX.
NATIVE_HALF_CPU_FLAGS = {
    "bfloat16": {"*": ("amx_bf16",), "AuthenticAMD": ("avx512_bf16",)},
    "float16": {"*": ("amx_fp16",)},
}


def resolve_device(c: Any) -> Resolved:
    if c.device != "auto":
        return None
    from sglang.srt.arg_groups.cuda_probe import cuda_available

    return "device_auto", {"device": "cuda" if cuda_available() else "cpu"}


def resolve_model_path(c: Any) -> Resolved:
    if c.model_path is not None:
        check_local_path_exists("model_path", c.model_path)
        check_checkpoint_dir("model_path", c.model_path)
        return _home_expanded("model_path", c.model_path)
    from sglang.demo_models import demo_target_path

    path = demo_target_path()
    if path is None:
        raise ValueError(
            "model_path is required (--model-path DIR or hub id): no bundled demo model is "
            "installed in this package"
        )
    logger.info("No --model-path given: serving the bundled demo model at %s", path)
    return "demo_model", {"model_path": str(path)}


def _home_expanded(name: str, path: str) -> Resolved:
    """A path typed with a leading `~` (quoted, so no shell expanded it), expanded for
    every reader: the tokenizer and config loaders would take `~/m` for a hub id."""
    if not path.startswith("~"):
        return None
    return "home_expanded", {name: os.path.expanduser(path)}


def looks_like_local_path(path: str) -> bool:
    """A hub id is `name` or `org/name`; anything else is meant as a local path."""
    if os.path.exists(path):
        return True
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path


def check_local_path_exists(name: str, path: str) -> None:
    if looks_like_local_path(path) and not os.path.exists(os.path.expanduser(path)):
        raise ValueError(f"{name}: local path {path!r} does not exist")


def check_checkpoint_dir(name: str, path: str) -> None:
    """A local directory must be a Hugging Face checkpoint (found here, in the launcher,
    not by a child failing to read a tokenizer from it)."""
    local = Path(os.path.expanduser(path))
    if local.is_dir() and not (local / "config.json").is_file():
        raise ValueError(
            f"{name}: {path!r} holds no config.json (a Hugging Face checkpoint directory "
            f"is expected)"
        )


def resolve_tokenizer_path(c: Any) -> Resolved:
    if c.tokenizer_path is not None:
        check_local_path_exists("tokenizer_path", c.tokenizer_path)
        return _home_expanded("tokenizer_path", c.tokenizer_path)
    return "tokenizer_from_model", {"tokenizer_path": c.model_path}


def resolve_served_model_name(c: Any) -> Resolved:
    if c.served_model_name is not None:
        return None
    return "served_name_from_model", {"served_model_name": c.model_path}


def read_hf_config(model_path: str) -> dict[str, Any] | None:
    """config.json of a local checkpoint directory, or None (hub id, unreadable)."""
    path = Path(os.path.expanduser(model_path)) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def resolve_context_length(c: Any) -> Resolved:
    config = read_hf_config(c.model_path)
    model_len = model_context_len(config) if config else None
    if c.context_length is not None:  # ModelConfig checks it again in the scheduler
        check_context_override(c.context_length, model_len)
        return None
    if model_len is None:  # unknown (e.g. a hub id): the model loader fills it
        return None
    return "hf_config", {"context_length": window_capped_context(config, model_len)}


def _config_dtype(config: dict[str, Any] | None) -> str:
    if not config:
        return "float32"
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype is None:
        dtype = (config.get("text_config") or {}).get("dtype") or "float32"
    return str(dtype).replace("torch.", "")


# the dtype names torch's aliases stand for: the resolution shows the dtype that runs
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def resolve_kv_cache_dtype(c: Any) -> Resolved:
    if c.kv_cache_dtype == "bf16":  # SGLang's name
        return "dtype_alias", {"kv_cache_dtype": "bfloat16"}
    return None


def resolve_dtype(c: Any) -> Resolved:
    if c.dtype in DTYPE_ALIASES:
        return "dtype_alias", {"dtype": DTYPE_ALIASES[c.dtype]}
    if c.dtype != "auto":
        return None
    dtype = _config_dtype(read_hf_config(c.model_path))
    if dtype == "half":
        dtype = "float16"
    decided = {"dtype": dtype}
    if c.device == "cpu" and dtype in HALF_DTYPES:
        native = cpu_native_half_flags(dtype)
        if native:
            logger.info("dtype auto: checkpoint is %s, kept on cpu (%s)", dtype, native)
        else:
            decided = {"dtype": "float32", **_kv_kept_in_checkpoint_dtype(c, dtype)}
            logger.info(
                "dtype auto: checkpoint is %s, running float32 on cpu (no %s); K/V in %s",
                dtype,
                native_half_flags_wanted(dtype),
                decided.get("kv_cache_dtype", f"{c.kv_cache_dtype} (--kv-cache-dtype)"),
            )
    return "dtype_auto", decided


def _kv_kept_in_checkpoint_dtype(c: Any, checkpoint_dtype: str) -> dict[str, Any]:
    """When dtype auto widens a bf16/fp16 checkpoint to float32 compute on CPU, its K/V stay
    in the checkpoint's dtype, as its linear weights do (unless --kv-cache-dtype says
    otherwise): half the bytes the decode attention reads, which bounds it past a batch of
    ~8 (offline demo model, 256 prompts: 1.1-1.25x the tokens/s of a float32 pool), and the
    K/V a CPU with native bf16 stores for the same checkpoint. An explicit --dtype float32
    keeps float32 K/V."""
    if c.kv_cache_dtype not in (None, "auto"):
        return {}
    return {"kv_cache_dtype": checkpoint_dtype}


def cpu_native_half_flags(dtype: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU flags (space-separated) that give `dtype` native matmuls here; '' when none
    (or /proc/cpuinfo cannot be read: not x86 Linux)."""
    fields = cpuinfo_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    by_vendor = NATIVE_HALF_CPU_FLAGS.get(dtype, {})
    wanted = (*by_vendor.get("*", ()), *by_vendor.get(fields.get("vendor_id", ""), ()))
    return " ".join(f for f in wanted if f in flags)


def cpuinfo_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """/proc/cpuinfo's `key : value` lines (the last processor's); {} when unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {}
    return {
        key.strip(): value.strip()
        for key, _, value in (ln.partition(":") for ln in text.splitlines())
    }


def native_half_flags_wanted(dtype: str) -> str:
    """What `cpu_native_half_flags` looks for, for the log: 'amx_bf16, or avx512_bf16 on
    AuthenticAMD'."""
    by_vendor = NATIVE_HALF_CPU_FLAGS.get(dtype, {})
    parts = ["/".join(by_vendor.get("*", ()))]
    parts += [f"{'/'.join(f)} on {vendor}" for vendor, f in by_vendor.items() if vendor != "*"]
    return ", or ".join(p for p in parts if p)


def resolve_attention_backend(c: Any) -> Resolved:
    if c.attention_backend is not None:
        return None
    head_dim = config_head_dim(read_hf_config(c.model_path))
    backend = default_attention_backend(c.device, attention_kv_dtype(c), head_dim)
    return "attention_backend_by_device", {"attention_backend": backend}


def resolve_sampling_backend(c: Any) -> Resolved:
    if c.sampling_backend is not None:
        return None
    return "sampling_backend_default", {"sampling_backend": "pytorch"}


def resolve_chunked_prefill_size(c: Any) -> Resolved:
    if c.chunked_prefill_size is not None:
        return None
    size = 2048 if c.device == "cpu" else 8192
    return "chunked_prefill_by_device", {"chunked_prefill_size": size}


def resolve_mem_fraction_static(c: Any) -> Resolved:
    if c.mem_fraction_static is not None:
        return None
    if c.device == "cpu":
        # Left None: the runner sizes a bounded CPU pool (model_runner.cpu_default_pool_size)
        # from the KV bytes per token and logs the rule; /server_info shows the token count.
        return None
    return "mem_fraction_by_device", {"mem_fraction_static": 0.85}


def resolve_random_seed(c: Any) -> Resolved:
    if c.random_seed is not None:
        return None
    # Recorded in the resolution, so /server_info shows the seed in effect.
    return "random_seed_chosen", {"random_seed": random.randint(0, 2**30 - 1)}


def resolve_detokenizer_mode(c: Any) -> Resolved:
    if c.detokenizer_mode != "auto":
        return None
    # On a few CPU cores the detokenizer process's wake-ups per token take the cores the
    # forward's threads want (demo model, concurrency 1: ~0.3 ms less CPU per token inline)
    inline = c.device == "cpu" and c.dp_size == 1 and c.nnodes == 1
    return "detokenizer_mode_by_device", {"detokenizer_mode": "inline" if inline else "process"}


def resolve_schedule_policy(c: Any) -> Resolved:
    """A prefix-aware policy orders by cached prefixes: with --disable-radix-cache there
    are none, and the queue is served first come, first served (as SGLang does)."""
    if c.schedule_policy not in PREFIX_POLICIES or not c.disable_radix_cache:
        return None
    logger.warning("--schedule-policy %s orders by cached prefixes; with --disable-radix-cache "
                   "there are none: fcfs instead", c.schedule_policy)  # fmt: skip
    return "radix_cache_disabled", {"schedule_policy": "fcfs"}


def resolve_grammar_backend(c: Any) -> Resolved:
    if c.grammar_backend is not None:
        return None
    # A scheduler that cannot load xgrammar records its fallback to "none" with
    # get_context().override("grammar_fallback", ...): /server_info tells the truth.
    return "grammar_backend_default", {"grammar_backend": "xgrammar"}


def resolve_from_env(c: Any) -> Resolved:
    """SGLANG_NUM_THREADS fills an unset --num-threads; SGLANG_LOG_LEVEL wins over --log-level."""

    out: dict[str, Any] = {}
    if c.num_threads is None and envs.SGLANG_NUM_THREADS.is_set():
        out["num_threads"] = envs.SGLANG_NUM_THREADS.get()
    if envs.SGLANG_LOG_LEVEL.is_set():
        out["log_level"] = envs.SGLANG_LOG_LEVEL.get()
    return ("environment", out) if out else None


def _draft_model_path(c: Any) -> dict[str, Any]:
    if c.speculative_algorithm not in DRAFT_MODEL_ALGORITHMS:
        return {}
    if c.speculative_draft_model_path is not None:
        check_local_path_exists("speculative_draft_model_path", c.speculative_draft_model_path)
        check_checkpoint_dir("speculative_draft_model_path", c.speculative_draft_model_path)
        expanded = _home_expanded("speculative_draft_model_path", c.speculative_draft_model_path)
        return expanded[1] if expanded else {}
    from sglang.demo_models import demo_draft_path

    path = demo_draft_path()
    if path is None:
        raise ValueError(
            f"speculative_draft_model_path is required for speculative_algorithm "
            f"{c.speculative_algorithm!r} (no bundled demo draft is installed)"
        )
    return {"speculative_draft_model_path": str(path)}


def resolve_speculative(c: Any) -> Resolved:
    if c.speculative_algorithm is None:
        return None
    out = _draft_model_path(c)
    steps = c.speculative_num_steps
    if steps is None:
        given = c.speculative_num_draft_tokens
        if given is not None and given < 2:  # the verified token and at least one draft
            raise ValueError(
                f"speculative_num_draft_tokens={given} is not accepted; it must be >= 2 "
                "(the last verified token and at least one drafted token)"
            )
        steps = given - 1 if given is not None else 3
    defaults = {
        "speculative_num_steps": steps,
        "speculative_num_draft_tokens": steps + 1,
        "speculative_eagle_topk": 1,
    }
    if c.speculative_algorithm in DRAFT_MODEL_ALGORITHMS:
        defaults["speculative_draft_attention_backend"] = c.attention_backend
        defaults["speculative_draft_load_format"] = c.load_format
    out.update({k: v for k, v in defaults.items() if getattr(c, k) is None})
    return ("speculative_defaults", out) if out else None


RESOLVERS: tuple[Resolver, ...] = (
    resolve_device,
    resolve_model_path,
    resolve_tokenizer_path,
    resolve_served_model_name,
    resolve_context_length,
    resolve_kv_cache_dtype,
    resolve_dtype,
    resolve_attention_backend,
    resolve_sampling_backend,
    resolve_chunked_prefill_size,
    resolve_mem_fraction_static,
    resolve_random_seed,
    resolve_schedule_policy,
    resolve_grammar_backend,
    resolve_detokenizer_mode,
    resolve_from_env,
    resolve_speculative,
)
