"""The offline Engine and the launcher shared with the HTTP server.

`_launch_subprocesses(server_args)` resolves the config, spawns the scheduler
and detokenizer processes, waits for their ready messages, builds the
TokenizerManager in this process and starts a watchdog that fails in-flight
requests when a child dies. Given a Ray placement group (`RayEngine`,
`--use-ray`) the schedulers run as Ray actors in it instead (ray_engine.py).
`Engine` runs the TokenizerManager on its own event loop in a background
thread, so its sync methods work from plain code and from inside a running
event loop alike.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypedDict

import psutil
from pydantic import ValidationError

from sglang.srt.arg_groups.cuda_probe import cuda_available
from sglang.srt.entrypoints import child_env
from sglang.srt.entrypoints.per_prompt import (
    check_prompt_count,
    check_same_n,
    option_per_prompt,
    params_per_prompt,
    sample_rids,
)
from sglang.srt.managers.forward_clock import ForwardClock, ForwardClocks
from sglang.srt.managers.io_struct import (
    LOGPROB_FIELDS,
    ChildFailed,
    ChildReady,
    EmbeddingReqInput,
    GenerateReqInput,
    share_logprob_budget,
)
from sglang.srt.managers.ipc import PortArgs
from sglang.srt.managers.node_link import NodeLost, WorkerNodeLink
from sglang.srt.managers.request_errors import ServerUnavailableError
from sglang.srt.managers.scheduler_entry import run_scheduler_process, scheduler_role
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.runtime_context import get_observability
from sglang.srt.sampling.param_types import InvalidParamError, check_num_samples
from sglang.srt.utils import LOG_DATE_FORMAT, log_format

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

WATCHDOG_POLL_S = 0.2
HANG_GRACE_S = 5.0  # past the scheduler's own watchdog before the launcher kills it
# A child ended by one of these was stopped on purpose (systemd or `kill` signalling the
# whole process group, say): logged as a warning, not as a crash.
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


class RequestOptions(TypedDict, total=False):
    """The keyword options of `Engine.generate` / `async_generate` (GenerateReqInput's
    defaults when absent); each may be a list, one per prompt, as SGLang's."""

    return_logprob: bool | list[bool]
    top_logprobs_num: int | list[int]
    # token ids whose logprobs every position lists: one list for all prompts, or one each
    token_ids_logprob: list[int] | list[list[int]]
    logprob_start_len: int | list[int]
    return_text_in_logprobs: bool
    require_reasoning: bool  # the constraint applies after the reasoning (SGLang's)
    rid: Any


# SGLang's Engine.generate / encode keywords that no HTTP route has, and that this server
# does not implement: accepted at their default (None, False, or the value below) as
# SGLang code passes them, refused naming the keyword otherwise (either method takes any). The request fields the routes
# refuse too (priority, lora_path, ...) are checked by the routes' own model,
# UnsupportedSGLangFields.
_NOT_IMPLEMENTED = {
    "image_data": "multimodal inputs are not supported by this server",
    "audio_data": "multimodal inputs are not supported by this server",
    "video_data": "multimodal inputs are not supported by this server",
    "mm_hashes": "multimodal inputs are not supported by this server",
    "mm_content_hashes": "multimodal inputs are not supported by this server",
    "return_routed_experts": "return_routed_experts is not supported by this server",
    "routed_experts_start_len": "return_routed_experts is not supported by this server",
    "bootstrap_host": "prefill/decode disaggregation is not supported by this server",
    "bootstrap_port": "prefill/decode disaggregation is not supported by this server",
    "bootstrap_room": "prefill/decode disaggregation is not supported by this server",
    "disagg_prefill_dp_rank": "prefill/decode disaggregation is not supported by this server",
    "kv_router_hint": "KV router hints are not supported by this server",
    "external_trace_header": "external trace headers are not supported by this server",
    "session_id": "sessions are not supported by this server",
    "cache_salt": "cache salts are not supported by this server",
    "embed_override_token_id": "embedding overrides are not supported by this server",
    "embed_overrides": "embedding overrides are not supported by this server",
}
_NOT_IMPLEMENTED_DEFAULTS = {"routed_experts_start_len": 0}


class ChildStartupError(RuntimeError):
    """A child process failed before reporting ready; carries its traceback text."""


# ----------------------------------------------------------------------------
# Child processes
# ----------------------------------------------------------------------------


