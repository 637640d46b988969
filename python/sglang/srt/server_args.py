"""ServerArgs: the operator's input, composed from one class per namespace.

The record is pristine: its fields hold what the operator typed. `resolve_once()`
runs the resolvers, which *declare* values into a stash; `resolution_result(sa,
name)` answers the last declaration, else the raw value. After resolution every
field assignment raises. Readers never read a ServerArgs: they read the bags
that `runtime_context.publish()` projects from the resolution result.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from sglang.srt.arg_groups import (
    NAMESPACE_GROUPS,
    DeviceArgs,
    DisaggArgs,
    ExecArgs,
    ExecFeaturesArgs,
    ExecGraphArgs,
    ExecKernelArgs,
    LoraArgs,
    MemoryArgs,
    ModelArgs,
    MultimodalArgs,
    ObservabilityArgs,
    ParallelArgs,
    ScheduleArgs,
    ServingArgs,
    SpecArgs,
)
from sglang.srt.arg_groups.arg_utils import (
    NS_ATTR,
    derived_of,
    flag_of,
    group_title,
    namespace_of,
    support_note,
)
from sglang.srt.arg_groups.overrides import (
    STASH_ATTR,
    ResolutionStash,
    ResolvedView,
    resolution_result,
    stash_of,
)
from sglang.srt.arg_groups.resolvers import RESOLVERS
from sglang.srt.arg_groups.validation import (
    check_refusals,
    check_types,
    validate,
    warn_noops,
)
from sglang.srt.environ import check_environment

__all__ = [
    "ServerArgs",
    "declare_late_resolution",
    "prepare_server_args",
    "resolution_result",
    "resolution_sources",
    "to_cli_args",
]


# Base order is the reverse of the field order (dataclass walks the MRO backwards).
@dataclass(kw_only=True)
class ServerArgs(
    ObservabilityArgs,
    ServingArgs,
    DisaggArgs,
    MultimodalArgs,
    LoraArgs,
    SpecArgs,
    MemoryArgs,
    ScheduleArgs,
    ExecFeaturesArgs,
    ExecGraphArgs,
    ExecKernelArgs,
    ExecArgs,
    ParallelArgs,
    ModelArgs,
    DeviceArgs,
):
    """Every server option as a flat field; the declaring class gives its namespace."""

    def __post_init__(self) -> None:
        # A flag that is not implemented is refused where the operator typed it.
        check_types(self, dataclasses.fields(self))
        check_refusals(self, dataclasses.fields(self))

    def __setattr__(self, name: str, value: Any) -> None:
        if STASH_ATTR in self.__dict__:
            raise AttributeError(
                f"ServerArgs.{name} cannot be assigned after resolution: use "
                f"derive(source, {name}=...) for a variant, declare_late_resolution() before "
                f"publish, or get_context().override(source, {name}=...) after publish"
            )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ServerArgs.{name} cannot be deleted")

    @property
    def is_resolved(self) -> bool:
        return STASH_ATTR in self.__dict__

    def resolve_once(self) -> ServerArgs:
        """Run the resolvers and validate the result; idempotent. Returns self."""
        if self.is_resolved:
            return self
        stash = ResolutionStash()
        self.__dict__[STASH_ATTR] = stash
        try:
            view = ResolvedView(self)
            for resolver in RESOLVERS:
                declared = resolver(view)
                if declared is not None:
                    stash.declare(*declared)
            validate(view, dataclasses.fields(self))
            check_environment()  # SGLANG_* variables: refused at start-up as flags are
        except BaseException:
            del self.__dict__[STASH_ATTR]
            raise
        warn_noops(view, dataclasses.fields(self), self)
        return self

    def resolved_dict(self) -> dict[str, Any]:
        """Every field's resolution result (the raw value where nothing was declared)."""
        return {f.name: resolution_result(self, f.name) for f in dataclasses.fields(self)}

    def derive(self, source: str, **fields: Any) -> ServerArgs:
        """A variant carrying `fields`; the receiver (and bags projected from it) untouched.

        Resolution does not re-run on the variant: the values are decided after it.
        The variant is not published, whatever the receiver was.
        """
        check_field_names(fields)
        variant = copy.deepcopy(self)
        stash = stash_of(variant)
        if stash is None:
            for name, value in fields.items():
                setattr(variant, name, value)
            return variant
        stash.published = False
        stash.declare(source, fields)
        validate(ResolvedView(variant), dataclasses.fields(variant))
        return variant


def check_field_names(fields: dict[str, Any]) -> None:
    known = FIELD_NAMES
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown ServerArgs field(s) {unknown}")


FIELD_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ServerArgs))


