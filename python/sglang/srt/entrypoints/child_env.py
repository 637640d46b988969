"""What a scheduler process's environment adds to its parent's: settings its libraries
read once, at load time, before any of our code runs in the child.

OpenMP's idle workers. torch's OpenMP (libgomp) reads its wait policy when torch is
imported, which a spawned child does while it unpickles its target, so the policy is
put in the environment here, in the parent, around the spawn. By default a libgomp
worker that finishes its share of a parallel region spins for 300,000 pause
instructions before it sleeps: 10-20 ms on a core whose pause is ~140 cycles (Intel
since Skylake-SP). After each prefill chunk the spinning worker holds a core while the
decode steps run on the kernels' own pool and the HTTP process streams tokens, and on a
small machine they queue behind it. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) fixed
that when served (2 cores, demo model, concurrency 8: p99 TTFT 125-185 -> 37-59 ms), but
then every torch parallel region of a large batch wakes its workers through the kernel:
offline at batch 256 on another 2-core AMX Xeon it ran 7,840 / 7,873 out tok/s against
11,297 / 10,968 with a spin of 30,000 pauses (~1.4 ms there), which served the same
(concurrency 8 and 32 within run-to-run noise of PASSIVE; benchmark/RESULTS.md). So a
CPU scheduler starts with GOMP_SPINCOUNT=30000: long enough for the regions of one step,
short against the gaps between steps. An operator's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from sglang.srt.environ import envs

OPENMP_IDLE_SPIN = {"GOMP_SPINCOUNT": "30000"}  # pauses a worker spins before it sleeps


def scheduler_env(device: str) -> dict[str, str]:
    """Variables to add to a scheduler's environment on `device` (none the operator set)."""
    if device != "cpu":
        return {}
    if envs.OMP_WAIT_POLICY.is_set() or envs.GOMP_SPINCOUNT.is_set():
        return {}
    return dict(OPENMP_IDLE_SPIN)


@contextlib.contextmanager
def environment(extra: dict[str, str]) -> Iterator[None]:
    """os.environ with `extra` added for the scope (children started in it inherit them);
    the old values come back after. Callers hold the spawn lock."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
