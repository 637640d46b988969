"""Roles: SGLANG_ROLE_NAMESPACES=off|record|enforce over ROLE_NAMESPACE_SETS."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang.srt.runtime_context import (
    ROLE_NAMESPACE_SETS,
    get_context,
    get_device,
    get_exec,
    get_model,
    get_observability,
    get_parallel,
    publish,
    reset_context,
)
from sglang.srt.server_args import ServerArgs


@pytest.fixture(autouse=True)
def clean_context(monkeypatch):
    reset_context()
    yield
    monkeypatch.delenv("SGLANG_ROLE_NAMESPACES", raising=False)
    publish_as("test")  # re-reads the mode: back to off
    reset_context()


def publish_as(role: str) -> None:
    publish(ServerArgs(model_path="org/model", device="cpu"), role=role)


def test_roles_listed():
    assert {"tokenizer", "scheduler", "detokenizer", "dp_controller", "test"} <= set(
        ROLE_NAMESPACE_SETS
    )
    assert ROLE_NAMESPACE_SETS["scheduler"] is None


def test_enforce_raises_outside_the_role_set(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforce")
    publish_as("dp_controller")
    assert get_parallel().dp_size == 1
    assert get_parallel().load_balance_method == "round_robin"
    assert get_observability().log_level is not None
    for outside in (get_model, get_exec, get_device):
        with pytest.raises(PermissionError, match="ROLE_NAMESPACE_SETS"):
            outside()


def test_dp_controller_set_is_the_recorded_audit():
    """The narrowed set is exactly what a record-mode DP run saw the controller read."""
    audit = Path(__file__).parents[2] / "docs" / "audits" / "role_namespaces_dp2.txt"
    pairs = [line.split() for line in audit.read_text().splitlines() if line[:1] not in "#"]
    recorded = {ns for role, ns in pairs if role == "dp_controller" and ns != "-"}
    assert ROLE_NAMESPACE_SETS["dp_controller"] == recorded


def test_enforce_lets_full_roles_read_everything(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforce")
    publish_as("scheduler")
    assert get_model().model_path == "org/model"


def test_enforce_fails_an_unlisted_role_at_publish(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforce")
    with pytest.raises(ValueError, match="ROLE_NAMESPACE_SETS"):
        publish_as("mystery")


def test_record_appends_role_namespace_lines(monkeypatch, tmp_path):
    out = tmp_path / "pairs.txt"
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "record")
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES_OUT", str(out))
    publish_as("detokenizer")
    get_model()
    get_model()
    get_exec()
    assert out.read_text().splitlines() == [
        "detokenizer -",
        "detokenizer model",
        "detokenizer exec",
    ]


def test_record_does_not_enforce(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "record")
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES_OUT", str(tmp_path / "o.txt"))
    publish_as("dp_controller")
    assert get_model().model_path == "org/model"
    assert ("dp_controller", "model") in get_context().audit.pairs


def test_off_does_no_bookkeeping(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "off")
    publish_as("dp_controller")
    get_model()
    assert get_context().audit.pairs == set()


def test_typo_in_mode_raises_loudly(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforced")
    with pytest.raises(ValueError, match="SGLANG_ROLE_NAMESPACES"):
        publish_as("scheduler")


def test_enforce_covers_config_leaf_and_override(monkeypatch):
    """No bypass: reading a leaf by name or overriding one is a read of its namespace."""
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforce")
    publish_as("dp_controller")
    assert get_context().config_leaf("tp_size") == 1  # parallel: in its set
    with pytest.raises(PermissionError, match="'model'"):
        get_context().config_leaf("model_path")
    with pytest.raises(PermissionError, match="'schedule'"):
        get_context().override("test", max_queued_requests=3)


def test_record_survives_an_unwritable_record_file(monkeypatch, tmp_path, caplog):
    """A record file that cannot be written warns once; bag reads keep working."""
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "record")
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES_OUT", str(tmp_path))  # a directory
    with caplog.at_level("WARNING"):
        publish_as("detokenizer")
        assert get_model().model_path == "org/model"
        get_exec()
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1
    assert {("detokenizer", "model"), ("detokenizer", "exec")} <= get_context().audit.pairs
