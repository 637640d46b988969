"""Checks on a config: every error is a ValueError naming the field and what it accepts.

`validate(view, fields)` runs on the raw record (the CLI, before resolution; None
values are skipped) and again on the resolution result inside `resolve_once()`.
`check_refusals` (part of `validate`, and run by `ServerArgs.__post_init__`)
refuses the values a field's `unsupported=` declaration names; `warn_noops`
logs, at resolution, each field set on a device its `noop_on=` names.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import types
import typing
from pathlib import Path
from typing import Any

from sglang.srt.arg_groups.arg_utils import flag_of, is_refused_value
from sglang.srt.arg_groups.attention_support import (
    attention_kv_dtype,
    config_head_dim,
    flashinfer_unavailable_reason,
    triton_unavailable_reason,
)
from sglang.srt.arg_groups.exec_ import FP8_KV_DTYPES
from sglang.srt.arg_groups.parallel import MAX_DP_RANKS_PER_NODE, check_tp_split
from sglang.srt.sampling.param_types import SEED_RANGE

logger = logging.getLogger(__name__)

# field -> smallest accepted value (inclusive).
MIN_VALUES: dict[str, int | float] = {
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": 1,
    "ep_size": 1,
    "nnodes": 1,
    "node_rank": 0,
    "decode_context_parallel_size": 1,
    "page_size": 1,
    "speculative_disable_by_batch_size": 0,
    "stream_interval": 1,
    "max_prefill_tokens": 1,
    "max_running_requests": 1,
    "max_queued_requests": 1,
    "max_total_tokens": 1,
    "max_loras_per_batch": 1,
    "context_length": 1,
    "cuda_graph_max_bs": 1,
    "num_threads": 1,
    "max_request_body_mb": 1,
    "speculative_num_steps": 1,
    "speculative_num_draft_tokens": 1,
    "speculative_eagle_topk": 1,
}


MAX_THREADS_PER_CORE = 4  # more OpenMP threads than this per core is a typo, not a setting
MIN_POOL_TOKENS = 16  # the smallest KV pool the runner builds (model_runner._pool_size)
# strings whose empty value would silently read as unset
NON_EMPTY_STRINGS = ("api_key", "served_model_name", "tokenizer_path", "chat_template",
                     "reasoning_parser", "tool_call_parser", "dist_init_addr",
                     "speculative_draft_model_path")  # fmt: skip


def _check_choices(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{name}={value!r} is not accepted; choose one of {list(choices)}")


def _check_min(name: str, value: Any, low: int | float) -> None:
    if value is not None and value < low:
        raise ValueError(f"{name}={value!r} is not accepted; it must be >= {low}")


def _check_ranges(c: Any) -> None:
    if c.port is not None and not 1 <= c.port <= 65535:
        raise ValueError(f"port={c.port!r} is not accepted; it must be in 1..65535")
    fraction = c.mem_fraction_static
    if fraction is not None and not 0.0 < fraction < 1.0:
        raise ValueError(f"mem_fraction_static={fraction!r} is not accepted; it must be in (0, 1)")
    size = c.chunked_prefill_size
    if size is not None and size != -1 and size < 1:
        raise ValueError(f"chunked_prefill_size={size!r} is not accepted; use -1 (off) or >= 1")
    for name in ("watchdog_timeout", "schedule_conservativeness"):
        value = getattr(c, name)
        if value is not None and not value > 0:  # NaN too (it would turn the check off)
            raise ValueError(f"{name}={value!r} is not accepted; it must be > 0")
    seed, (low, high) = c.random_seed, SEED_RANGE
    if seed is not None and not low <= seed <= high:
        raise ValueError(
            f"random_seed={seed!r} is not accepted; it must be in [{low}, {high}] "
            "(torch's 64-bit seed)"
        )
    _check_num_threads(c.num_threads)
    _check_pool_floor(c)
    _check_non_empty(c)
    _check_api_key(c.api_key)
    _check_dist_init_addr(c.dist_init_addr)


def _check_num_threads(num_threads: int | None) -> None:
    cores = os.cpu_count() or 1
    if num_threads is not None and num_threads > MAX_THREADS_PER_CORE * cores:
        raise ValueError(
            f"num_threads={num_threads} is not accepted; this machine has {cores} cores "
            f"(at most {MAX_THREADS_PER_CORE * cores} threads)"
        )


def _check_pool_floor(c: Any) -> None:
    """A KV pool set by --max-total-tokens must hold one page and MIN_POOL_TOKENS."""
    floor = max(MIN_POOL_TOKENS, c.page_size or 1)
    if c.max_total_tokens is not None and c.max_total_tokens < floor:
        raise ValueError(
            f"max_total_tokens={c.max_total_tokens} is not accepted; the KV pool needs at "
            f"least {floor} tokens (max({MIN_POOL_TOKENS}, page_size={c.page_size}))"
        )


def _check_non_empty(c: Any) -> None:
    """An empty string would silently mean "unset" (an empty api_key: no authentication)."""
    for name in NON_EMPTY_STRINGS:
        if getattr(c, name) == "":
            raise ValueError(f"{name}='' is not accepted; leave it out, or give a value")


def _check_api_key(api_key: str | None) -> None:
    """A key clients can send as `Authorization: Bearer <key>`: printable ASCII, no
    surrounding whitespace (a padded key was accepted and no client could ever match it;
    a non-ASCII one only clients that send raw UTF-8 headers)."""
    if api_key is None:
        return
    if api_key != api_key.strip() or not all(" " <= ch <= "~" for ch in api_key):
        raise ValueError(
            "api_key=<not shown> is not accepted: it must be printable ASCII with no "
            "leading or trailing whitespace (clients send it in an HTTP header)"
        )


def _check_dist_init_addr(addr: str | None) -> None:
    if addr is None:
        return
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"dist_init_addr={addr!r} is not accepted; it must be host:port "
            "(port in 1..65535), e.g. 10.0.0.1:5000"
        )


def _check_topology(c: Any) -> None:
    if c.node_rank >= c.nnodes:
        raise ValueError(f"node_rank={c.node_rank} is not accepted; it must be < nnodes={c.nnodes}")
    if c.nnodes > 1:
        _check_multi_node(c)
    if c.ep_size not in (1, c.tp_size):
        raise ValueError(
            f"ep_size={c.ep_size} is not accepted; use 1 or tp_size={c.tp_size} "
            "(experts split across all TP ranks, as SGLang requires)"
        )
    if c.tp_size > 1 and c.model_path:  # a local checkpoint; the runner checks a hub one
        from sglang.srt.arg_groups.resolvers import read_hf_config

        check_tp_split(read_hf_config(c.model_path) or {}, c.tp_size, c.ep_size)
    if c.enable_dp_attention and c.tp_size % c.dp_size:
        raise ValueError(
            f"dp_size={c.dp_size} is not accepted with enable_dp_attention; "
            f"it must divide tp_size={c.tp_size}"
        )


def _check_multi_node(c: Any) -> None:
    if c.dp_size > 1:
        _check_multi_node_dp(c)
    elif c.tp_size % c.nnodes:
        raise ValueError(
            f"nnodes={c.nnodes} is not accepted with tp_size={c.tp_size}: each node runs "
            "tp_size/nnodes TP ranks, so nnodes must divide tp_size"
        )
    if not c.dist_init_addr:
        raise ValueError(
            f"nnodes={c.nnodes} needs dist_init_addr (--dist-init-addr host:port): the "
            "torch.distributed rendezvous on node 0 that every node's ranks join"
        )


def _check_multi_node_dp(c: Any) -> None:
    """dp_size > 1 across nodes: each node runs dp_size/nnodes whole DP groups (all
    tp_size ranks of a group on one node); a group split over nodes is not built."""
    if c.dp_size % c.nnodes:
        raise ValueError(
            f"dp_size={c.dp_size} is not accepted with nnodes={c.nnodes}: each node runs "
            "dp_size/nnodes whole DP groups (tp_size ranks each), so nnodes must divide "
            "dp_size (a DP group split across nodes is not supported)"
        )
    if c.dp_size // c.nnodes > MAX_DP_RANKS_PER_NODE:
        raise ValueError(
            f"dp_size={c.dp_size} is not accepted with nnodes={c.nnodes}: at most "
            f"{MAX_DP_RANKS_PER_NODE} DP groups per node (ports P..P+"
            f"{MAX_DP_RANKS_PER_NODE - 1} of --dist-init-addr are node 0's TP rendezvous)"
        )


def _check_backends(c: Any) -> None:
    """An explicit attention backend must be able to run on the device, else a ValueError
    at launch naming the field and the reason."""
    if c.device == "auto":
        return
    for name in ("attention_backend", "speculative_draft_attention_backend"):
        backend = getattr(c, name)
        if backend == "triton":
            reason = triton_unavailable_reason(c.device)
        elif backend == "flashinfer":
            reason = flashinfer_unavailable_reason(
                c.device, attention_kv_dtype(c), _head_dim_of(c.model_path)
            )
        else:
            continue
        if reason is not None:
            raise ValueError(f"{name}={backend!r} cannot run on {c.device}: {reason}")


def _head_dim_of(model_path: str | None) -> int | None:
    from sglang.srt.arg_groups.resolvers import read_hf_config

    return config_head_dim(read_hf_config(model_path)) if model_path else None


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def refusal_message(f: dataclasses.Field, value: Any) -> str:
    """Names the flag and the field, the value, and the issue it waits for."""
    flag = flag_of(f.name) if isinstance(value, bool) else f"{flag_of(f.name)} {_shown(value)}"
    if f.default is None or f.default is False:
        leave = "leave it unset" if f.default is None else "leave it off"
    else:
        leave = f"leave it at its default {_shown(f.default)}"
    return (
        f"{flag} ({f.name}={value!r}) is not supported yet "
        f"(issue: {f.metadata['unsupported']}); {leave}"
    )


def check_refusals(c: Any, fields: tuple[dataclasses.Field, ...]) -> None:
    """Raise ValueError for the first value an `unsupported=` declaration refuses.

    A field that is also a no-op on some devices is refused only off those devices;
    while the device is still 'auto' (before resolution) the check waits for it.
    """
    for f in fields:
        value = getattr(c, f.name)
        if not is_refused_value(f, value):
            continue
        noop = f.metadata.get("noop_on") or {}
        if noop and (c.device == "auto" or c.device in noop):
            continue
        raise ValueError(refusal_message(f, value))


def check_types(c: Any, fields: tuple[dataclasses.Field, ...]) -> None:
    """Raise ValueError for a value of the wrong type (the CLI parses types; a Python
    caller, ServerArgs(...) or Engine(...), may pass anything): `random_seed="x"` fails
    here, naming the field, not later in a child process."""
    hints = _field_types(type(c))
    for f in fields:
        value, expected = getattr(c, f.name), hints.get(f.name)
        # None is a value too: refused for a field whose type does not allow it
        if expected is not None and not _has_type(value, expected):
            raise ValueError(
                f"{f.name}={value!r} is not accepted; it must be {_type_name(expected)}"
            )


@functools.lru_cache(maxsize=4)
def _field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve: no type checks
        return {}


def _has_type(value: Any, expected: Any) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if expected is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is list:
        inner = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(_has_type(v, inner) for v in value)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True  # a form not checked here


def _type_name(expected: Any) -> str:
    if typing.get_origin(expected) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in typing.get_args(expected) if a is not type(None)]
        return " or ".join(names) + " (or None)" * (type(None) in typing.get_args(expected))
    if typing.get_origin(expected) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(expected))
    return getattr(expected, "__name__", None) or str(expected)


def noop_fields(c: Any, fields: tuple[dataclasses.Field, ...]) -> list[tuple[str, str]]:
    """(field, why) for each field set to a non-default value on a device it has no effect on."""
    out = []
    for f in fields:
        why = (f.metadata.get("noop_on") or {}).get(c.device)
        if why is not None and getattr(c, f.name) != f.default:
            out.append((f.name, why))
    return out


def warn_noops(c: Any, fields: tuple[dataclasses.Field, ...], typed: Any) -> None:
    """Log a warning for each flag that has no effect on the resolved device, or with
    the rest of this config. `c` is the resolved config, `typed` the record of what the
    operator set."""
    for name, why in noop_fields(c, fields):
        logger.warning("%s has no effect on %s: %s", flag_of(name), c.device, why)
    defaults = {f.name: f.default for f in fields}
    for name, why in context_noops(c, typed, defaults):
        logger.warning("%s has no effect here: %s", flag_of(name), why)


def context_noops(c: Any, typed: Any, defaults: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, why) for each field set where the rest of the config leaves it unread;
    `typed` holds what was set (before resolution filled in defaults)."""
    out = []
    if c.revision is not None and Path(c.model_path).expanduser().is_dir():
        out.append(("revision", f"model_path {c.model_path!r} is a local directory, "
                                "not a hub id to fetch a revision of"))  # fmt: skip
    if c.dp_size == 1 and c.load_balance_method != defaults["load_balance_method"]:
        out.append(("load_balance_method", "it routes requests between DP ranks; dp_size is 1"))
    if typed.max_total_tokens is not None and typed.mem_fraction_static is not None:
        out.append(("mem_fraction_static", "--max-total-tokens sets the KV pool's size"))
    if c.is_embedding:
        out += _embedding_noops(c, defaults)
    if c.log_requests and c.log_level not in ("debug", "info"):
        out.append(("log_requests", f"its lines are logged at info, below --log-level {c.log_level}"))
    if c.grammar_backend == "none" and c.constrained_json_disable_any_whitespace:
        out.append(("constrained_json_disable_any_whitespace", "grammar_backend is none"))
    if c.skip_tokenizer_init and typed.tokenizer_path is not None:
        out.append(("tokenizer_path", "skip_tokenizer_init loads no tokenizer"))
    if c.skip_tokenizer_init and not c.is_embedding:
        for name in ("chat_template", "reasoning_parser", "tool_call_parser"):
            if getattr(c, name) is not None:
                out.append((name, "skip_tokenizer_init loads no tokenizer: chat is refused"))
    return out


