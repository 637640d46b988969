"""Every SGLANG_* environment variable, typed, read when asked (never at import), and
the few of other packages that our code reads (THIRD_PARTY_VARIABLES).

    from sglang.srt.environ import envs
    envs.SGLANG_LOG_LEVEL.get()          # typed value or the default
    with envs.SGLANG_NUM_THREADS.override(4): ...   # scoped, for tests

A bad value for a typed or enum-like variable raises ValueError naming the
variable and what it accepts. Add a variable here, with help text, in the same
change that reads it: a test fails for a variable nothing reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use one of {list(_TRUE + _FALSE[:-1])}")


def _parse_number(kind: Callable[[str], Any]) -> Callable[[str, str], Any]:
    def parse(name: str, raw: str) -> Any:
        try:
            return kind(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None

    return parse


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, type, default and (optionally) choices."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    positive: bool = False  # a number that must be > 0 (a timeout, a count)

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self) -> Any:
        """The typed value, read from os.environ now; the default when unset."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        return self.parse(raw)

    def parse(self, raw: str) -> Any:
        if self.choices is not None:
            value = raw.strip().lower()
            if value not in self.choices:
                raise ValueError(
                    f"{self.name}={raw!r} is not accepted; choose one of {list(self.choices)}"
                )
            return value
        value = _PARSERS[self.kind](self.name, raw)
        if self.positive and not value > 0:  # NaN too
            raise ValueError(f"{self.name}={raw!r} must be a number above 0")
        return value

    def set(self, value: Any) -> None:
        os.environ[self.name] = _format(value)

    def clear(self) -> None:
        os.environ.pop(self.name, None)

    @contextmanager
    def override(self, value: Any) -> Iterator[None]:
        """Set the variable for a scope (None unsets it); the old value comes back after."""
        old = os.environ.get(self.name)
        if value is None:
            self.clear()
        else:
            self.set(value)
        try:
            yield
        finally:
            if old is None:
                self.clear()
            else:
                os.environ[self.name] = old


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "bool": _parse_bool,
    "int": _parse_number(int),
    "float": _parse_number(float),
    "str": lambda name, raw: raw,
    "path": lambda name, raw: Path(raw).expanduser(),
}


