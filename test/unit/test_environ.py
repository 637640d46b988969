"""The SGLANG_* registry: typed, read on demand, loud on bad values."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sglang.srt.environ import THIRD_PARTY_VARIABLES, EnvVar, all_env_vars, envs

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
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2.5")
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES_OUT", str(tmp_path))
    assert envs.SGLANG_HEALTH_CHECK_TIMEOUT.get() == 2.5
    assert envs.SGLANG_ROLE_NAMESPACES_OUT.get() == tmp_path


def test_bool_values(monkeypatch):
    flag = EnvVar("SGLANG_PLANTED_FLAG", "bool", False, "a bool for this test")
    monkeypatch.setenv(flag.name, "true")
    assert flag.get() is True
    monkeypatch.setenv(flag.name, "off")
    assert flag.get() is False
    monkeypatch.setenv(flag.name, "maybe")
    with pytest.raises(ValueError, match=flag.name):
        flag.get()


@pytest.mark.parametrize(
    "name, raw",
    [
        ("SGLANG_ROLE_NAMESPACES", "enforced"),
        ("SGLANG_LOG_LEVEL", "loud"),
        ("SGLANG_NUM_THREADS", "four"),
        ("SGLANG_CHILD_READY_TIMEOUT", "soon"),
    ],
)
def test_bad_value_names_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name):
        getattr(envs, name).get()


@pytest.mark.parametrize("raw", ["-1", "0", "nan"])
@pytest.mark.parametrize("name", ["SGLANG_HEALTH_TIMEOUT", "SGLANG_CHILD_READY_TIMEOUT",
                                  "SGLANG_NUM_THREADS", "SGLANG_GRAMMAR_TIMEOUT"])  # fmt: skip
def test_a_timeout_or_count_must_be_positive(monkeypatch, name, raw):
    # SGLANG_HEALTH_TIMEOUT=-1 made /health 503 forever on a healthy server
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=f"{name}=.* (must be a number above 0|is not a valid)"):
        getattr(envs, name).get()


def test_resolution_refuses_a_bad_variable_at_start_up(monkeypatch):
    # read per request, SGLANG_HEALTH_TIMEOUT=abc made every /health a 500: now the
    # launcher refuses it (exit 2), as it does a bad flag
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_HEALTH_TIMEOUT", "abc")
    with pytest.raises(ValueError, match="SGLANG_HEALTH_TIMEOUT='abc' is not a valid float"):
        ServerArgs(model_path="org/m", device="cpu").resolve_once()


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
        assert isinstance(var, EnvVar) and var.help
        assert var.name.startswith("SGLANG_") or var.name in THIRD_PARTY_VARIABLES
        assert getattr(envs, var.name) is var


def _env_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.value.removesuffix("=")  # "SGLANG_X=..." in a message names SGLANG_X
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


# ---- every registered variable is read by code -----------------------------------

# Registered by another change that wires its reader; exempt only while it has none.
AWAITING_READER: dict[str, str] = {}


def _is_envs(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "envs"
    return isinstance(node, ast.Attribute) and node.attr == "envs"


def env_reads(source: str) -> set[str]:
    """Names read as `envs.NAME` (or `<module>.envs.NAME`) in one module."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and _is_envs(node.value)
    }


def package_env_reads() -> set[str]:
    return {
        name
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).as_posix() != "srt/environ.py"
        for name in env_reads(path.read_text(encoding="utf-8"))
    }


def unread_variables(registered: set[str], reads: set[str]) -> list[str]:
    return sorted(registered - reads - set(AWAITING_READER))


def test_every_registered_variable_is_read_by_the_package():
    registered = {var.name for var in all_env_vars()}
    assert unread_variables(registered, package_env_reads()) == []


def test_awaiting_reader_exemptions_are_registered():
    registered = {var.name for var in all_env_vars()}
    assert set(AWAITING_READER) <= registered


def test_unread_variable_guard_catches_a_planted_variable():
    reads = env_reads(
        "from sglang.srt.environ import envs\n"
        "import sglang.srt.environ as environ\n"
        "a = envs.SGLANG_A.get()\n"
        "b = environ.envs.SGLANG_B.is_set()\n"
        "c = os.environ.get('SGLANG_C')\n"
    )
    assert reads == {"SGLANG_A", "SGLANG_B"}
    assert unread_variables({"SGLANG_A", "SGLANG_B", "SGLANG_C"}, reads) == ["SGLANG_C"]
