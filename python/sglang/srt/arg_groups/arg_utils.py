"""Field helpers for the namespace classes, and the field -> namespace map.

A namespace class is a dataclass whose *declaring class* states the namespace
of every field it annotates, through the unannotated class attribute
`_NS_PATH` (unannotated, so never a dataclass field). `Derived(fn=...)` class
attributes are likewise unannotated: they never become fields of the record;
publish computes them into ordinary bag leaves.

A field that is not implemented says so where it is declared, and the config
layer enforces it (`validation.check_refusals`, `validation.warn_noops`):

- `unsupported="<issue>"`: a value other than the default is refused when the
  record is built or parsed (ValueError naming the field; the CLI exits 2 naming
  the flag). `unsupported_values=(...)` narrows the refusal to those values.
- `noop_on={"<device>": "<why>"}`: on that device the field changes nothing; a
  non-default value is accepted and logged as a warning at resolution. With
  `unsupported` as well, the refusal holds on every other device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

NS_ATTR = "_NS_PATH"


def arg(
    default: Any,
    help: str,
    *,
    choices: Iterable[Any] | None = None,
    cli_type: Callable[[str], Any] | None = None,
    nargs: str | None = None,
    metavar: str | None = None,
    unsupported: str | None = None,
    unsupported_values: Iterable[Any] | None = None,
    noop_on: dict[str, str] | None = None,
) -> Any:
    """A ServerArgs field: default plus the metadata the CLI is generated from.

    `unsupported` names the issue a non-default value waits for (refused);
    `unsupported_values` limits the refusal to those values; `noop_on` maps a
    device to why the field has no effect there (accepted with a warning).
    """
    if unsupported_values is not None and unsupported is None:
        raise TypeError("unsupported_values needs unsupported='<issue>'")
    metadata = {
        "help": help,
        "choices": tuple(choices) if choices is not None else None,
        "cli_type": cli_type,
        "nargs": nargs,
        "metavar": metavar,
        "unsupported": unsupported,
        "unsupported_values": (
            tuple(unsupported_values) if unsupported_values is not None else None
        ),
        "noop_on": dict(noop_on) if noop_on else None,
    }
    return dataclasses.field(default=default, metadata=metadata)


def flag_of(name: str) -> str:
    """The CLI flag of a field: `tp_size` -> `--tp-size`."""
    return "--" + name.replace("_", "-")


def is_refused_value(f: dataclasses.Field, value: Any) -> bool:
    """Whether `value` of field `f` is one its `unsupported` declaration refuses."""
    if f.metadata.get("unsupported") is None or value == f.default:
        return False
    values = f.metadata.get("unsupported_values")
    return values is None or value in values


def support_note(f: dataclasses.Field) -> str:
    """The sentence `--help` and docs/config.md append for a refused or no-op field."""
    meta = f.metadata
    parts = []
    noop = meta.get("noop_on") or {}
    by_reason: dict[str, list[str]] = {}
    for device, why in noop.items():  # devices sharing a reason named together
        by_reason.setdefault(why, []).append(device)
    for why, devices in by_reason.items():
        parts.append(f"No effect on {' or '.join(devices)} ({why}); accepted with a warning.")
    issue = meta.get("unsupported")
    if issue is not None:
        where = " on other devices" if noop else ""
        values = meta.get("unsupported_values")
        if values is None:
            what = "only the default is accepted" + (" there" if noop else "")
        else:
            what = ", ".join(map(str, values)) + (" is" if len(values) == 1 else " are")
            what += " refused"
        parts.append(f"Not supported yet{where} (issue: {issue}): {what}.")
    return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class Derived:
    """A value computed once at publish from the whole resolved config.

    `fn` receives a read-only view of every resolved field (attribute access),
    so a derivation may span namespaces. It must be pure.
    """

    fn: Callable[[Any], Any]
    help: str = ""


def _own_annotations(cls: type) -> Iterable[str]:
    return cls.__dict__.get("__annotations__", {}).keys()


def namespace_classes(cls: type) -> list[type]:
    """The classes in `cls`'s MRO that declare a namespace themselves."""
    return [klass for klass in cls.__mro__ if NS_ATTR in klass.__dict__]


def namespace_of(cls: type) -> dict[str, str]:
    """Map each dataclass field of `cls` to the dotted namespace of its declaring class.

    Raises if a field is declared by a class without `_NS_PATH` or by two classes.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    mapping: dict[str, str] = {}
    for klass in namespace_classes(cls):
        for name in _own_annotations(klass):
            if name not in fields:
                continue
            if name in mapping:
                raise TypeError(f"field {name!r} is declared in two namespaces")
            mapping[name] = klass.__dict__[NS_ATTR]
    missing = sorted(fields - mapping.keys())
    if missing:
        raise TypeError(f"fields without a namespace (declare them in an arg group): {missing}")
    return mapping


def derived_of(cls: type) -> dict[str, tuple[str, Derived]]:
    """Map each `Derived` attribute of `cls` to (namespace path, Derived)."""
    out: dict[str, tuple[str, Derived]] = {}
    for klass in namespace_classes(cls):
        for name, value in klass.__dict__.items():
            if isinstance(value, Derived):
                if name in out:
                    raise TypeError(f"derived value {name!r} is declared twice")
                out[name] = (klass.__dict__[NS_ATTR], value)
    return out


def field_metadata(cls: type) -> dict[str, dataclasses.Field]:
    """Field name -> dataclasses.Field, in declaration order."""
    return {f.name: f for f in dataclasses.fields(cls)}


def group_title(path: str) -> str:
    """The CLI argument-group title for a namespace path."""
    return f"{path} options"
