"""The Ray connection an engine started is shared by the engines of the process: the
last to shut down ends it (a fake ray module: no cluster)."""

from __future__ import annotations

from sglang.srt.entrypoints.ray_engine import _RayUsers


class FakeRay:
    def __init__(self, initialized: bool = False) -> None:
        self.initialized, self.inits, self.shutdowns = initialized, 0, 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self) -> None:
        self.initialized, self.inits = True, self.inits + 1

    def shutdown(self) -> None:
        self.initialized, self.shutdowns = False, self.shutdowns + 1


def test_the_last_engine_to_leave_ends_the_connection_the_first_started():
    ray, users = FakeRay(), _RayUsers()
    users.join(ray)  # starts it
    users.join(ray)  # joins it
    users.leave(ray)  # the first engine's shutdown: the second's actors live on
    assert ray.initialized and ray.shutdowns == 0
    users.leave(ray)
    assert not ray.initialized and (ray.inits, ray.shutdowns) == (1, 1)


def test_a_connection_the_caller_started_is_never_ended_here():
    ray, users = FakeRay(initialized=True), _RayUsers()
    users.join(ray)
    users.leave(ray)
    assert ray.initialized and ray.shutdowns == 0
