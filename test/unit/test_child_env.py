"""The environment a scheduler process adds to its parent's (entrypoints/child_env.py)."""

from __future__ import annotations

import os

import pytest

from sglang.srt.entrypoints import child_env


@pytest.fixture
def no_openmp_env(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    return monkeypatch


def test_cpu_scheduler_gets_a_short_openmp_spin(no_openmp_env):
    assert child_env.scheduler_env("cpu") == {"GOMP_SPINCOUNT": "30000"}


def test_gpu_scheduler_env_unchanged(no_openmp_env):
    assert child_env.scheduler_env("cuda") == {}


@pytest.mark.parametrize("name,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000")])
def test_operator_openmp_setting_is_kept(no_openmp_env, name, value):
    no_openmp_env.setenv(name, value)
    assert child_env.scheduler_env("cpu") == {}


def test_environment_is_restored(no_openmp_env):
    no_openmp_env.setenv("GOMP_SPINCOUNT", "5")
    with child_env.environment({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "7"}):
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
        assert os.environ["GOMP_SPINCOUNT"] == "7"
    assert "OMP_WAIT_POLICY" not in os.environ
    assert os.environ["GOMP_SPINCOUNT"] == "5"


def test_environment_is_restored_after_an_error(no_openmp_env):
    with pytest.raises(RuntimeError), child_env.environment({"OMP_WAIT_POLICY": "PASSIVE"}):
        raise RuntimeError("spawn failed")
    assert "OMP_WAIT_POLICY" not in os.environ