def _embedding_noops(c: Any, defaults: dict[str, Any]) -> list[tuple[str, str]]:
    """context_noops' fields an embedding server (--is-embedding) never reads."""
    out = []
    for name in ("chat_template", "reasoning_parser", "tool_call_parser"):
        if getattr(c, name) is not None:
            out.append((name, "an embedding server (--is-embedding) serves no chat"))
    if c.stream_interval != defaults["stream_interval"]:
        out.append(("stream_interval", "an embedding server (--is-embedding) streams nothing"))
    if c.sampling_defaults != defaults["sampling_defaults"]:
        out.append(("sampling_defaults", "an embedding server (--is-embedding) samples nothing"))
    if c.constrained_json_disable_any_whitespace:
        out.append(("constrained_json_disable_any_whitespace",
                    "an embedding server (--is-embedding) constrains no output"))  # fmt: skip
    return out


def validate(c: Any, fields: tuple[dataclasses.Field, ...]) -> None:
    """Raise ValueError for the first bad value in `c` (a record or a resolved view)."""
    for f in fields:
        choices = f.metadata.get("choices")
        if choices:
            _check_choices(f.name, getattr(c, f.name), choices)
    for name, low in MIN_VALUES.items():
        _check_min(name, getattr(c, name), low)
    check_refusals(c, fields)
    _check_ranges(c)
    _check_topology(c)
    _check_backends(c)
    _check_speculative(c)
    _check_spec_fields_used(c, fields)
    _check_mixed_chunk(c)
    _check_detokenizer_mode(c)
    _check_fp8_kv(c)


