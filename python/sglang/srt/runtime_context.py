"""The process-wide runtime context: the published config and the runtime tiers.

One `RuntimeContext` per process, reached through `get_context()`. Every process
entry calls `publish(server_args, role=...)` first; that projects the resolution
result into a tree of read-only namespace bags (`get_exec().kernel.attention_backend`).
After publish, config changes only through `get_context().override(source, **fields)`,
which writes the bags (never the ServerArgs) and is logged for readback.

Runtime state that is not config lives in three tiers: `get_flags()` (typed
groups), `get_resources()` (process-level handles), `get_forward()` (per-forward
flags). This module has no import-time dependency on the rest of the package
(and none on torch): those imports are inside functions.
"""

from __future__ import annotations

import atexit
import contextvars
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

__all__ = [
    "ROLE_NAMESPACE_SETS",
    "ConfigBag",
    "ConfigNotPublishedError",
    "Flags",
    "ForwardFlags",
    "ParallelContext",
    "Resources",
    "RuntimeContext",
    "ServerArgsOverride",
    "assert_published",
    "config_bag",
    "declare_forward_flag",
    "get_context",
    "get_device",
    "get_disagg",
    "get_exec",
    "get_flags",
    "get_forward",
    "get_lora",
    "get_memory",
    "get_mm",
    "get_model",
    "get_observability",
    "get_parallel",
    "get_resources",
    "get_schedule",
    "get_serving",
    "get_server_args",
    "get_spec",
    "is_config_namespace_published",
    "publish",
    "reset_context",
    "restore_context",
    "snapshot_context",
]

TOP_NAMESPACES = (
    "device",
    "model",
    "parallel",
    "exec",
    "schedule",
    "memory",
    "spec",
    "lora",
    "mm",
    "disagg",
    "serving",
    "observability",
)

# Per role, the top-level namespaces it may read (None = all). Narrow a set only
# where a record-mode audit backs it: dp_controller's is the one recorded in
# docs/audits/role_namespaces_dp2.txt (dp_size, load_balance_method; the log level).
ROLE_NAMESPACE_SETS: dict[str, frozenset[str] | None] = {
    "scheduler": None,
    "test": None,
    "tokenizer": None,
    "detokenizer": None,
    "dp_controller": frozenset({"parallel", "observability"}),
}


class ConfigNotPublishedError(ValueError):
    """A config read before `publish()` (or after `reset_context()`)."""


# ---------------------------------------------------------------------------
# Bags
# ---------------------------------------------------------------------------

# Attribute names a bag uses itself; a field or sub-namespace may not take them.
BAG_RESERVED = frozenset({"override", "as_dict", "leaf_names", "path"})


class ConfigBag:
    """A read-only namespace: leaves and sub-bags are plain instance attributes.

    Reads are ordinary attribute loads (cheap, traceable by torch.compile).
    Assignment raises; `override(**kw)` is the scoped, transactional writer.
    """

    def __init__(self, path: str) -> None:
        self.__dict__["_bag_path"] = path
        self.__dict__["_bag_leaves"] = set()
        self.__dict__["_bag_children"] = {}

    @property
    def path(self) -> str:
        return self._bag_path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"config namespace '{self._bag_path}' has no leaf or sub-namespace {name!r}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"config bag '{self._bag_path}' is read-only (tried to set {name!r}): change "
            f"config after publish with get_context().override(source, {name}=...), or for "
            f"a scope with this bag's .override({name}=...)"
        )

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._bag_leaves

    def __repr__(self) -> str:
        return f"ConfigBag({self._bag_path!r}, {self.as_dict()!r})"

    def leaf_names(self) -> frozenset[str]:
        return frozenset(self._bag_leaves)

    def as_dict(self) -> dict[str, Any]:
        """Leaves, and sub-bags as nested dicts (a copy)."""
        out: dict[str, Any] = {name: self.__dict__[name] for name in sorted(self._bag_leaves)}
        for name, child in self._bag_children.items():
            out[name] = child.as_dict()
        return out

    def override(self, **leaves: Any) -> BagOverride:
        """Scoped write of leaves of this bag; all names validated before any write."""
        return BagOverride(self, leaves)

    # -- writers for publish and get_context().override only --

    def _set_leaf(self, name: str, value: Any) -> None:
        self.__dict__[name] = value

    def _add_leaf(self, name: str, value: Any) -> None:
        if name in self._bag_children or name in BAG_RESERVED:
            raise TypeError(f"'{self._bag_path}.{name}' is both a leaf and a sub-namespace")
        self._bag_leaves.add(name)
        self.__dict__[name] = value

    def _child(self, name: str) -> ConfigBag:
        if name in self._bag_leaves or name in BAG_RESERVED:
            raise TypeError(f"'{self._bag_path}.{name}' is both a leaf and a sub-namespace")
        if name not in self._bag_children:
            child = ConfigBag(f"{self._bag_path}.{name}")
            self._bag_children[name] = child
            self.__dict__[name] = child
        return self._bag_children[name]


