"""Schedulers as Ray actors: `RayEngine` and the `--use-ray` HTTP launcher.

Only the scheduler ranks move: each TP rank of each DP rank is one Ray actor that
runs the spawned scheduler process's entry unchanged (`run_scheduler_process`:
publish, build, ready message, loop). The TokenizerManager, the DP controller and
the detokenizer stay processes of the launcher, and everything still talks ZMQ
over `ipc://`, so the actors must run on the launcher's machine (checked at start).

Placement: DP rank d, TP rank t runs in bundle `d * tp_size + t` of the placement
group. The group is a live cluster object, never config: it is an argument of the
launch functions, held by `RayEngine`, and removed at shutdown only when this
module created it (a caller's group is never removed).

Liveness: each actor's `run` call never returns while its scheduler lives, so its
object ref becoming ready means the actor died; the launcher's watchdog polls it
like a child process's `is_alive`. `ray` is imported lazily (an optional extra).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import struct
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import zmq

from sglang.srt.entrypoints.engine import ChildProcesses, Engine
from sglang.srt.managers.forward_clock import NUM_SLOTS, ForwardClock
from sglang.srt.managers.ipc import PortArgs
from sglang.srt.managers.scheduler_entry import run_scheduler_process, scheduler_role

logger = logging.getLogger(__name__)

RAY_MISSING = 'Ray is not installed; install the extra: pip install -e ".[ray]"'
PLACEMENT_TIMEOUT_S = 60.0  # for the cluster to grant a placement group this module creates
ACTOR_CALL_TIMEOUT_S = 60.0  # for an actor to be placed and answer where it runs
READY_LINGER_MS = 2000  # a ready message still goes out when the actor exits right after
_FLOAT_BYTES = 8


def require_ray() -> Any:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(RAY_MISSING) from exc
    return ray


def init_ray(ray: Any) -> bool:
    """Join RAY_ADDRESS (or a `ray start` cluster of this machine), else start a local
    one; whether this call started the connection (the caller then shuts it down)."""
    if ray.is_initialized():
        return False
    ray.init()
    return True


class _RayUsers:
    """The engines of this process on a Ray connection one of them started: the last
    to shut down ends it (the first one's ray.shutdown killed the others' actors, whose
    requests then hung)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._started = False

    def join(self, ray: Any) -> None:
        with self._lock:
            if init_ray(ray):
                self._started = True
            self._count += 1

    def leave(self, ray: Any) -> None:
        with self._lock:
            self._count -= 1
            if self._count == 0 and self._started:
                self._started = False
                ray.shutdown()


_RAY_USERS = _RayUsers()


# ----------------------------------------------------------------------------
# Placement groups
# ----------------------------------------------------------------------------


def num_scheduler_ranks(server_args: Any) -> int:
    from sglang.srt.server_args import resolution_result

    return int(resolution_result(server_args, "dp_size")) * int(
        resolution_result(server_args, "tp_size")
    )


def create_placement_group(server_args: Any) -> Any:
    """A group of one bundle per scheduler rank, on this node: {"CPU": 1} (+ "GPU": 1
    on cuda); waits until the cluster grants it."""
    import ray
    from ray.util.placement_group import placement_group

    from sglang.srt.server_args import resolution_result

    bundle: dict[str, float] = {"CPU": 1.0}
    if str(resolution_result(server_args, "device")).startswith("cuda"):
        bundle["GPU"] = 1.0
    # Every node has a `node:<ip>` resource; a sliver of it pins the bundle here.
    bundle[f"node:{ray.util.get_node_ip_address()}"] = 0.001
    group = placement_group([dict(bundle)] * num_scheduler_ranks(server_args), strategy="PACK")
    try:
        _wait_granted(ray, group)
    except RuntimeError:
        remove_placement_group(group)
        raise
    return group