def _check_fp8_kv(c: Any) -> None:
    """An fp8 KV cache is read by the CPU torch_native attention (its kernels, or torch);
    the triton and flashinfer backends take float16/bfloat16/float32 K/V only."""
    if c.kv_cache_dtype not in FP8_KV_DTYPES:
        return
    if c.device not in ("auto", "cpu"):
        raise ValueError(
            f"kv_cache_dtype={c.kv_cache_dtype!r} is not accepted on {c.device}: an fp8 KV "
            "cache runs on cpu only; use auto, bfloat16 or float16"
        )
    for name in ("attention_backend", "speculative_draft_attention_backend"):
        backend = getattr(c, name)
        if backend not in (None, "torch_native"):
            raise ValueError(
                f"kv_cache_dtype={c.kv_cache_dtype!r} is not accepted with "
                f"{name}={backend!r}: only torch_native reads an fp8 KV cache"
            )


def _check_mixed_chunk(c: Any) -> None:
    if not c.enable_mixed_chunk:
        return
    if c.is_embedding:
        raise ValueError(
            "enable_mixed_chunk is not accepted with is_embedding: it mixes decoding "
            "requests into prefill batches, and an embedding server does not decode"
        )
    if c.speculative_algorithm is not None:
        raise ValueError(
            f"enable_mixed_chunk is not accepted with speculative_algorithm="
            f"{c.speculative_algorithm!r}: speculative decoding verifies drafts in decode "
            "steps of their own (as in SGLang, which turns mixing off with it)"
        )