class BagOverride:
    """Context manager: write leaves on enter, put the old values back on exit."""

    def __init__(self, bag: ConfigBag, leaves: dict[str, Any]) -> None:
        unknown = sorted(set(leaves) - bag.leaf_names())
        if unknown:
            raise ValueError(f"config namespace '{bag.path}' has no leaves {unknown}")
        self._bag = bag
        self._leaves = leaves
        self._saved: dict[str, Any] | None = None

    def __enter__(self) -> ConfigBag:
        self._saved = {name: getattr(self._bag, name) for name in self._leaves}
        for name, value in self._leaves.items():
            self._bag._set_leaf(name, value)
        return self._bag

    def __exit__(self, *exc: object) -> None:
        for name, value in (self._saved or {}).items():
            self._bag._set_leaf(name, value)


def _project(server_args: ServerArgs) -> tuple[dict[str, ConfigBag], dict[str, ConfigBag]]:
    """Build the bag tree from the resolution result; also field name -> holding bag."""
    from sglang.srt.arg_groups.arg_utils import derived_of, namespace_of
    from sglang.srt.arg_groups.overrides import ResolvedView, resolution_result

    roots: dict[str, ConfigBag] = {}
    routes: dict[str, ConfigBag] = {}
    for name, path in namespace_of(type(server_args)).items():
        bag = _bag_at(roots, path)
        bag._add_leaf(name, resolution_result(server_args, name))
        routes[name] = bag
    view = ResolvedView(server_args)
    for name, (path, derived) in derived_of(type(server_args)).items():
        bag = _bag_at(roots, path)
        bag._add_leaf(name, derived.fn(view))
        routes[name] = bag
    return roots, routes


def _bag_at(roots: dict[str, ConfigBag], path: str) -> ConfigBag:
    head, *rest = path.split(".")
    bag = roots.setdefault(head, ConfigBag(head))
    for part in rest:
        bag = bag._child(part)
    return bag


# ---------------------------------------------------------------------------
# Roles
# ---------------------------------------------------------------------------


class RoleAudit:
    """SGLANG_ROLE_NAMESPACES bookkeeping. `mode` is re-read (and validated) at publish."""

    def __init__(self) -> None:
        self.mode = "off"
        self.pairs: set[tuple[str, str]] = set()
        self._exit_hook = False
        self._write_failed = False  # warned once; later pairs stay in memory

    def refresh(self) -> None:
        from sglang.srt.environ import envs

        self.mode = envs.SGLANG_ROLE_NAMESPACES.get()  # raises on a typo
        if self.mode == "record" and not self._exit_hook:
            atexit.register(self.log_summary)
            self._exit_hook = True

    def on_publish(self, role: str) -> None:
        if role not in ROLE_NAMESPACE_SETS:
            message = (
                f"publish(role={role!r}): role is not in ROLE_NAMESPACE_SETS "
                f"{sorted(ROLE_NAMESPACE_SETS)}; add it there with the namespaces it reads"
            )
            if self.mode == "enforce":
                raise ValueError(message)
            logger.warning(message)
        if self.mode == "record":
            self._append(role, "-")

    def on_read(self, role: str | None, namespace: str) -> None:
        if self.mode == "enforce":
            self._enforce(role, namespace)
        elif self.mode == "record" and not _is_compiling():
            if (role or "?", namespace) not in self.pairs:
                self._append(role or "?", namespace)

    def _enforce(self, role: str | None, namespace: str) -> None:
        allowed = ROLE_NAMESPACE_SETS.get(role or "", frozenset())
        if allowed is None or namespace in allowed:
            return
        raise PermissionError(
            f"role {role!r} read config namespace {namespace!r}, outside its set "
            f"{sorted(allowed)} (SGLANG_ROLE_NAMESPACES=enforce). Either add {namespace!r} "
            f"to ROLE_NAMESPACE_SETS[{role!r}] in runtime_context.py, or move the read into "
            f"a process whose role reads that namespace"
        )

    def _append(self, role: str, namespace: str) -> None:
        # Written immediately: workers may die by signal and skip exit hooks.
        from sglang.srt.environ import envs

        self.pairs.add((role, namespace))
        out = envs.SGLANG_ROLE_NAMESPACES_OUT.get()
        if out is None or self._write_failed:
            return
        try:
            with open(out, "a", encoding="utf-8") as f:
                f.write(f"{role} {namespace}\n")
        except OSError as exc:  # the audit must never break the config read it records
            self._write_failed = True
            logger.warning("role audit: cannot write %s (%s); recording in memory only", out, exc)

    def log_summary(self) -> None:
        by_role: dict[str, list[str]] = {}
        for role, namespace in sorted(self.pairs):
            by_role.setdefault(role, []).append(namespace)
        for role, namespaces in by_role.items():
            logger.info("role namespaces read: %s -> %s", role, namespaces)