def remove_placement_group(group: Any) -> None:
    """Remove a group this module created; quiet when Ray is already shut down."""
    import ray
    from ray.util.placement_group import remove_placement_group as remove

    if ray.is_initialized():
        with contextlib.suppress(Exception):
            remove(group)


# ----------------------------------------------------------------------------
# The actor and how the launcher sees it
# ----------------------------------------------------------------------------


class SchedulerActor:
    """One scheduler rank in a Ray actor (wrapped by `ray.remote` at launch)."""

    def where(self) -> tuple[int, str]:
        """(pid, Ray node id) of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(
        self, server_args: Any, port_args: PortArgs, tp_rank: int, clock: Any, ready: Any
    ) -> None:
        """The spawned process's entry; returns only by the process exiting."""
        run_scheduler_process(server_args, port_args, tp_rank, clock, ready)


class ActorProcess:
    """A scheduler actor seen as the launcher sees a child process (ChildProcesses)."""

    def __init__(self, actor: Any, where_ref: Any, run_ref: Any) -> None:
        self.actor = actor
        self.pid: int | None = None  # known once placed (wait_placed)
        self._where_ref = where_ref
        self._run_ref = run_ref  # ready only once the actor is dead

    def wait_placed(self, role: str) -> None:
        """Wait until the actor runs; refuse one placed off this launcher's node."""
        import ray

        try:
            self.pid, node_id = ray.get(self._where_ref, timeout=ACTOR_CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the {role} actor did not start within {ACTOR_CALL_TIMEOUT_S:.0f} s "
                "(does its bundle of the placement group have room for it?)"
            ) from None
        here = ray.get_runtime_context().get_node_id()
        if node_id != here:
            raise RuntimeError(
                f"the {role} actor runs on Ray node {node_id}, not on this launcher's node "
                f"{here}: the schedulers talk ZMQ over ipc://, so every bundle of the "
                "placement group must be on the launcher's node"
            )

    def is_alive(self) -> bool:
        import ray

        if not ray.is_initialized():  # the connection ended (ray.shutdown): its actors too
            return False
        ready, _ = ray.wait([self._run_ref], timeout=0)
        return not ready

    @property
    def exitcode(self) -> str | None:
        return None if self.is_alive() else "n/a (Ray actor died)"

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        import ray

        if ray.is_initialized():
            ray.wait([self._run_ref], timeout=timeout)


class ZmqReadyReader:
    """The launcher's end of an actor's ready channel (an mp Pipe cannot reach a Ray
    actor): binds a PULL socket; `poll`/`recv` as on a multiprocessing Connection."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"sglang-ready-{uuid.uuid4().hex[:12]}")
        self._ctx = zmq.Context(1)
        self._socket = self._ctx.socket(zmq.PULL)
        self._socket.bind(f"ipc://{self.path}")

    def writer(self) -> ZmqReadyWriter:
        return ZmqReadyWriter(f"ipc://{self.path}")

    def poll(self, timeout_s: float) -> bool:
        return bool(self._socket.poll(int(timeout_s * 1000)))

    def recv(self) -> Any:
        return pickle.loads(self._socket.recv())

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
            self._ctx.term()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ZmqReadyWriter:
    """The actor's end: `send` one message, `close` flushes it (run_child may exit the
    process right after)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._ctx: zmq.Context | None = None
        self._socket: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address, "_ctx": None, "_socket": None}

    def send(self, msg: Any) -> None:
        if self._socket is None:
            self._ctx = zmq.Context(1)
            self._socket = self._ctx.socket(zmq.PUSH)
            self._socket.connect(self.address)
        self._socket.send(pickle.dumps(msg))

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=READY_LINGER_MS)
            self._ctx.term()
            self._socket = self._ctx = None