def _check_detokenizer_mode(c: Any) -> None:
    if c.detokenizer_mode == "inline" and (c.dp_size > 1 or c.nnodes > 1):
        raise ValueError(
            f"detokenizer_mode=inline is not accepted with dp_size={c.dp_size} and "
            f"nnodes={c.nnodes}: the TokenizerManager detokenizes for one scheduler group on "
            "its node; use detokenizer_mode=process (or auto)"
        )


_DRAFT_MODEL_FIELDS = (
    "speculative_draft_model_path",
    "speculative_draft_attention_backend",
    "speculative_draft_load_format",
)


_NGRAM_FIELDS = (
    "speculative_ngram_min_match_window_size",
    "speculative_ngram_max_match_window_size",
)


def _check_spec_fields_used(c: Any, fields: tuple[dataclasses.Field, ...]) -> None:
    """A speculative flag set without speculative decoding (or an NGRAM one with a draft
    model) would be parsed and ignored: refused, naming what it needs."""
    algo = c.speculative_algorithm
    defaults = {f.name: f.default for f in fields if f.name.startswith("speculative_")}
    typed = [n for n, d in defaults.items() if n != "speculative_algorithm" and getattr(c, n) != d]
    if algo is None and typed:
        raise ValueError(
            f"{typed[0]} is set but speculative_algorithm is not: it would have no effect; "
            "set speculative_algorithm (STANDALONE or NGRAM) or leave it unset"
        )
    ngram_typed = [n for n in typed if n in _NGRAM_FIELDS]
    if algo is not None and algo != "NGRAM" and ngram_typed:
        raise ValueError(
            f"{ngram_typed[0]} is used by NGRAM only (speculative_algorithm={algo!r} drafts "
            "with a draft model); leave it unset or use NGRAM"
        )