def _is_compiling() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.compiler.is_compiling())


# ---------------------------------------------------------------------------
# ParallelContext
# ---------------------------------------------------------------------------

# Live read-through names, answered by distributed/parallel_state.py.
PARALLEL_LIVE_NAMES = ("tp_rank", "tp_group", "world_rank", "world_size")


_PARALLEL_NAMES: tuple[frozenset[str], frozenset[str]] | None = None


def _parallel_names() -> tuple[frozenset[str], frozenset[str]]:
    """(config leaves, derived widths) of the parallel namespace; computed once."""
    global _PARALLEL_NAMES
    if _PARALLEL_NAMES is None:
        from sglang.srt.server_args import server_args_derived, server_args_namespaces

        leaves = {n for n, p in server_args_namespaces().items() if p == "parallel"}
        derived = {n for n, (p, _) in server_args_derived().items() if p == "parallel"}
        _PARALLEL_NAMES = (frozenset(leaves), frozenset(derived))
    return _PARALLEL_NAMES


def _live_parallel(name: str) -> Any:
    from sglang.srt.distributed import parallel_state as ps

    getters: dict[str, Callable[[], Any]] = {
        "tp_rank": ps.get_tensor_model_parallel_rank,
        "tp_group": ps.get_tp_group,
        "world_rank": ps.get_world_rank,
        "world_size": ps.get_world_size,
    }
    return getters[name]()


class ParallelContext:
    """One spelling per parallel name.

    Derived widths: test override, else the stamp taken when groups are built,
    else the published leaf. Config leaves: override, else the parallel bag.
    Ranks and groups: override, else live from distributed/parallel_state.
    """

    def __init__(self) -> None:
        self._overrides: list[dict[str, Any]] = []
        self._stamp: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        for layer in reversed(self._overrides):
            if name in layer:
                return layer[name]
        leaves, derived = _parallel_names()
        if name in derived:
            return self._derived_width(name)
        if name in PARALLEL_LIVE_NAMES:
            return _live_parallel(name)
        if name in leaves:
            return getattr(config_bag("parallel"), name)
        raise AttributeError(f"get_parallel() has no name {name!r}")

    def _derived_width(self, name: str) -> Any:
        if name in self._stamp:
            return self._stamp[name]
        bag = _CTX.bags.get("parallel")
        if bag is None:
            raise ConfigNotPublishedError(
                f"get_parallel().{name} is not available: nothing is published, no process "
                f"group stamped it, and no test override names it (publish a config, or "
                f"get_parallel().override({name}=...))"
            )
        return getattr(config_bag("parallel"), name)

    def known_names(self) -> frozenset[str]:
        leaves, derived = _parallel_names()
        return leaves | derived | frozenset(PARALLEL_LIVE_NAMES)

    @contextmanager
    def override(self, **values: Any) -> Iterator[ParallelContext]:
        """Scoped, nesting override of any parallel name (a width, a leaf, a rank)."""
        unknown = sorted(set(values) - self.known_names())
        if unknown:
            raise ValueError(f"get_parallel().override: unknown parallel names {unknown}")
        self._overrides.append(dict(values))
        try:
            yield self
        finally:
            self._overrides.pop()

    def stamp(self, **widths: Any) -> None:
        """Record widths of the groups just built (parallel_state calls this)."""
        _, derived = _parallel_names()
        unknown = sorted(set(widths) - derived)
        if unknown:
            raise ValueError(f"stamp: not derived parallel widths {unknown}")
        self._stamp.update(widths)

    def clear_stamp(self) -> None:
        self._stamp.clear()