class MappedFloats:
    """A ForwardClock's floats in a memory-mapped file, shared by the processes of one
    machine: a Ray scheduler's clock (an mp.Array crosses only a spawn). Pickles by path."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, NUM_SLOTS * _FLOAT_BYTES)
        finally:
            os.close(fd)

    @classmethod
    def create(cls) -> MappedFloats:
        fd, path = tempfile.mkstemp(prefix="sglang-clock-")
        os.write(fd, struct.pack(f"{NUM_SLOTS}d", *([0.0] * NUM_SLOTS)))
        os.close(fd)
        return cls(path)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return MappedFloats, (self.path,)

    def __getitem__(self, slot: int) -> float:
        return struct.unpack_from("d", self._map, slot * _FLOAT_BYTES)[0]

    def __setitem__(self, slot: int, seconds: float) -> None:
        struct.pack_into("d", self._map, slot * _FLOAT_BYTES, seconds)

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def actor_forward_clocks(children: ChildProcesses, dp_size: int) -> list[ForwardClock]:
    """One clock per DP rank that a Ray actor can write; the files go at shutdown."""
    shared = [MappedFloats.create() for _ in range(dp_size)]
    children.cleanups += [value.unlink for value in shared]
    return [ForwardClock(value) for value in shared]


# ----------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------


def launch_scheduler_actors(
    children: ChildProcesses,
    server_args: Any,
    port_args: PortArgs,
    clocks: list[ForwardClock],
    placement_group: Any,
) -> list[tuple[str, Any, Any]]:
    """One actor per (DP rank, TP rank) in its bundle; (role, actor, ready reader) each,
    for the launcher's ready wait. The actors are in `children` as they start."""
    from sglang.srt.server_args import resolution_result

    ray = require_ray()
    tp_size = int(resolution_result(server_args, "tp_size"))
    _check_fits(server_args, placement_group, len(clocks) * tp_size)
    _wait_granted(ray, placement_group)
    remote_cls = ray.remote(SchedulerActor)
    tag = uuid.uuid4().hex[:8]
    launched = []
    for dp_rank, clock in enumerate(clocks):
        rank_args = port_args.for_dp_rank(dp_rank)
        for tp_rank in range(tp_size):
            role = scheduler_role(len(clocks), tp_size, dp_rank, tp_rank)
            bundle_idx = dp_rank * tp_size + tp_rank
            actor = _place(remote_cls, server_args, placement_group, bundle_idx, tag)
            reader = ZmqReadyReader()
            children.cleanups.append(reader.close)
            run_args = (server_args, rank_args, tp_rank, clock if tp_rank == 0 else None)
            where_ref = actor.where.remote()
            proc = ActorProcess(actor, where_ref, actor.run.remote(*run_args, reader.writer()))
            children.procs.append((role, proc))
            if tp_rank == 0:  # the ranks step together: a frozen one stalls them all
                children.watch_for_hang(role, proc, clock)
            launched.append((role, proc, reader))
    for role, proc, _ in launched:
        proc.wait_placed(role)
    return launched


def check_single_node(server_args: Any) -> None:
    """ValueError for --nnodes > 1 (on any node): Ray places every rank instead."""
    from sglang.srt.server_args import resolution_result

    if int(resolution_result(server_args, "nnodes")) > 1:
        raise ValueError(
            "--nnodes > 1 starts one launcher per node; RayEngine places every rank "
            "through its placement group instead (use nnodes 1)"
        )


def _check_group_type(placement_group: Any) -> None:
    """TypeError unless `placement_group` is None or a Ray PlacementGroup."""
    from ray.util.placement_group import PlacementGroup

    if placement_group is not None and not isinstance(placement_group, PlacementGroup):
        raise TypeError(
            f"placement_group must be a ray.util.placement_group.PlacementGroup (from "
            f"ray.util.placement_group(...)) or None, not {type(placement_group).__name__}"
        )


def _wait_granted(ray: Any, group: Any) -> None:
    """Wait for the cluster to grant `group` (a caller's, or one create_placement_group
    made); a RuntimeError naming its bundles past PLACEMENT_TIMEOUT_S."""
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"the Ray cluster did not grant the placement group (bundles "
            f"{group.bundle_specs}) within {PLACEMENT_TIMEOUT_S:.0f} s "
            f"(ray.available_resources(): {ray.available_resources()})"
        ) from None


