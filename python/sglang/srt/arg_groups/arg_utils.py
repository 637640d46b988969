"""Field helpers for the namespace classes, and the field -> namespace map.

A namespace class is a dataclass whose *declaring class* states the namespace
of every field it annotates, through the unannotated class attribute
`_NS_PATH` (unannotated, so never a dataclass field). `Derived(fn=...)` class
attributes are likewise unannotated: they never become fields of the record;
publish computes them into ordinary bag leaves.
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
) -> Any:
    """A ServerArgs field: default plus the metadata the CLI is generated from."""
    metadata = {
        "help": help,
        "choices": tuple(choices) if choices is not None else None,
        "cli_type": cli_type,
        "nargs": nargs,
        "metavar": metavar,
    }
    return dataclasses.field(default=default, metadata=metadata)


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