def _check_speculative(c: Any) -> None:
    algo = c.speculative_algorithm
    if algo is None:
        return
    if c.is_embedding:
        raise ValueError(
            f"speculative_algorithm={algo!r} is not accepted with is_embedding: an embedding "
            "server only prefills (nothing to draft)"
        )
    if c.speculative_eagle_topk not in (None, 1):
        raise ValueError(
            f"speculative_eagle_topk={c.speculative_eagle_topk} is not supported yet "
            "(issue: tree drafting); use 1 (chain drafting)"
        )
    steps, tokens = c.speculative_num_steps, c.speculative_num_draft_tokens
    if steps is not None and steps < 1:
        raise ValueError(f"speculative_num_steps={steps} is not accepted; it must be >= 1")
    if steps is not None and tokens is not None and tokens != steps + 1:
        raise ValueError(
            f"speculative_num_draft_tokens={tokens} is not accepted with "
            f"speculative_num_steps={steps}: chain drafting verifies num_steps + 1 tokens"
        )
    if algo == "NGRAM":
        for name in _DRAFT_MODEL_FIELDS:
            if getattr(c, name) is not None:
                raise ValueError(
                    f"{name} is not used by NGRAM (it drafts from the request's own "
                    "tokens, with no draft model); leave it unset or use STANDALONE"
                )
    low, high = c.speculative_ngram_min_match_window_size, c.speculative_ngram_max_match_window_size
    if not 1 <= low <= high:
        raise ValueError(
            f"speculative_ngram_min_match_window_size={low} and "
            f"speculative_ngram_max_match_window_size={high} are not accepted; "
            "need 1 <= min <= max"
        )
    if c.page_size not in (None, 1):
        raise ValueError(
            f"speculative decoding with page_size={c.page_size} is not supported yet "
            "(issue: speculative decoding with paged KV); use page_size 1"
        )
    if c.tp_size > 1:
        raise ValueError(
            f"speculative decoding with tp_size={c.tp_size} is not supported yet "
            "(issue: speculative decoding with tensor parallelism)"
        )