class ChildProcesses:
    """The launched children of one server/Engine, their watchdog and shutdown."""

    def __init__(self, port_args: PortArgs) -> None:
        self.port_args = port_args
        # (role, a spawned process or a Ray actor seen as one: ray_engine.ActorProcess)
        self.procs: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.on_death: list[Callable[[str], None]] = []
        self.dead_message: str | None = None
        # (role, process, its scheduler's clock): killed once frozen past hang_limit_s
        self.hang_watches: list[tuple[str, Any, ForwardClock]] = []
        self.hang_limit_s: float | None = None
        self._killed_hung: dict[int, float] = {}  # pid -> seconds it had not stepped
        # run last at shutdown: files and sockets the children no longer need
        self.cleanups: list[Callable[[], None]] = []

    def __iter__(self) -> Iterator[Any]:
        return iter(p for _, p in self.procs)

    def start_watchdog(self) -> None:
        self._watchdog = threading.Thread(target=self._watch, name="sglang-watchdog", daemon=True)
        self._watchdog.start()

    def watch_for_hang(self, role: str, proc: Any, clock: ForwardClock) -> None:
        """Kill `proc` once its scheduler has not stepped for hang_limit_s (set from
        --watchdog-timeout; None: no check): frozen, so its own watchdog cannot act."""
        self.hang_watches.append((role, proc, clock))

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_POLL_S):
            if self.exited_message() is not None:
                return
            self.kill_frozen()

    def kill_frozen(self) -> None:
        """SIGKILL each watched process frozen past hang_limit_s (None: none is)."""
        if self.hang_limit_s is None:
            return
        for role, proc, clock in self.hang_watches:
            silent_s = clock.silent_for_s()
            if silent_s is not None and silent_s > self.hang_limit_s and proc.pid is not None:
                logger.error(
                    "The %s process (pid %d) has not stepped for %.1f s, past "
                    "--watchdog-timeout; it is frozen: killing it",
                    role, proc.pid, silent_s,
                )  # fmt: skip
                self._killed_hung[proc.pid] = silent_s
                _signal_tree(proc.pid, signal.SIGKILL)  # SIGKILL ends a stopped process too

    def _report_death(self, role: str, proc: mp.process.BaseProcess) -> None:
        signal_name = _killing_signal_name(proc.exitcode)
        shown_code = f"{proc.exitcode} ({signal_name})" if signal_name else f"{proc.exitcode}"
        if proc.exitcode is None:  # gone, yet never reaped by us (see _has_exited)
            shown_code = "unknown (another wait in this process reaped it)"
        self.dead_message = (
            f"The {role} process (pid {proc.pid}) exited unexpectedly with code "
            f"{shown_code}; the server cannot serve requests."
        )
        if proc.pid in self._killed_hung:
            self.dead_message = (
                f"The {role} process (pid {proc.pid}) was killed after it had not "
                f"stepped for {self._killed_hung[proc.pid]:.1f} s (frozen, past "
                "--watchdog-timeout); the server cannot serve requests."
            )
        stopped_on_purpose = signal_name in {sig.name for sig in _STOP_SIGNALS}
        logger.log(logging.WARNING if stopped_on_purpose else logging.ERROR, self.dead_message)
        for callback in self.on_death:
            try:
                callback(self.dead_message)
            except Exception:  # a callback must not kill the watchdog's report
                logger.exception("watchdog callback failed")

    def wait_until_one_exits(self) -> str:
        """Block until a child exits (none is expected to), killing a frozen one; the
        death message."""
        while True:
            message = self.exited_message()
            if message is not None:
                return message
            self.kill_frozen()
            time.sleep(WATCHDOG_POLL_S)

    def exited_message(self) -> str | None:
        """The death message if a child has exited (reported once found), else None.
        Of several dead, one killed by a signal is named: a TP rank killed takes its
        peers down with it (their collective fails), and the cause is the killed one."""
        dead = [(role, proc) for role, proc in self.procs if _has_exited(proc)]
        if not dead:
            return None
        role, proc = min(dead, key=lambda rp: _killing_signal_name(rp[1].exitcode) is None)
        self._report_death(role, proc)
        return self.dead_message or ""

    def shutdown(self) -> None:
        """Stop every child (SIGTERM to all at once, then SIGKILL); idempotent. At once:
        a TP rank whose peer went first saw its collective fail, and logged a crash."""
        self._stop.set()
        local = [p for _, p in self.procs if isinstance(p, mp.process.BaseProcess)]
        for _, proc in self.procs:
            if proc not in local:
                proc.stop()  # a Ray actor (ray_engine.ActorProcess)
        _stop_trees([p for p in local if p.pid is not None and p.is_alive()])
        for _, proc in self.procs:
            proc.join(timeout=3.0)
        for cleanup in self.cleanups:
            cleanup()
        self.port_args.cleanup()


def _has_exited(proc: Any) -> bool:
    """Whether `proc` ended. multiprocessing reads a child that someone else reaped (an
    os.wait() of the application's) as alive forever: its pid is gone then."""
    if not proc.is_alive():
        return True
    return proc.pid is not None and not psutil.pid_exists(proc.pid)


def _killing_signal_name(exitcode: Any) -> str | None:
    """'SIGKILL' for a process ended by signal 9 (exitcode -9), else None."""
    if not isinstance(exitcode, int) or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None


def _signal_tree(pid: int, sig: int) -> None:
    """Send `sig` to `pid` and its descendants, now (no grace period)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


def _stop_trees(roots: list[mp.process.BaseProcess], timeout_s: float = 3.0) -> None:
    """SIGTERM every process of these trees together, then SIGKILL what survives.

    The roots are this process's multiprocessing children: they are joined through
    multiprocessing, which reaps them. psutil must not wait on them: it would reap
    them behind multiprocessing's back, whose is_alive() then stays True, and whose
    exit handler later signals the pid, which by then may be another process's."""
    descendants = []
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants += psutil.Process(root.pid).children(recursive=True)
    for proc in descendants:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.terminate()
    for root in roots:
        root.terminate()
    deadline = time.monotonic() + timeout_s
    for root in roots:
        root.join(max(0.0, deadline - time.monotonic()))
    _, alive = psutil.wait_procs(descendants, timeout=max(0.0, deadline - time.monotonic()))
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    for root in roots:
        if root.is_alive():
            root.kill()
            root.join(timeout_s)
    psutil.wait_procs(alive, timeout=timeout_s)


