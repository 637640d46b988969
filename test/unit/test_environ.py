"""The SGLANG_* registry: typed, read on demand, loud on bad values."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sglang.srt.environ import EnvVar, all_env_vars, envs

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang"


def test_defaults_when_unset(monkeypatch):
    monkeypatch.delenv("SGLANG_ROLE_NAMESPACES", raising=False)
    monkeypatch.delenv("SGLANG_NUM_THREADS", raising=False)
    assert envs.SGLANG_ROLE_NAMESPACES.get() == "off"
    assert envs.SGLANG_NUM_THREADS.get() is None
    assert not envs.SGLANG_NUM_THREADS.is_set()


def test_read_when_asked_not_at_import(monkeypatch):
    monkeypatch.setenv("SGLANG_NUM_THREADS", "3")
    assert envs.SGLANG_NUM_THREADS.get() == 3
    monkeypatch.setenv("SGLANG_NUM_THREADS", "5")
    assert envs.SGLANG_NUM_THREADS.get() == 5


def test_typed_values(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_IS_IN_CI", "true")
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2.5")
    monkeypatch.setenv("SGLANG_IPC_DIR", str(tmp_path))
    assert envs.SGLANG_IS_IN_CI.get() is True
    assert envs.SGLANG_HEALTH_CHECK_TIMEOUT.get() == 2.5
    assert envs.SGLANG_IPC_DIR.get() == tmp_path


@pytest.mark.parametrize(
    "name, raw",
    [
        ("SGLANG_ROLE_NAMESPACES", "enforced"),
        ("SGLANG_LOG_LEVEL", "loud"),
        ("SGLANG_NUM_THREADS", "four"),
        ("SGLANG_IS_IN_CI", "maybe"),
    ],
)
def test_bad_value_names_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name):
        getattr(envs, name).get()


def test_override_is_scoped(monkeypatch):
    monkeypatch.delenv("SGLANG_NUM_THREADS", raising=False)
    with envs.SGLANG_NUM_THREADS.override(2):
        assert envs.SGLANG_NUM_THREADS.get() == 2
    assert not envs.SGLANG_NUM_THREADS.is_set()


def test_unknown_variable_is_an_attribute_error():
    with pytest.raises(AttributeError):
        _ = envs.SGLANG_NO_SUCH_THING


def test_registry_names_match_attributes():
    for var in all_env_vars():
        assert isinstance(var, EnvVar) and var.name.startswith("SGLANG_") and var.help
        assert getattr(envs, var.name) is var


def _env_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("SGLANG_")
        and node.value.isupper()
    }


def test_every_sglang_variable_in_the_package_is_registered():
    registered = {var.name for var in all_env_vars()}
    unregistered = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in _env_literals(path)
        if name not in registered
    }
    assert sorted(unregistered) == []
