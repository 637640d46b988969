"""Resolution declarations: the stash a ServerArgs carries once resolved.

Resolution never writes a field. Each resolver *declares* `(source, {field: value})`;
the record keeps the operator's raw values and the stash answers the last
declaration per field. The stash is plain data so it pickles with the record
(child processes receive the ServerArgs through multiprocessing spawn).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Declaration:
    source: str
    fields: dict[str, Any]


@dataclass
class ResolutionStash:
    """Declarations in order; `values` is the last declared value per field."""

    declarations: list[Declaration] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    # Set by publish: a published record refuses late resolution.
    published: bool = False

    def declare(self, source: str, fields: dict[str, Any]) -> None:
        self.declarations.append(Declaration(source, dict(fields)))
        self.values.update(fields)

    def has(self, name: str) -> bool:
        return name in self.values

    def sources_of(self, name: str) -> list[str]:
        """Every source that declared `name`, oldest first (provenance)."""
        return [d.source for d in self.declarations if name in d.fields]


STASH_ATTR = "_resolution"


def stash_of(server_args: Any) -> ResolutionStash | None:
    """The record's stash, or None before resolution."""
    return server_args.__dict__.get(STASH_ATTR)


def resolution_result(server_args: Any, name: str) -> Any:
    """The last declaration for `name`, else the operator's raw value."""
    stash = stash_of(server_args)
    if stash is not None and name in stash.values:
        return stash.values[name]
    return getattr(server_args, name)


class ResolvedView:
    """Read-only attribute view of a record's resolution result (for resolvers, Derived)."""

    __slots__ = ("_server_args",)

    def __init__(self, server_args: Any) -> None:
        object.__setattr__(self, "_server_args", server_args)

    def __getattr__(self, name: str) -> Any:
        return resolution_result(self._server_args, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"resolved config is read-only (tried to set {name!r})")
