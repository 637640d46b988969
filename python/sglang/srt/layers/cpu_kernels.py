"""Our native CPU kernels (`sgl-kernel/csrc/cpu`), built just in time and cached.

The C++ sources are compiled on first use with torch's C++ extension support (ninja and
the system compiler) into torch's extension cache (`TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions), keyed by a hash of the sources and of this CPU's instruction
set flags (the build uses -march=native), so `pip install -e .` needs no compiler step
and a later start loads the cached library in milliseconds. Without a compiler, or with
`SGLANG_CPU_KERNELS=0`, the layers keep their torch ops; the reason is logged once.

The kernels serve every call on CPU: at decode sizes a handful of torch ops per layer
cost more than their arithmetic, and at prefill sizes the fused kernels make fewer
passes over memory (2048-token chunk of the demo model: 97 vs 140 ms with the torch ops).
The attention backend takes its kernel for decode and extends of a few tokens (verify)
on any build, and for longer extends where the build tiles them (`extend_tiled`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SOURCE_FILES = (
    "parallel.cpp",
    "norm.cpp",
    "activation.cpp",
    "rotary.cpp",
    "paged_attention.cpp",
    "extend_attention.cpp",
    "argmax.cpp",
    "gemm.cpp",
    "gemm_packed.cpp",
    "gemm_packed_bf16.cpp",
    "gemm_amx.cpp",
    "decoder_layer.cpp",
    "bindings.cpp",
)
HEADER_FILES = (
    "common.h",
    "vec.h",
    "kernels.h",
    "paged.h",
    "decoder_layer.h",
    "gemm_packed_bf16.h",
    "amx.h",
    "parallel.h",
)
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")  # part of the cache key
TORCH_BATON = "lock"  # torch.utils.file_baton's file in the build directory

_lock = threading.Lock()
_module: ModuleType | None = None
_state = "unloaded"  # unloaded -> loaded | unavailable
_paused = 0  # > 0 inside disabled(): every call takes the torch ops


def source_dir() -> Path:
    """sgl-kernel/csrc/cpu of this checkout (the package is installed editable)."""
    return Path(__file__).resolve().parents[4] / "sgl-kernel" / "csrc" / "cpu"


def load() -> ModuleType | None:
    """The compiled module, building it on the first call; None when it cannot be built
    (logged once) or SGLANG_CPU_KERNELS=0."""
    global _module, _state
    if _state != "unloaded":
        return _module
    with _lock:
        if _state == "unloaded":
            _module, _state = _build(), "loaded"
            if _module is None:
                _state = "unavailable"
    return _module


def _build() -> ModuleType | None:
    if not envs.SGLANG_CPU_KERNELS.get():
        logger.info("CPU kernels off (SGLANG_CPU_KERNELS=0): using torch ops")
        return None
    src = source_dir()
    missing = [f for f in SOURCE_FILES if not (src / f).is_file()]
    if missing:
        logger.warning("CPU kernels unavailable: %s not found; using torch ops", src / missing[0])
        return None
    start = time.perf_counter()
    try:
        module = _compile(src, CFLAGS)
    except Exception as exc:  # no compiler, no ninja, a build error: keep serving
        logger.warning("CPU kernels unavailable (%s); using torch ops", _first_line(exc))
        return None
    module.use_amx_tiles(envs.SGLANG_CPU_AMX.get())
    logger.info(
        "CPU kernels ready in %.1f s (%s vectors%s%s; %s)",
        time.perf_counter() - start, module.vector_isa,
        ", bf16 dot products" if module.bf16_dot else "",
        ", AMX tiles" if module.amx_tiles() else "", src,
    )  # fmt: skip
    return module


def build_scalar() -> ModuleType:
    """The kernels built with their portable loops only (-DSGL_FORCE_SCALAR), as a CPU
    without AVX2 (or an aarch64 one) runs them: for tests that check that path on any
    machine. Raises when it cannot be built."""
    return _compile(source_dir(), CFLAGS + ("-DSGL_FORCE_SCALAR",))


def build_for_march(march: str) -> ModuleType:
    """The kernels built for another x86 target than this CPU (`-march=x86-64-v3`: the AVX2
    build an AVX-512 machine would otherwise never run), for benchmarks that compare the
    vector paths on one machine. Raises when it cannot be built."""
    return _compile(source_dir(), tuple(f"-march={march}" if f == "-march=native" else f
                                        for f in CFLAGS))  # fmt: skip


def _compile(src: Path, cflags: tuple[str, ...]) -> ModuleType:
    _put_venv_ninja_on_path()
    from torch.utils import cpp_extension  # start-up cost: only when kernels are built

    build_dir = build_directory(src, cflags)
    build_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_build(build_dir):
        return cpp_extension.load(
            name=build_dir.name,
            sources=[str(src / f) for f in SOURCE_FILES],
            extra_cflags=list(cflags),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            verbose=False,
        )


def build_directory(src: Path, cflags: tuple[str, ...]) -> Path:
    """Where the build of `src` with `cflags` lives: one directory per extension name
    in torch's extension cache."""
    from torch.utils import cpp_extension  # start-up cost, as in _compile

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / _extension_name(src, cflags)