# ---------------------------------------------------------------------------
# Runtime tiers: Flags, Resources, ForwardFlags (state, not config)
# ---------------------------------------------------------------------------


class FlagGroup:
    """Base of a typed flag group: writing an undeclared name raises."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise AttributeError(
                f"{type(self).__name__} has no flag {name!r}; declared: "
                f"{sorted(self.__dataclass_fields__)}"  # type: ignore[attr-defined]
            )
        object.__setattr__(self, name, value)

    @contextmanager
    def override(self, **values: Any) -> Iterator[FlagGroup]:
        """Scoped, transactional write: names validated first, old values restored."""
        unknown = sorted(set(values) - set(self.__dataclass_fields__))  # type: ignore[attr-defined]
        if unknown:
            raise AttributeError(f"{type(self).__name__} has no flags {unknown}")
        saved = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    def state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def load(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@dataclass
class CaptureFlags(FlagGroup):
    is_capturing: bool = False
    capture_batch_size: int | None = None
    enable_torch_compile: bool = False


@dataclass
class SpecFlags(FlagGroup):
    # The attention backend in use while a draft runner's forward runs.
    active_attention_backend: str | None = None
    is_draft_forward: bool = False


@dataclass
class DpFlags(FlagGroup):
    is_idle_batch: bool = False


class Flags:
    """The typed flag groups. Groups are fixed objects: publish writes into them."""

    GROUPS: dict[str, type[FlagGroup]] = {
        "capture": CaptureFlags,
        "spec": SpecFlags,
        "dp": DpFlags,
    }

    def __init__(self) -> None:
        for name, cls in self.GROUPS.items():
            object.__setattr__(self, name, cls())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Flags groups are fixed; write get_flags().<group>.{name} instead")

    def groups(self) -> dict[str, FlagGroup]:
        return {name: getattr(self, name) for name in self.GROUPS}

    def state(self) -> dict[str, dict[str, Any]]:
        return {name: group.state() for name, group in self.groups().items()}

    def load(self, state: dict[str, dict[str, Any]]) -> None:
        for name, group in self.groups().items():
            group.load(state[name])

    def reset(self) -> None:
        for name, group in self.groups().items():
            group.load(self.GROUPS[name]().state())


class Resources:
    """Named process-level handles (graph pools, streams, buffers), one reset lifecycle."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}

    def get(self, name: str, default: Any = None) -> Any:
        return self._handles.get(name, default)

    def set(self, name: str, handle: Any) -> None:
        self._handles[name] = handle

    def get_buffer(self, name: str, factory: Callable[[], Any]) -> Any:
        """Get-or-create a persistent buffer by name."""
        if name not in self._handles:
            self._handles[name] = factory()
        return self._handles[name]

    def get_stream(self, name: str) -> Any:
        """Get-or-create a side CUDA stream by name (None on a machine without CUDA)."""
        import torch

        factory = torch.cuda.Stream if torch.cuda.is_available() else (lambda: None)
        return self.get_buffer(f"stream:{name}", factory)

    def handles(self) -> dict[str, Any]:
        return dict(self._handles)

    def load(self, handles: dict[str, Any]) -> None:
        self._handles = dict(handles)

    def reset(self) -> None:
        self._handles.clear()


@dataclass(frozen=True)
class ForwardFlagSpec:
    default: Any
    # compiled=True: a plain slot (read inside compiled code); else a context variable.
    compiled: bool = False


