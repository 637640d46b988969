"""Which errors end a process, and the fault-injection hook for tests (no torch).

`FaultInjector` is the testing hook behind SGLANG_FAULT_INJECT=`<site>:<marker>`
(comma-separated for several): site `forward` raises in the scheduler's forward of
any batch holding a request whose rid contains the marker; site `detokenize`
raises in the detokenizer for such a batch; site `verify` raises in a speculative
verify forward only (the scheduler then decodes that batch plainly). Site `stall`
sleeps instead of raising: a request that outlasts a deadline.
"""

from __future__ import annotations

import time

from sglang.srt.environ import envs

STALL_S = 0.05  # site `stall`: per forward of a marked request

# Errors after which the device or our invariants cannot be trusted.
_FATAL_TYPES = (AssertionError, MemoryError)
_FATAL_MARKERS = ("CUDA error", "device-side assert", "HIP error", "NCCL", "illegal memory")


class InjectedFault(RuntimeError):
    """Raised by the SGLANG_FAULT_INJECT testing hook."""


class FaultInjector:
    """SGLANG_FAULT_INJECT=`<site>:<marker>[,<site>:<marker>...]`: fail `site` for
    rids containing `marker`."""

    def __init__(self, spec: str | None) -> None:
        self.markers: dict[str, str] = {}
        for item in filter(None, (spec or "").split(",")):
            site, sep, marker = item.strip().partition(":")
            if not sep or not marker:
                raise ValueError(f"SGLANG_FAULT_INJECT={spec!r}: expected <site>:<marker>")
            self.markers[site] = marker

    @classmethod
    def from_env(cls) -> FaultInjector:
        return cls(envs.SGLANG_FAULT_INJECT.get())

    def check(self, site: str, rids: list[str]) -> None:
        marker = self.markers.get(site)
        if marker is None:
            return
        hit = [rid for rid in rids if marker in rid]
        if hit:
            raise InjectedFault(f"injected {site} fault for request {hit[0]}")

    def stall(self, rids: list[str]) -> None:
        """Site `stall`: sleep STALL_S for a batch holding a marked request (a request
        that outlasts a deadline, for tests)."""
        marker = self.markers.get("stall")
        if marker is not None and any(marker in rid for rid in rids):
            time.sleep(STALL_S)


def is_fatal(exc: BaseException) -> bool:
    if isinstance(exc, _FATAL_TYPES):
        return True
    text = str(exc)
    return any(marker in text for marker in _FATAL_MARKERS)