class Envs:
    """The registry: one attribute per variable. Unknown names raise AttributeError."""

    SGLANG_ROLE_NAMESPACES = EnvVar(
        "SGLANG_ROLE_NAMESPACES",
        "str",
        "off",
        "Role/namespace audit of config reads: off, record (log pairs), enforce (fail).",
        choices=("off", "record", "enforce"),
    )
    SGLANG_ROLE_NAMESPACES_OUT = EnvVar(
        "SGLANG_ROLE_NAMESPACES_OUT",
        "path",
        None,
        "File that record mode appends `role namespace` lines to (one per new pair).",
    )
    SGLANG_LOG_LEVEL = EnvVar(
        "SGLANG_LOG_LEVEL",
        "str",
        None,
        "Log level overriding --log-level for every process.",
        choices=("debug", "info", "warning", "error", "critical"),
    )
    SGLANG_NUM_THREADS = EnvVar(
        "SGLANG_NUM_THREADS",
        "int",
        None,
        "Torch intra-op threads per process (CPU).",
        positive=True,
    )
    SGLANG_HEALTH_CHECK_TIMEOUT = EnvVar(
        "SGLANG_HEALTH_CHECK_TIMEOUT",
        "float",
        20.0,
        "Seconds /health_generate waits for a token.",
        positive=True,
    )
    SGLANG_HEALTH_TIMEOUT = EnvVar(
        "SGLANG_HEALTH_TIMEOUT",
        "float",
        5.0,
        "Seconds /health waits for the scheduler to answer before it answers 503 "
        "(a scheduler that produced output within this window counts as answering).",
        positive=True,
    )
    SGLANG_GRACEFUL_SHUTDOWN_TIMEOUT = EnvVar(
        "SGLANG_GRACEFUL_SHUTDOWN_TIMEOUT",
        "float",
        10.0,
        "Seconds the HTTP server lets in-flight requests finish after SIGTERM/SIGINT; "
        "those still running a second before the end get an error (a stream: an error "
        "event and [DONE]).",
    )
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN = EnvVar(
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        "bool",
        False,
        "Accept a --context-length longer than the model's max_position_embeddings "
        "(refused otherwise, as in SGLang).",
    )
    SGLANG_GRAMMAR_TIMEOUT = EnvVar(
        "SGLANG_GRAMMAR_TIMEOUT",
        "float",
        300.0,
        "Seconds a constraint's compile may run before its requests fail with a 400 "
        "naming the constraint field (the compile finishes in the background, cached).",
        positive=True,
    )
    SGLANG_FAULT_INJECT = EnvVar(
        "SGLANG_FAULT_INJECT",
        "str",
        None,
        "Testing only: `<site>:<marker>[,...]` makes <site> (forward, detokenize, verify) "
        "raise for requests whose rid contains <marker>, to exercise fault containment; "
        "site `stall` slows each forward of such requests by 50 ms instead.",
    )
    SGLANG_CHILD_READY_TIMEOUT = EnvVar(
        "SGLANG_CHILD_READY_TIMEOUT",
        "float",
        600.0,
        "Seconds the launcher waits for a child process's ready message.",
        positive=True,
    )

    SGLANG_DIST_TIMEOUT = EnvVar(
        "SGLANG_DIST_TIMEOUT",
        "float",
        300.0,
        "Seconds a tensor-parallel collective waits for its peers (gloo/nccl timeout). "
        "A rank whose process exits fails its peers' collective at once; a rank that "
        "stops answering (a node lost from the network) fails it after this long.",
        positive=True,
    )

    SGLANG_CPU_KERNELS = EnvVar(
        "SGLANG_CPU_KERNELS",
        "bool",
        True,
        "Use our native CPU kernels (sgl-kernel/csrc/cpu, built on first use and cached) "
        "on CPU; 0 keeps the torch ops (the kernels' reference).",
    )
    SGLANG_CPU_WEIGHT_PANELS = EnvVar(
        "SGLANG_CPU_WEIGHT_PANELS",
        "bool",
        True,
        "On CPU with bf16 weights under float32 compute, also keep each linear weight "
        "re-laid out for the many-row kernel (packed once at load instead of per call: a "
        "second copy of the linear weights' bytes); 0 packs per call.",
    )
    SGLANG_CPU_AMX = EnvVar(
        "SGLANG_CPU_AMX",
        "bool",
        True,
        "On CPUs with AMX tiles (amx_bf16), bf16 linears of at least 8 rows (over the "
        "load-time weight panels) and a bf16 model's prefill attention over a bf16 KV pool "
        "multiply on the tiles (TDPBF16PS); 0 keeps the AVX-512 bf16 dot product and the "
        "float32 vector attention.",
    )
    SGLANG_CPU_HUGE_PAGES = EnvVar(
        "SGLANG_CPU_HUGE_PAGES",
        "bool",
        True,
        "On Linux CPU, advise the linear and embedding weights and the KV pool onto 2 MiB "
        "transparent huge pages (where THP is not `never`): fewer TLB misses as a step "
        "streams them; 0 leaves them on 4 KiB pages.",
    )
    SGLANG_CPU_HALF_WEIGHTS = EnvVar(
        "SGLANG_CPU_HALF_WEIGHTS",
        "bool",
        True,
        "On CPU, a bf16/fp16 checkpoint run in float32 keeps its linear and embedding "
        "weights in the checkpoint's dtype (widened exactly as they are read: half the "
        "memory and bandwidth, the same results); 0 stores them in float32.",
    )

    TRITON_INTERPRET = EnvVar(
        "TRITON_INTERPRET",
        "bool",
        False,
        "Triton's own switch: run Triton kernels in its interpreter on CPU tensors. Set at "
        "process start (kernels are built when their module is imported), it lets "
        "--attention-backend triton run on cpu, for correctness tests only (very slow).",
    )

    OMP_WAIT_POLICY = EnvVar(
        "OMP_WAIT_POLICY",
        "str",
        None,
        "OpenMP's own switch, read when torch loads: what a worker does after its share "
        "of a parallel region. Unset, a CPU scheduler process starts with PASSIVE (sleep "
        "at once) instead of libgomp's long spin, which holds a core the serving "
        "processes need; ACTIVE keeps the spin.",
    )
    GOMP_SPINCOUNT = EnvVar(
        "GOMP_SPINCOUNT",
        "str",
        None,
        "libgomp's own switch: how long an idle OpenMP worker spins before it sleeps. "
        "Set, it is kept and OMP_WAIT_POLICY is not defaulted to PASSIVE.",
    )

    def __iter__(self) -> Iterator[EnvVar]:
        return iter(all_env_vars())


# Variables another package defines and reads itself; registered because we read them too
THIRD_PARTY_VARIABLES = ("TRITON_INTERPRET", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def check_environment() -> None:
    """Parse every variable that is set: a bad value is a ValueError naming it, at
    start-up, not a failure of the first request (or child) that reads it."""
    for var in all_env_vars():
        if var.is_set():
            var.get()


def all_env_vars() -> list[EnvVar]:
    """Every registered variable, in declaration order."""
    return [v for v in vars(Envs).values() if isinstance(v, EnvVar)]


envs = Envs()