@contextlib.contextmanager
def _exclusive_build(build_dir: Path) -> Iterator[None]:
    """One process at a time builds or loads `build_dir`, under an flock the kernel drops
    when its holder dies.

    torch serializes builders with a baton file (`lock`) that it deletes when a build
    ends, and waits without a timeout while it exists: a process killed mid-build (a
    Ctrl-C during a first start, a test's SIGKILL) leaves it behind and every later start
    hangs. Under the flock no live builder owns a baton, so one found there is stale."""
    with open(build_dir / "sglang-build.flock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building the CPU kernels in %s", build_dir)
            fcntl.flock(handle, fcntl.LOCK_EX)
        baton = build_dir / TORCH_BATON
        if baton.exists():
            logger.warning("removing %s left by a build that did not finish", baton)
            baton.unlink(missing_ok=True)
        yield  # the flock goes with the file's close


def _put_venv_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` dependency installs it beside this
    interpreter, which is not on PATH when the venv is not activated."""
    venv_bin = Path(sys.executable).parent
    if shutil.which("ninja") is None and (venv_bin / "ninja").is_file():
        os.environ["PATH"] = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"


def _extension_name(src: Path, cflags: tuple[str, ...]) -> str:
    """A name per (sources, build flags, CPU flags): a cache shared by machines with
    different instruction sets never loads a library built for another one."""
    digest = hashlib.sha256()
    for name in SOURCE_FILES + HEADER_FILES:
        digest.update((src / name).read_bytes())
    digest.update(" ".join(cflags).encode())
    digest.update(_cpu_flags().encode())
    digest.update(torch.__version__.encode())
    # Two checkouts (another worktree, CI's clone) get their own builds: torch rebuilds a
    # name whose source paths changed, so a shared name would rebuild on every switch.
    digest.update(str(src).encode())
    return f"sgl_kernel_cpu_{digest.hexdigest()[:16]}"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def usable(x: torch.Tensor) -> bool:
    """Whether a call on `x` takes the kernels: a CPU tensor of a supported dtype, and
    the kernels built (and not `disabled()`)."""
    return x.dtype in SUPPORTED_DTYPES and serves(x)


def serves(index: torch.Tensor) -> bool:
    """Whether a call indexed by `index` (positions, KV slots) takes the kernels: on CPU,
    the kernels built (and not `disabled()`)."""
    return not _paused and index.device.type == "cpu" and load() is not None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block every layer takes its torch ops (the kernels' reference, and the
    other side of an A/B benchmark in one process). Not thread-safe: for tests and
    benchmarks."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1