_FORWARD_FLAG_SPECS: dict[str, ForwardFlagSpec] = {
    "is_draft_forward": ForwardFlagSpec(False),
    "is_warmup": ForwardFlagSpec(False),
    "forward_mode": ForwardFlagSpec(None, compiled=True),
    "in_graph_capture": ForwardFlagSpec(False, compiled=True),
}


def declare_forward_flag(name: str, default: Any, *, compiled: bool = False) -> None:
    """Declare a per-forward flag (at import of the module that owns it)."""
    spec = ForwardFlagSpec(default, compiled)
    if _FORWARD_FLAG_SPECS.get(name, spec) != spec:
        raise ValueError(f"forward flag {name!r} is already declared differently")
    _FORWARD_FLAG_SPECS[name] = spec
    _CTX.forward._declare(name, spec)


class ForwardFlags:
    """Per-forward flags: written only through `scoped(**kw)` or `set(**kw)`."""

    def __init__(self) -> None:
        object.__setattr__(self, "_vars", {})
        object.__setattr__(self, "_slots", {})
        for name, spec in _FORWARD_FLAG_SPECS.items():
            self._declare(name, spec)

    def _declare(self, name: str, spec: ForwardFlagSpec) -> None:
        if spec.compiled:
            self._slots.setdefault(name, spec.default)
        elif name not in self._vars:
            self._vars[name] = contextvars.ContextVar(
                f"sglang_forward_{name}", default=spec.default
            )

    def __getattr__(self, name: str) -> Any:
        if name in self._slots:
            return self._slots[name]
        if name in self._vars:
            return self._vars[name].get()
        raise AttributeError(f"unknown forward flag {name!r}; declare_forward_flag() it first")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"forward flags are written with get_forward().scoped({name}=...)")

    def _check(self, values: dict[str, Any]) -> None:
        unknown = sorted(set(values) - set(self._slots) - set(self._vars))
        if unknown:
            raise AttributeError(f"unknown forward flags {unknown}")

    def set(self, **values: Any) -> None:
        """Unscoped write (legacy call sites); prefer `scoped`."""
        self._check(values)
        for name, value in values.items():
            if name in self._slots:
                self._slots[name] = value
            else:
                self._vars[name].set(value)

    @contextmanager
    def scoped(self, **values: Any) -> Iterator[ForwardFlags]:
        self._check(values)
        saved = {n: self._slots[n] for n in values if n in self._slots}
        tokens = [(n, self._vars[n].set(v)) for n, v in values.items() if n in self._vars]
        self._slots.update({n: v for n, v in values.items() if n in self._slots})
        try:
            yield self
        finally:
            self._slots.update(saved)
            for name, token in reversed(tokens):
                self._vars[name].reset(token)

    def reset(self) -> None:
        for name in self._slots:
            self._slots[name] = _FORWARD_FLAG_SPECS[name].default
        for name, var in self._vars.items():
            var.set(_FORWARD_FLAG_SPECS[name].default)


# ---------------------------------------------------------------------------
# The context
# ---------------------------------------------------------------------------