def declare_late_resolution(server_args: ServerArgs, source: str, **fields: Any) -> None:
    """A launcher-stage decision taken after resolution, before publish (e.g. parsers)."""
    stash = stash_of(server_args)
    if stash is None:
        raise ValueError("declare_late_resolution needs a resolved ServerArgs (resolve_once)")
    if stash.published:
        raise ValueError(
            f"declare_late_resolution({source!r}) refused: this ServerArgs is published; use "
            "get_context().override(source, **fields) to change the published config"
        )
    check_field_names(fields)
    stash.declare(source, fields)
    validate(ResolvedView(server_args), dataclasses.fields(server_args))


def resolution_sources(server_args: ServerArgs, name: str) -> list[str]:
    """The sources that declared `name`, oldest first; empty if it is the raw value."""
    stash = stash_of(server_args)
    return stash.sources_of(name) if stash is not None else []


# ---- CLI: one flag per field, one argument group per namespace ----


def _cli_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if typing.get_origin(base) is list:
        return typing.get_args(base)[0]
    return base


def _add_field(group: Any, f: dataclasses.Field, hint: Any) -> None:
    meta = f.metadata
    help_text = meta["help"]
    note = support_note(f)
    if note:
        help_text = f"{help_text} {note}"
    help_text = help_text.replace("%", "%%")  # argparse %-formats help ("10-17% at 64")
    if _cli_type(hint) is bool:
        group.add_argument(flag_of(f.name), action="store_true", help=help_text)
        return
    kwargs: dict[str, Any] = {"type": meta.get("cli_type") or _cli_type(hint), "help": help_text}
    for key in ("choices", "nargs", "metavar"):
        if meta.get(key):
            kwargs[key] = list(meta[key]) if key == "choices" else meta[key]
    if f.default is not None and "default:" not in help_text.lower():
        kwargs["help"] = f"{help_text} (default: {f.default})"
    group.add_argument(flag_of(f.name), default=f.default, **kwargs)


def build_parser(prog: str = "python -m sglang.launch_server") -> argparse.ArgumentParser:
    """The launcher's argument parser, flags grouped by namespace."""
    parser = argparse.ArgumentParser(
        prog=prog, description="An SGLang-compatible LLM inference server."
    )
    hints = typing.get_type_hints(ServerArgs)
    fields = {f.name: f for f in dataclasses.fields(ServerArgs)}
    for cls in NAMESPACE_GROUPS:
        doc = cls.__doc__
        if doc and doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
            doc = None
        group = parser.add_argument_group(group_title(cls.__dict__[NS_ATTR]), doc)
        for name in cls.__dict__.get("__annotations__", {}):
            _add_field(group, fields[name], hints[name])
    return parser


def prepare_server_args(argv: list[str], prog: str | None = None) -> ServerArgs:
    """Parse launcher flags into an unresolved ServerArgs; bad flags exit 2 (argparse),
    under `prog` (a bench script's name) where given."""
    parser = build_parser(prog=prog) if prog is not None else build_parser()
    return server_args_from_namespace(parser, parser.parse_args(argv))


def server_args_from_namespace(
    parser: argparse.ArgumentParser, namespace: argparse.Namespace
) -> ServerArgs:
    """The ServerArgs of `parser`'s parse (a launcher's own flags on it are not read);
    bad values exit 2 through the parser."""
    try:
        server_args = ServerArgs(**{name: getattr(namespace, name) for name in FIELD_NAMES})
        validate(server_args, dataclasses.fields(server_args))
    except ValueError as exc:
        parser.error(str(exc))
    return server_args


def to_cli_args(server_args: ServerArgs) -> list[str]:
    """The flags that reproduce this record's raw values (those not at their default)."""
    argv: list[str] = []
    for f in dataclasses.fields(server_args):
        value = getattr(server_args, f.name)
        if value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(flag_of(f.name))
        elif isinstance(value, list):
            argv += [flag_of(f.name), *map(str, value)]
        else:
            argv += [flag_of(f.name), str(value)]
    return argv


def flag_support_notes() -> dict[str, str]:
    """Flag -> the note `--help` and docs/config.md give a refused or no-op field."""
    notes = {flag_of(f.name): support_note(f) for f in dataclasses.fields(ServerArgs)}
    return {flag: note for flag, note in notes.items() if note}


def server_args_namespaces() -> dict[str, str]:
    """Field -> dotted namespace path for ServerArgs (cached on first use)."""
    return _NAMESPACES


def server_args_derived() -> dict[str, tuple[str, Any]]:
    return _DERIVED


_NAMESPACES = namespace_of(ServerArgs)
_DERIVED = derived_of(ServerArgs)