def _spawn(
    ctx: Any, role: str, target: Callable, args: tuple, env: dict[str, str] | None = None
) -> tuple[Any, Any]:
    """`env`: variables the child's environment adds to ours (child_env.py)."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, writer), name=f"sglang-{role}", daemon=True)
    with _main_module_hidden(), child_env.environment(env or {}):
        proc.start()
    writer.close()
    return proc, reader


_spawn_lock = threading.Lock()


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Keep spawn from re-running the caller's script in the child.

    The child's target and arguments are sglang objects, so the child never needs
    `__main__`; hiding it lets a plain script build an Engine without an
    `if __name__ == "__main__":` guard.
    """
    main = sys.modules.get("__main__")
    with _spawn_lock:  # read under the lock: another thread's spawn has them hidden
        saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main and k in main.__dict__}
        try:
            for key in saved:
                setattr(main, key, None) if key == "__spec__" else delattr(main, key)
            yield
        finally:
            for key, value in saved.items():
                setattr(main, key, value)


def _wait_ready(role: str, proc: Any, reader: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if reader.poll(0.1):
            try:
                msg = reader.recv()
            except EOFError:
                msg = None
            if isinstance(msg, ChildReady):
                return msg.info
            if isinstance(msg, ChildFailed):
                raise ChildStartupError(
                    f"The {role} process failed to start:\n{msg.traceback_text}"
                )
        if not proc.is_alive():
            raise ChildStartupError(
                f"The {role} process exited during startup with code {proc.exitcode}."
            )
    raise ChildStartupError(f"The {role} process did not report ready within {timeout_s:.0f} s.")


def _launch_subprocesses(
    server_args: Any, placement_group: Any = None
) -> tuple[TokenizerManager, ChildProcesses]:
    """Start the schedulers (tp_size per DP rank), the DP controller (dp_size > 1) and
    the detokenizer (detokenizer_mode process), wait for ready, build the TokenizerManager.

    `placement_group`: a Ray placement group to run the schedulers in, as actors
    (None: spawned processes). It is the caller's to remove. On any failure every
    started child is stopped before the error propagates.
    """
    from sglang.srt.environ import envs
    from sglang.srt.parser.chat_template import resolve_auto_parsers
    from sglang.srt.server_args import resolution_result

    # Unsupported topologies (pp_size, a DP group split across nodes) are refused when
    # the ServerArgs is built or resolved (arg_groups), not here.
    server_args.resolve_once()
    if int(resolution_result(server_args, "node_rank")) > 0:
        raise ValueError(
            "node_rank > 0 runs scheduler ranks only (launch_server serves them with "
            "run_worker_node); the Engine and the HTTP server run on node 0"
        )
    _check_device_present(str(resolution_result(server_args, "device")))
    # Parsers detected from the chat template: decided before the children fork, so
    # they inherit them; the caller's ServerArgs stays as it was.
    server_args = resolve_auto_parsers(server_args)
    dp_size = int(resolution_result(server_args, "dp_size"))
    inline_detokenizer = resolution_result(server_args, "detokenizer_mode") == "inline"
    port_args = PortArgs.init_new(
        resolution_result(server_args, "dist_init_addr"), dp_size, inline_detokenizer
    )
    children = ChildProcesses(port_args)
    ctx = mp.get_context("spawn")
    try:
        # one clock per DP rank of this node: the others' schedulers are out of reach
        clocks = _forward_clocks(ctx, children, len(_node_dp_ranks(server_args)), placement_group)
        readers = _launch_scheduler_processes(
            ctx, children, server_args, port_args, clocks, placement_group
        )
        readers += _launch_relay_processes(
            ctx, children, server_args, port_args, dp_size, inline_detokenizer
        )
        ready_timeout_s = envs.SGLANG_CHILD_READY_TIMEOUT.get()
        infos = {
            role: _wait_ready(role, proc, reader, ready_timeout_s) for role, proc, reader in readers
        }
        ready_info = _replicas_ready_info(_rank_ready_infos(infos, server_args))
        tokenizer_manager = TokenizerManager(server_args, port_args, ready_info=ready_info)
        tokenizer_manager.forward_clock = clocks[0] if dp_size == 1 else ForwardClocks(clocks)
        _record_detected_parsers(tokenizer_manager, server_args)
        children.on_death.append(tokenizer_manager.on_child_death)
        children.hang_limit_s = hang_limit_s(get_observability().watchdog_timeout)
        children.start_watchdog()
    except BaseException:  # a signal's SystemExit included, up to the return
        children.shutdown()
        raise
    return tokenizer_manager, children


def hang_limit_s(watchdog_timeout_s: float | None) -> float | None:
    """Seconds without a scheduler step after which the launcher kills it; None: never.

    Past the time the scheduler's own watchdog takes to end a forward that runs past
    the timeout (it checks every min(timeout/4, 5) s), plus a grace: a scheduler that
    is merely slow exits by itself first, so only a frozen one is killed from here."""
    if not watchdog_timeout_s or watchdog_timeout_s <= 0:
        return None
    return watchdog_timeout_s + min(watchdog_timeout_s / 4, 5.0) + HANG_GRACE_S


def _check_device_present(device: str) -> None:
    """An explicit --device cuda on a machine without one: refused here, not by an
    AssertionError in every scheduler."""
    if device.startswith("cuda") and not cuda_available():
        raise ValueError(
            f"device={device!r} is not accepted here: torch sees no CUDA (or ROCm) device "
            "(use --device cpu, or auto)"
        )


def _launch_relay_processes(
    ctx: Any,
    children: ChildProcesses,
    server_args: Any,
    port_args: PortArgs,
    dp_size: int,
    inline_detokenizer: bool,
) -> list[tuple[str, Any, Any]]:
    """Start the processes between the schedulers and the TokenizerManager: the DP
    controller (dp_size > 1) and the detokenizer (not with detokenizer_mode inline, where
    the TokenizerManager detokenizes). Returns their (role, process, ready reader)."""
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    args = (server_args, port_args)
    readers = []
    if dp_size > 1:
        from sglang.srt.managers.data_parallel_controller import (
            run_data_parallel_controller_process,
        )

        clock = ForwardClock.shared(ctx)  # its steps, so a frozen controller is killed
        readers.append(
            _spawn_child(
                ctx, children, "dp_controller", run_data_parallel_controller_process,
                (*args, clock),
            )  # fmt: skip
        )
        children.watch_for_hang("dp_controller", readers[-1][1], clock)
    if not inline_detokenizer:
        clock = ForwardClock.shared(ctx)  # its steps, so a frozen detokenizer is killed
        readers.append(
            _spawn_child(ctx, children, "detokenizer", run_detokenizer_process, (*args, clock))
        )
        children.watch_for_hang("detokenizer", readers[-1][1], clock)
    return readers


def _first_tp_roles(server_args: Any) -> list[str]:
    """The roles of the first TP rank of each DP rank this node runs."""
    from sglang.srt.server_args import resolution_result

    tp_size = int(resolution_result(server_args, "tp_size"))
    dp_size = int(resolution_result(server_args, "dp_size"))
    return [scheduler_role(dp_size, tp_size, d, 0) for d in _node_dp_ranks(server_args)]


def _rank_ready_infos(infos: dict[str, dict[str, Any]], server_args: Any) -> list[dict[str, Any]]:
    """Each DP rank's ready info: this node's from its first TP rank, the other nodes'
    as the DP controller received them over their links."""
    remote = infos.get("dp_controller", {}).get("remote_rank_infos", {})
    return [infos[role] for role in _first_tp_roles(server_args)] + list(remote.values())


def _node_dp_ranks(server_args: Any) -> range:
    from sglang.srt.arg_groups.parallel import node_scheduler_ranks

    dp_ranks, _ = node_scheduler_ranks(*_layout(server_args))
    return dp_ranks


def _layout(server_args: Any) -> tuple[int, int, int, int]:
    """(tp_size, dp_size, nnodes, node_rank)."""
    from sglang.srt.server_args import resolution_result

    names = ("tp_size", "dp_size", "nnodes", "node_rank")
    return tuple(int(resolution_result(server_args, name)) for name in names)


def _forward_clocks(
    ctx: Any, children: ChildProcesses, dp_size: int, placement_group: Any
) -> list[ForwardClock]:
    if placement_group is None:
        return [ForwardClock.shared(ctx) for _ in range(dp_size)]
    from sglang.srt.entrypoints.ray_engine import actor_forward_clocks  # cycle; imports ray

    return actor_forward_clocks(children, dp_size)


def _launch_scheduler_processes(
    ctx: Any,
    children: ChildProcesses,
    server_args: Any,
    port_args: PortArgs,
    clocks: list,
    placement_group: Any = None,
) -> list[tuple[str, Any, Any]]:
    """This node's scheduler processes: of each of its DP ranks, the TP ranks it runs
    (all tp_size of them unless one DP rank's TP ranks span the nodes); `clocks` has
    one entry per DP rank of this node, shared by its TP rank 0. With a Ray
    `placement_group`, every rank is an actor in its bundle instead."""
    if placement_group is not None:
        from sglang.srt.entrypoints.ray_engine import launch_scheduler_actors  # cycle

        return launch_scheduler_actors(children, server_args, port_args, clocks, placement_group)
    from sglang.srt.arg_groups.parallel import node_scheduler_ranks
    from sglang.srt.server_args import resolution_result

    tp_size, dp_size, nnodes, node_rank = _layout(server_args)
    dp_ranks, tp_ranks = node_scheduler_ranks(tp_size, dp_size, nnodes, node_rank)
    env = child_env.scheduler_env(str(resolution_result(server_args, "device")))
    readers = []
    for dp_rank, clock in zip(dp_ranks, clocks, strict=True):
        rank_args = port_args.for_dp_rank(dp_rank)
        for tp_rank in tp_ranks:
            role = scheduler_role(dp_size, tp_size, dp_rank, tp_rank)
            watched = tp_rank == tp_ranks[0]  # rank 0, or this node's first of a TP group
            args = (server_args, rank_args, tp_rank, clock if watched else None)
            readers.append(_spawn_child(ctx, children, role, run_scheduler_process, args, env))
            if watched:  # the ranks step together: a frozen one stalls them all
                children.watch_for_hang(role, readers[-1][1], clock)
    return readers


def run_worker_node(server_args: Any) -> int:
    """Node `node_rank` > 0 of a multi-node server: run this node's scheduler ranks until
    one exits or node 0 is lost (none should: a peer node lost, or node 0 stopped, ends
    them); exit code 1.

    With dp_size 1 its TP ranks never talk ZMQ (rank 0, on node 0, does); they meet
    node 0's ranks at the dist_init_addr rendezvous. With dp_size > 1 it runs whole DP
    groups, each with a local rendezvous, and relays their queues over the link to
    node 0's DP controller (node_link.py). SIGTERM/SIGINT (SystemExit) stop them.
    """
    from sglang.srt.environ import envs
    from sglang.srt.parser.chat_template import resolve_auto_parsers
    from sglang.srt.server_args import resolution_result

    server_args.resolve_once()
    server_args = resolve_auto_parsers(server_args)  # the same config as node 0's ranks
    dist_init_addr = resolution_result(server_args, "dist_init_addr")
    _, dp_size, _, node_rank = _layout(server_args)
    dp_ranks = _node_dp_ranks(server_args)
    # whole DP groups here: their TP rendezvous are this node's (free local ports)
    port_args = PortArgs.init_new(dist_init_addr if dp_size == 1 else None, dp_size)
    children = ChildProcesses(port_args)
    link = None
    ctx = mp.get_context("spawn")
    try:
        if dp_size > 1:  # bound before the schedulers start pushing to its queues
            link = WorkerNodeLink(port_args, dist_init_addr, node_rank, dp_ranks)
        # each DP group's (or the TP group's) first rank here stamps a clock: a frozen
        # rank, or one blocked in a collective with a lost node, is killed past the limit
        clocks = [ForwardClock.shared(ctx) for _ in dp_ranks]
        children.hang_limit_s = hang_limit_s(resolution_result(server_args, "watchdog_timeout"))
        readers = _launch_scheduler_processes(ctx, children, server_args, port_args, clocks)
        ready_timeout_s = envs.SGLANG_CHILD_READY_TIMEOUT.get()
        infos = {
            role: _wait_ready(role, proc, reader, ready_timeout_s) for role, proc, reader in readers
        }
        logger.info("node ready: %s", ", ".join(role for role, _ in children.procs))
        if link is None:
            children.wait_until_one_exits()
            logger.error("this node stops: a TP rank here exited (a peer node lost or stopped?)")
            return 1
        link.send_ready(dict(zip(dp_ranks, (infos[r] for r in _first_tp_roles(server_args)))))
        return _relay_until_stopped(children, link)
    finally:
        children.shutdown()
        if link is not None:
            link.close()


def _relay_until_stopped(children: ChildProcesses, link: WorkerNodeLink) -> int:
    """Node k > 0 with whole DP groups: relay their queues to and from node 0 until a
    scheduler here exits or node 0 is lost; the exit code (1)."""
    while children.exited_message() is None:
        children.kill_frozen()
        try:
            link.pump(WATCHDOG_POLL_S)
        except NodeLost as exc:
            logger.error("this node stops: %s (node 0 lost or stopped?)", exc)
            return 1
    logger.error("this node stops: a scheduler here exited")
    return 1


def _spawn_child(
    ctx: Any,
    children: ChildProcesses,
    role: str,
    target: Callable,
    args: tuple,
    env: dict[str, str] | None = None,
) -> tuple[str, Any, Any]:
    proc, reader = _spawn(ctx, role, target, args, env)
    children.procs.append((role, proc))
    return role, proc, reader


def _replicas_ready_info(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """What the TokenizerManager checks requests against: the smallest replica's limits."""
    keys = set.intersection(*(set(info) for info in infos))
    return {key: min(info[key] for info in infos) for key in keys}


def _record_detected_parsers(tokenizer_manager: TokenizerManager, launch_args: Any) -> None:
    """Detection is this engine's control-plane state: the readback (/server_info,
    get_server_info) and the chat route read it from the TokenizerManager."""
    from sglang.srt.parser.chat_template import DETECT_SOURCE, detected_parsers

    detected = detected_parsers(launch_args)
    if detected:
        tokenizer_manager.record_config_updates(DETECT_SOURCE, **detected)


# ----------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------


# ServerArgs fields that configure the HTTP server, which an Engine does not run
HTTP_ONLY_FIELDS = (
    "host", "port", "api_key", "max_request_body_mb", "skip_server_warmup", "enable_metrics",
    "served_model_name",  # the OpenAI routes' model name (/v1/models)
    # the chat route's (the Engine has no chat API). reasoning_parser names the end token
    # of require_reasoning, which the Engine takes, and chat_template is where it is
    # detected from: neither is a no-op here
    "tool_call_parser",
)  # fmt: skip


def _warn_http_only_fields(server_args: Any) -> None:
    """An Engine given HTTP-server settings: a warning each (no effect here)."""
    defaults = {f.name: f.default for f in dataclasses.fields(server_args)}
    for name in HTTP_ONLY_FIELDS:
        if getattr(server_args, name) != defaults[name]:
            logger.warning(
                "%s has no effect on an Engine: it configures the HTTP server "
                "(python -m sglang.launch_server)", name,
            )  # fmt: skip


def _apply_log_level_here(level: Any) -> None:
    """A log_level the caller gave holds in this process too, for sglang's own loggers
    (the application's logging stays its own); the children apply it themselves. An
    invalid value is left to ServerArgs to refuse."""
    if isinstance(level, str) and isinstance(logging.getLevelName(level.upper()), int):
        logging.getLogger("sglang").setLevel(level.upper())


def _show_request_lines_here(server_args: Any) -> None:
    """log_requests on an Engine: its request lines come from this process (the
    TokenizerManager), where an application that configured no logging saw none (Python's
    last-resort handler drops INFO). Such an application gets a handler on sglang's
    logger, in the children's format; one with logging of its own keeps it."""
    sglang_logger = logging.getLogger("sglang")
    if not server_args.log_requests or sglang_logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(log_format(" engine"), LOG_DATE_FORMAT))
    sglang_logger.addHandler(handler)
    if sglang_logger.level == logging.NOTSET:
        sglang_logger.setLevel(str(server_args.log_level or "info").upper())


class Engine:
    """Offline generation: `Engine(model_path=...).generate(prompts, sampling_params)`."""

    def __init__(self, server_args: Any = None, **kwargs: Any) -> None:
        from sglang.srt.server_args import ServerArgs

        if server_args is None:
            _apply_log_level_here(kwargs.get("log_level"))
            server_args = ServerArgs(**kwargs)
        elif kwargs:
            raise ValueError("pass either server_args or keyword fields, not both")
        elif not isinstance(server_args, ServerArgs):
            raise TypeError(
                f"server_args must be a ServerArgs, not {type(server_args).__name__}; "
                "pass the fields as keywords: Engine(model_path=...)"
            )
        else:
            _apply_log_level_here(server_args.log_level)
        self.server_args = server_args
        self._closed = False
        # calls submitted to the loop and not done: shutdown cancels what the stopped loop
        # would never finish (a prompt tokenized off the loop), so no caller waits for ever
        self._submit_lock = threading.Lock()
        self._inflight: set[concurrent.futures.Future] = set()
        _warn_http_only_fields(server_args)
        _show_request_lines_here(server_args)
        self.tokenizer_manager, self._children = self._launch_subprocesses(server_args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sglang-engine-loop", daemon=True
        )
        self._thread.start()
        _live_engines.add(self)

    # ------------------------------------------------------------------ plumbing

    def _launch_subprocesses(
        self, server_args: Any, placement_group: Any = None
    ) -> tuple[TokenizerManager, ChildProcesses]:
        """The launch hook; RayEngine passes its placement group."""
        return _launch_subprocesses(server_args, placement_group)

    def _run(self, coro: Any) -> Any:
        """`coro` run on the Engine's loop; interrupted here (Ctrl-C), it is cancelled
        there too (a generate's requests are then aborted)."""
        future = self._submit(coro)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:  # cancelled by shutdown, not by the caller
                raise self._shut_down_error() from None
            raise
        except BaseException:
            future.cancel()
            raise

    async def _arun(self, coro: Any) -> Any:
        try:
            return await asyncio.wrap_future(self._submit(coro))
        except asyncio.CancelledError:
            if self._closed:  # cancelled by shutdown, not by the caller
                raise self._shut_down_error() from None
            raise

    def _submit(self, coro: Any) -> concurrent.futures.Future:
        """`coro` scheduled on the loop, tracked until done; a RuntimeError once shut
        down (under the lock: a call cannot slip in after shutdown's last look)."""
        with self._submit_lock:
            if self._closed:
                coro.close()  # never to run: closed, so Python warns of no unawaited coroutine
                raise RuntimeError("this Engine is shut down")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return future

    def _shut_down_error(self) -> Exception:
        return ServerUnavailableError("The engine is shut down.")

    # ------------------------------------------------------------------ generate

    def generate(
        self,
        prompt: Any = None,
        sampling_params: Any = None,
        input_ids: Any = None,
        stream: bool = False,
        **options: Unpack[RequestOptions],
    ) -> Any:
        """dict (one prompt), list of dicts (a list, or n > 1), or an iterator when streaming."""
        options = _own_keywords("generate", options, RequestOptions.__annotations__, self._dp_ranks)
        reqs, is_batch = _build_requests(
            prompt, sampling_params, input_ids, stream,
            check_size=self.tokenizer_manager.check_request_size, **options,
        )  # fmt: skip
        if stream:
            return self._stream_sync(reqs)
        results = self._run(self._gather(reqs))
        return results if is_batch else results[0]

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: Any = None,
        input_ids: Any = None,
        stream: bool = False,
        **options: Unpack[RequestOptions],
    ) -> Any:
        options = _own_keywords(
            "async_generate", options, RequestOptions.__annotations__, self._dp_ranks
        )
        reqs, is_batch = _build_requests(
            prompt, sampling_params, input_ids, stream,
            check_size=self.tokenizer_manager.check_request_size, **options,
        )  # fmt: skip
        if stream:
            return self._stream_async(reqs)
        results = await self._arun(self._gather(reqs))
        return results if is_batch else results[0]

    async def _gather(self, reqs: list[Any], one: Callable | None = None) -> list[dict[str, Any]]:
        """All outputs (of `one`, default: a generation); when one request fails (or the
        caller cancels), the others are cancelled, which aborts them in the scheduler,
        before the error propagates."""
        one = one or self._one
        tasks = [asyncio.ensure_future(one(r)) for r in reqs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _one(self, req: GenerateReqInput) -> dict[str, Any]:
        final = None
        async for out in self.tokenizer_manager.generate_request(req):
            final = out
        return final

    def _stream_sync(self, reqs: list[GenerateReqInput]) -> Iterator[dict[str, Any]]:
        stream = _LoopStream(_incremental(self._merged_stream(reqs)))
        try:
            while True:
                try:
                    yield self._run(stream.next())
                except StopAsyncIteration:
                    return
        finally:
            if self._closed:
                pass
            elif threading.current_thread() is self._thread:
                # finalized on the loop's own thread (a collection ran there while this
                # generator sat in a reference cycle): waiting for the loop would wait
                # for itself, and every later call with it
                self._loop.create_task(stream.close())
            else:
                self._run(stream.close())

    async def _stream_async(self, reqs: list[GenerateReqInput]) -> AsyncIterator[dict[str, Any]]:
        stream = _LoopStream(_incremental(self._merged_stream(reqs)))
        try:
            while True:
                try:
                    yield await self._arun(stream.next())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                await self._arun(stream.close())

    async def _merged_stream(self, reqs: list[GenerateReqInput]) -> AsyncIterator[dict]:
        """Cumulative outputs of several requests, interleaved, tagged with "index"."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, req: GenerateReqInput) -> None:
            try:
                async for out in self.tokenizer_manager.generate_request(req):
                    await queue.put((index, out, None))
            except BaseException as exc:  # forwarded to the consumer
                await queue.put((index, None, exc))
            await queue.put((index, None, None))

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(reqs)]
        try:
            remaining = len(reqs)
            while remaining:
                index, out, exc = await queue.get()
                if exc is not None:
                    raise exc
                if out is None:
                    remaining -= 1
                    continue
                out["index"] = index
                yield out
        finally:
            for task in tasks:
                task.cancel()

    # ------------------------------------------------------------------ encode

    def encode(
        self,
        prompt: Any = None,
        input_ids: Any = None,
        dimensions: int | None = None,
        rid: Any = None,
        **sglang_keywords: Any,
    ) -> Any:
        """Embeddings from an `--is-embedding` engine: {"embedding", "meta_info"} for one
        prompt (text or ids), a list of them for a list; the requests batch together."""
        _own_keywords("encode", sglang_keywords, (), self._dp_ranks)
        reqs, is_batch = _embedding_requests(prompt, input_ids, dimensions, rid)
        results = self._run(self._gather(reqs, self.tokenizer_manager.encode_request))
        return results if is_batch else results[0]

    async def async_encode(
        self,
        prompt: Any = None,
        input_ids: Any = None,
        dimensions: int | None = None,
        rid: Any = None,
        **sglang_keywords: Any,
    ) -> Any:
        _own_keywords("async_encode", sglang_keywords, (), self._dp_ranks)
        reqs, is_batch = _embedding_requests(prompt, input_ids, dimensions, rid)
        results = await self._arun(self._gather(reqs, self.tokenizer_manager.encode_request))
        return results if is_batch else results[0]

    @property
    def _dp_ranks(self) -> int:
        return self.tokenizer_manager.num_dp_ranks

    # ------------------------------------------------------------------ control

    def flush_cache(self) -> bool:
        return self._run(self.tokenizer_manager.flush_cache())

    def get_internal_state(self) -> list[dict[str, Any]]:
        return self._run(self.tokenizer_manager.get_internal_state())

    def get_server_info(self) -> dict[str, Any]:
        from sglang import __version__

        states = self.get_internal_state()
        info = dict(self.tokenizer_manager.resolved_config_dict())
        info.update(internal_states=states, version=__version__)
        return info

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None):
        return self._run(self.tokenizer_manager.update_weights_from_disk(model_path, load_format))

    def child_pids(self) -> dict[str, int]:
        return {role: proc.pid for role, proc in self._children.procs}

    def abort_request(self, rid: str) -> bool:
        """Abort request `rid` (and its samples `<rid>-<k>` of n > 1); whether one was
        in flight (TokenizerManager.abort_request)."""

        async def abort() -> bool:
            return self.tokenizer_manager.abort_request(rid, with_samples=True)

        return self._run(abort())

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Stop the children and the loop thread; idempotent, never hangs."""
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
        _live_engines.discard(self)
        self._children.shutdown()
        self.tokenizer_manager.on_child_death("The engine is shut down.")
        closing = asyncio.run_coroutine_threadsafe(self.tokenizer_manager.aclose(), self._loop)
        with contextlib.suppress(Exception):
            closing.result(timeout=5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        for future in list(self._inflight):  # what the stopped loop will never finish
            future.cancel()
        if not self._thread.is_alive():  # stopped: its selector and pipes go now, not at exit
            self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class _LoopStream:
    """An async generator that lives on the Engine's loop, stepped from the caller's
    thread or loop. A caller cancelled (a timeout, Ctrl-C) while a step is in flight
    cancels that step on the loop; close() waits for it to end before closing the
    generator, which would otherwise still be running ("aclose(): asynchronous
    generator is already running") and hide the caller's own exception."""

    def __init__(self, agen: AsyncIterator[dict]) -> None:
        self._agen = agen
        self._step: asyncio.Task | None = None

    async def next(self) -> dict:
        """On the Engine's loop."""
        self._step = asyncio.current_task()
        try:
            return await self._agen.__anext__()
        finally:
            self._step = None

    async def close(self) -> None:
        """On the Engine's loop: end a step in flight, then the generator (which aborts
        the requests still running)."""
        step = self._step
        if step is not None:
            step.cancel()
            await asyncio.wait([step])
        await self._agen.aclose()


# meta_info lists that grow with the request; a stream chunk carries their new entries.
_GROWING_META = LOGPROB_FIELDS


async def _incremental(cumulative: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """Turn cumulative outputs into chunks: the text, ids and logprob entries new since
    the request's last chunk (joined, a request's chunks give its whole output)."""
    sent: dict[int, dict[str, int]] = {}  # per index: entries sent of each growing list
    async for out in cumulative:
        counts = sent.setdefault(out.get("index", 0), {})
        chunk = dict(out)
        for key in ("text", "output_ids"):
            chunk[key] = out[key][counts.get(key, 0) :]
            counts[key] = len(out[key])
        meta = out.get("meta_info")
        if isinstance(meta, dict) and any(key in meta for key in _GROWING_META):
            chunk["meta_info"] = meta = dict(meta)
            for key in _GROWING_META:
                if isinstance(meta.get(key), list):
                    entries = meta[key]
                    meta[key] = entries[counts.get(key, 0) :]
                    counts[key] = len(entries)
        yield chunk


def _build_requests(
    prompt: Any,
    sampling_params: Any,
    input_ids: Any,
    stream: bool,
    rid: Any = None,
    check_size: Callable[[int, int, str], None] | None = None,
    **options: Any,
) -> tuple[list[GenerateReqInput], bool]:
    """Expand prompts x n into single requests; returns (requests, is_batch).
    `check_size(num_prompts, n, prompt_param)` may refuse the request's size first.

    Sample k of a seeded request samples with seed + k, as on the HTTP path. One rid
    string for several generations names them `<rid>-<k>` (k counting prompts x n, as
    the HTTP routes do), each with `<rid>` as its parent, which abort_request reaches."""
    from sglang.srt.entrypoints.openai.sampling import for_choice

    items, is_list = _prompt_items(prompt, input_ids)
    params = [_split_samples(sp) for sp in params_per_prompt(sampling_params, len(items))]
    check_same_n([n for _, n in params])
    if check_size is not None:
        check_size(len(items), params[0][1], "prompt" if prompt is not None else "input_ids")
    # return_logprob, top_logprobs_num, ...: one value, or one per prompt
    options_of = {name: option_per_prompt(name, value, len(items)) for name, value in options.items()}
    rids = sample_rids(rid, [n for _, n in params])
    reqs: list[GenerateReqInput] = []
    for i, (item, (sp, n)) in enumerate(zip(items, params)):
        mine = {name: values[i] for name, values in options_of.items()}
        for k in range(n):
            sample_rid, parent = rids[len(reqs)]
            reqs.append(
                GenerateReqInput(
                    **item,
                    sampling_params=dict(for_choice(sp, k)),
                    stream=stream,
                    rid=sample_rid,
                    parent_rid=parent,
                    **mine,
                )
            )
    share_logprob_budget(reqs)
    return reqs, is_list or len(reqs) > 1


def _own_keywords(
    method: str, keywords: dict[str, Any], own: Any, num_dp_ranks: int
) -> dict[str, Any]:
    """`keywords` less SGLang's that this server does not implement, each checked at its
    default (else InvalidParamError naming it, as the HTTP routes' 400); a name that is
    neither in `own` nor SGLang's is a TypeError, as any unknown keyword. A null in `own`
    is dropped: the request's default applies (SGLang's Engine passes its defaults,
    None, for the options the caller left out)."""
    from sglang.srt.entrypoints.openai.protocol import DP_RANK_FIELDS, UnsupportedSGLangFields
    from sglang.srt.sampling.param_types import first_error

    kept = {}
    for name, value in keywords.items():
        if name in own:
            if value is not None:
                kept[name] = value
        elif name in DP_RANK_FIELDS:  # the routes' rule and message
            UnsupportedSGLangFields.model_validate({name: value}).check_dp_routing(num_dp_ranks)
        elif name in UnsupportedSGLangFields.model_fields:  # the routes' rule and message
            try:
                UnsupportedSGLangFields.model_validate({name: value})
            except ValidationError as exc:
                raise first_error(exc) from None
        elif name in _NOT_IMPLEMENTED:
            if not _at_default(name, value):
                raise InvalidParamError(f"{name}: {_NOT_IMPLEMENTED[name]}", name)
        else:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
    return kept


def _at_default(name: str, value: Any) -> bool:
    if value is None or value is False:
        return True
    default = _NOT_IMPLEMENTED_DEFAULTS.get(name)
    return default is not None and type(value) is type(default) and value == default


def _embedding_requests(
    prompt: Any, input_ids: Any, dimensions: int | None, rid: Any
) -> tuple[list[EmbeddingReqInput], bool]:
    items, is_list = _prompt_items(prompt, input_ids)
    rids = (
        [None] * len(items) if rid is None else [r for r, _ in sample_rids(rid, [1] * len(items))]
    )
    reqs = [EmbeddingReqInput(**item, rid=r, dimensions=dimensions) for item, r in zip(items, rids)]
    return reqs, is_list


def _split_samples(params: Any) -> tuple[dict[str, Any], int]:
    """(the sampling dict without `n`, n), n checked by the rule every path uses."""
    if params is not None and not isinstance(params, dict):
        raise InvalidParamError("sampling_params must be a dict", "sampling_params")
    params = dict(params or {})
    n = params.pop("n", 1)
    check_num_samples(n, "sampling_params.n")
    return params, n


def _prompt_items(prompt: Any, input_ids: Any) -> tuple[list[dict[str, Any]], bool]:
    """One `{"text"}` or `{"input_ids"}` dict per prompt, and whether a list was given."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("pass exactly one of prompt or input_ids")
    if prompt is not None:
        is_list = isinstance(prompt, list)
        if is_list:
            check_prompt_count(len(prompt), "text")
        return [{"text": p} for p in (prompt if is_list else [prompt])], is_list
    input_ids = _plain_ids(input_ids)
    if not isinstance(input_ids, list):
        raise InvalidParamError(
            "input_ids must be a list of token ids, or a list of such lists", "input_ids"
        )
    is_list = bool(input_ids) and isinstance(input_ids[0], list)
    return [{"input_ids": ids} for ids in (input_ids if is_list else [input_ids])], is_list


def _plain_ids(value: Any) -> Any:
    """Token ids as Python lists of ints: a numpy array or torch tensor (1-D, or 2-D
    for a batch) by its tolist(), numpy / torch integer scalars as ints. Anything else
    is left for the request checks to refuse by name."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return value
    if all(type(v) is int for v in value):
        return list(value)
    return [_plain_ids(v) for v in value]


# Engines still running at interpreter exit are shut down (no orphan children).
_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _disown_engines_in_fork_child() -> None:
    """A process os.fork()ed from one running Engines inherits their objects, not their
    processes, threads or loop: it must never stop them. At its exit multiprocessing's
    hook SIGTERMed the daemon children it took for its own (the parent's scheduler
    died), and ours shut the parent's engine down."""
    for engine in list(_live_engines):
        engine._closed = True  # its loop thread is not in this process
        for proc in engine._children:
            mp.process._children.discard(proc)  # multiprocessing's own list of children
    _live_engines.clear()


os.register_at_fork(after_in_child=_disown_engines_in_fork_child)


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_live_engines):
        try:
            engine.shutdown()
        except Exception:
            logger.exception("engine shutdown at exit failed")