class RuntimeContext:
    """The published record, its bags, the override log, the role, and the tiers."""

    def __init__(self) -> None:
        self.server_args: ServerArgs | None = None
        self.bags: dict[str, ConfigBag] = {}
        self.routes: dict[str, ConfigBag] = {}
        self.overrides: list[tuple[str, dict[str, Any]]] = []
        self.role: str | None = None
        self.flags = Flags()
        self.resources = Resources()
        self.forward = ForwardFlags()
        self.parallel = ParallelContext()
        self.audit = RoleAudit()

    def override(self, source: str, **fields: Any) -> None:
        """Change published config: all names validated before any write, then logged."""
        targets = {name: self._route(name) for name in fields}
        for name, value in fields.items():
            targets[name]._set_leaf(name, value)
        self.overrides.append((source, dict(fields)))
        logger.info("config override from %s: %s", source, fields)

    def _route(self, name: str) -> ConfigBag:
        from sglang.srt.server_args import server_args_derived, server_args_namespaces

        path = server_args_namespaces().get(name) or server_args_derived().get(name, (None,))[0]
        if path is None:
            raise ValueError(f"override: {name!r} is not a config field")
        head, *rest = path.split(".")
        if head not in self.bags:
            raise ConfigNotPublishedError(f"override: config namespace '{head}' not published")
        if self.audit.mode != "off":  # the same role check as a bag read (no bypass)
            self.audit.on_read(self.role, head)
        bag = self.bags[head]
        for part in rest:
            if part not in bag._bag_children:
                raise ValueError(f"override: sub-namespace '{bag.path}.{part}' is missing")
            bag = bag._bag_children[part]
        if name not in bag or self.routes.get(name) is not bag:
            raise ValueError(f"override: {name!r} is not projected into '{bag.path}'")
        return bag

    def overrides_log(self) -> list[tuple[str, dict[str, Any]]]:
        return [(source, dict(fields)) for source, fields in self.overrides]

    def config_leaf(self, name: str) -> Any:
        """Read one published leaf by its flat field name."""
        return getattr(self._route(name), name)

    def resolved_server_args_dict(self) -> dict[str, Any]:
        """The record's resolved_dict() with the override log overlaid (for /server_info)."""
        out = get_server_args().resolved_dict()
        for _, fields in self.overrides:
            out.update(fields)
        return out

    def override_server_args(self, **fields: Any) -> ServerArgsOverride:
        """Test kit: publish a fresh minimal ServerArgs carrying `fields`, scoped."""
        return ServerArgsOverride(fields)


_CTX = RuntimeContext()


def get_context() -> RuntimeContext:
    return _CTX


def publish(server_args: ServerArgs, *, role: str) -> RuntimeContext:
    """Resolve (if needed), install and project `server_args`; last publish wins."""
    from sglang.srt.arg_groups.overrides import stash_of

    _CTX.audit.refresh()
    _CTX.audit.on_publish(role)
    server_args.resolve_once()
    bags, routes = _project(server_args)
    if _CTX.overrides:
        logger.warning("re-publish discards config overrides %s", _CTX.overrides_log())
    _CTX.server_args, _CTX.bags, _CTX.routes = server_args, bags, routes
    _CTX.overrides = []
    _CTX.role = role
    _CTX.flags.capture.enable_torch_compile = bags["exec"].graph.enable_torch_compile
    stash_of(server_args).published = True  # type: ignore[union-attr]
    return _CTX


def assert_published(server_args: ServerArgs, *, role: str) -> None:
    """For constructors: insist the process entry published this record under this role."""
    if _CTX.server_args is None:
        raise ConfigNotPublishedError(
            f"nothing is published: the process entry must call publish(server_args, "
            f"role={role!r}) first"
        )
    if _CTX.server_args is not server_args:
        raise ValueError("another ServerArgs is published than the one this object was given")
    if _CTX.role != role:
        raise ValueError(f"published under role {_CTX.role!r}, expected {role!r}")


def get_server_args() -> ServerArgs:
    if _CTX.server_args is None:
        raise ValueError("Global server args is not set yet!")
    return _CTX.server_args


def config_bag(name: str) -> ConfigBag:
    """The top-level bag `name`; fails closed before publish."""
    bag = _CTX.bags.get(name)
    if bag is None:
        raise ConfigNotPublishedError(
            f"config namespace '{name}' not published: a process entry calls "
            f"publish(server_args, role=...) first; tests use "
            f"get_context().override_server_args(...)"
        )
    if _CTX.audit.mode != "off":
        _CTX.audit.on_read(_CTX.role, name)
    return bag


def is_config_namespace_published(name: str) -> bool:
    return name in _CTX.bags


def get_device() -> ConfigBag:
    return config_bag("device")


def get_model() -> ConfigBag:
    return config_bag("model")


def get_exec() -> ConfigBag:
    return config_bag("exec")


def get_schedule() -> ConfigBag:
    return config_bag("schedule")


def get_memory() -> ConfigBag:
    return config_bag("memory")


def get_spec() -> ConfigBag:
    return config_bag("spec")


def get_lora() -> ConfigBag:
    return config_bag("lora")


def get_mm() -> ConfigBag:
    return config_bag("mm")


def get_disagg() -> ConfigBag:
    return config_bag("disagg")


def get_serving() -> ConfigBag:
    return config_bag("serving")


def get_observability() -> ConfigBag:
    return config_bag("observability")


def get_parallel() -> ParallelContext:
    return _CTX.parallel