def _check_fits(server_args: Any, placement_group: Any, num_ranks: int) -> None:
    check_single_node(server_args)
    num_bundles = len(placement_group.bundle_specs)
    if num_bundles < num_ranks:
        raise ValueError(
            f"the placement group has {num_bundles} bundles; dp_size x tp_size = "
            f"{num_ranks} scheduler ranks need one each"
        )


def _place(remote_cls: Any, server_args: Any, group: Any, bundle_idx: int, tag: str) -> Any:
    """A scheduler actor in bundle `bundle_idx`, taking up to 1 CPU and 1 GPU of it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from sglang.srt.server_args import resolution_result

    bundle = group.bundle_specs[bundle_idx]
    options: dict[str, Any] = dict(
        name=f"sglang-scheduler-{tag}-{bundle_idx}",
        num_cpus=min(1.0, bundle.get("CPU", 0.0)),
        num_gpus=min(1.0, bundle.get("GPU", 0.0)),
        max_restarts=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=bundle_idx
        ),
    )
    if str(resolution_result(server_args, "device")).startswith("cuda"):
        # A rank picks its device by its index on the node, as a spawned scheduler
        # does; Ray would otherwise narrow CUDA_VISIBLE_DEVICES to one GPU.
        options["runtime_env"] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    return remote_cls.options(**options).remote()


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------


class RayEngine(Engine):
    """An `Engine` whose scheduler ranks run as Ray actors.

    `placement_group`: the caller's group, one bundle per scheduler rank (DP rank d's
    TP ranks in bundles d*tp_size .. (d+1)*tp_size - 1); never removed here. When
    None: the group of the calling Ray task or actor, if any; else one this engine
    creates (see `create_placement_group`) and removes at shutdown. Ray is initialized
    (RAY_ADDRESS, else a local cluster) when it is not already, and then shut down
    with the engine.
    """

    def __init__(self, server_args: Any = None, placement_group: Any = None, **kwargs: Any) -> None:
        ray = require_ray()
        _check_group_type(placement_group)
        _RAY_USERS.join(ray)
        self._joined_ray = True
        if placement_group is None:  # the group of the calling Ray task or actor, if any
            placement_group = ray.util.get_current_placement_group()
        self._placement_group = placement_group
        self._owns_placement_group = self._placement_group is None
        try:
            super().__init__(server_args, **kwargs)
        except BaseException:
            self._release_ray()
            raise

    def _launch_subprocesses(self, server_args: Any, placement_group: Any = None) -> Any:
        if placement_group is None:
            placement_group = self._placement_group
        if placement_group is None:
            server_args.resolve_once()
            placement_group = self._placement_group = create_placement_group(server_args)
        return super()._launch_subprocesses(server_args, placement_group=placement_group)

    def shutdown(self) -> None:
        """Stop the actors and the engine; remove the group if this engine made it."""
        if self._closed:
            return
        super().shutdown()
        self._release_ray()

    def _release_ray(self) -> None:
        if self._owns_placement_group and self._placement_group is not None:
            remove_placement_group(self._placement_group)
        if self._joined_ray:
            self._joined_ray = False
            _RAY_USERS.leave(require_ray())


def launch_server_on_ray(server_args: Any) -> int:
    """`launch_server --use-ray`: the HTTP server with its schedulers as Ray actors, in
    a placement group made for it and removed when the server stops."""
    from sglang.srt.entrypoints.http_server import launch_server

    ray = require_ray()
    server_args.resolve_once()
    check_single_node(server_args)  # before a group holds the cluster's CPUs
    with _ray_session(ray):
        group = create_placement_group(server_args)
        try:
            return launch_server(server_args, placement_group=group)
        finally:
            remove_placement_group(group)


@contextlib.contextmanager
def _ray_session(ray: Any) -> Iterator[None]:
    started = init_ray(ray)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