def get_flags() -> Flags:
    return _CTX.flags


def get_resources() -> Resources:
    return _CTX.resources


def get_forward() -> ForwardFlags:
    return _CTX.forward


# ---------------------------------------------------------------------------
# Snapshots and the test kit
# ---------------------------------------------------------------------------


@dataclass
class ContextSnapshot:
    server_args: Any
    bags: dict[str, ConfigBag]
    routes: dict[str, ConfigBag]
    overrides: list[tuple[str, dict[str, Any]]]
    role: str | None
    flags: dict[str, dict[str, Any]]
    handles: dict[str, Any]
    parallel_overrides: list[dict[str, Any]]
    parallel_stamp: dict[str, Any]
    bag_values: dict[int, dict[str, Any]] = field(default_factory=dict)


def _all_bags(roots: dict[str, ConfigBag]) -> Iterator[ConfigBag]:
    stack = list(roots.values())
    while stack:
        bag = stack.pop()
        yield bag
        stack.extend(bag._bag_children.values())


def snapshot_context() -> ContextSnapshot:
    """Capture all context state (flags and bag leaves by value)."""
    return ContextSnapshot(
        server_args=_CTX.server_args,
        bags=dict(_CTX.bags),
        routes=dict(_CTX.routes),
        overrides=_CTX.overrides_log(),
        role=_CTX.role,
        flags=_CTX.flags.state(),
        handles=_CTX.resources.handles(),
        parallel_overrides=[dict(layer) for layer in _CTX.parallel._overrides],
        parallel_stamp=dict(_CTX.parallel._stamp),
        bag_values={id(b): {n: b.__dict__[n] for n in b._bag_leaves} for b in _all_bags(_CTX.bags)},
    )


def restore_context(snap: ContextSnapshot) -> None:
    """Reinstate exactly what `snapshot_context()` captured."""
    _CTX.server_args, _CTX.bags, _CTX.routes = snap.server_args, dict(snap.bags), dict(snap.routes)
    _CTX.overrides = [(s, dict(f)) for s, f in snap.overrides]
    _CTX.role = snap.role
    _CTX.flags.load(snap.flags)
    _CTX.resources.load(snap.handles)
    _CTX.parallel._overrides[:] = [dict(layer) for layer in snap.parallel_overrides]
    _CTX.parallel._stamp = dict(snap.parallel_stamp)
    for bag in _all_bags(_CTX.bags):
        for name, value in snap.bag_values.get(id(bag), {}).items():
            bag._set_leaf(name, value)


def reset_context() -> None:
    """Clear everything (test teardown), stamped parallel widths included."""
    _CTX.server_args, _CTX.bags, _CTX.routes = None, {}, {}
    _CTX.overrides = []
    _CTX.role = None
    _CTX.flags.reset()
    _CTX.resources.reset()
    _CTX.forward.reset()
    _CTX.parallel._overrides.clear()
    _CTX.parallel.clear_stamp()
    _CTX.audit.mode = "off"  # re-read from SGLANG_ROLE_NAMESPACES at the next publish
    _CTX.audit.pairs.clear()


# A hub-style id: resolution accepts it without touching the disk.
TEST_MODEL_PATH = "sglang-test/placeholder-model"


class ServerArgsOverride:
    """Publishes a fresh ServerArgs for a test, and puts back everything it replaced.

    A plain class with explicit install()/restore() (also a context manager), so a
    fixture can hold it for a whole test without the GC restoring it at random.
    """

    def __init__(self, fields: dict[str, Any]) -> None:
        from sglang.srt.server_args import check_field_names

        check_field_names(fields)
        self._fields = {"device": "cpu", "model_path": TEST_MODEL_PATH, **fields}
        self._saved: ContextSnapshot | None = None
        self.server_args: ServerArgs | None = None

    def install(self) -> ServerArgs:
        from sglang.srt.server_args import ServerArgs

        server_args = ServerArgs(**self._fields).resolve_once()
        self._saved = snapshot_context()
        publish(server_args, role="test")
        self.server_args = server_args
        return server_args

    def restore(self) -> None:
        if self._saved is not None:
            restore_context(self._saved)
            self._saved = None

    def __enter__(self) -> ServerArgs:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()
