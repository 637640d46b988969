"""Runtime tiers (not config): Flags, Resources, ForwardFlags."""

from __future__ import annotations

import threading

import pytest

from sglang.srt.runtime_context import (
    declare_forward_flag,
    get_flags,
    get_forward,
    get_resources,
    reset_context,
    restore_context,
    snapshot_context,
)

pytestmark = pytest.mark.usefixtures("clean_context")


def test_flags_are_typo_safe():
    get_flags().capture.is_capturing = True
    assert get_flags().capture.is_capturing
    with pytest.raises(AttributeError, match="is_captureing"):
        get_flags().capture.is_captureing = True
    with pytest.raises(AttributeError):
        get_flags().capture = None


def test_flag_override_is_scoped_and_transactional():
    spec = get_flags().spec
    with spec.override(active_attention_backend="torch_native", is_draft_forward=True):
        assert spec.active_attention_backend == "torch_native"
    assert spec.active_attention_backend is None and spec.is_draft_forward is False
    with pytest.raises(AttributeError):
        with spec.override(is_draft_forward=True, typo=1):
            pass
    assert spec.is_draft_forward is False


def test_snapshot_restores_flags_by_value():
    snap = snapshot_context()
    get_flags().dp.is_idle_batch = True
    restore_context(snap)
    assert get_flags().dp.is_idle_batch is False


def test_resources_get_or_create_and_reset():
    calls = []
    buf = get_resources().get_buffer("scratch", lambda: calls.append(1) or [0] * 4)
    assert get_resources().get_buffer("scratch", list) is buf and calls == [1]
    get_resources().set("pool", "handle")
    assert get_resources().get("pool") == "handle"
    reset_context()
    assert get_resources().get("pool") is None


def test_forward_flags_scoped_and_read_only():
    fwd = get_forward()
    assert fwd.is_draft_forward is False
    with fwd.scoped(is_draft_forward=True, forward_mode="decode"):
        assert fwd.is_draft_forward is True and fwd.forward_mode == "decode"
    assert fwd.is_draft_forward is False and fwd.forward_mode is None
    with pytest.raises(AttributeError, match="scoped"):
        fwd.is_draft_forward = True
    with pytest.raises(AttributeError, match="nope"):
        with fwd.scoped(nope=1):
            pass


def test_context_var_flags_are_isolated_per_thread():
    seen = []
    with get_forward().scoped(is_warmup=True):
        thread = threading.Thread(target=lambda: seen.append(get_forward().is_warmup))
        thread.start()
        thread.join()
    assert seen == [False]


def test_declare_forward_flag():
    declare_forward_flag("unit_test_flag", 0)
    with get_forward().scoped(unit_test_flag=3):
        assert get_forward().unit_test_flag == 3
    assert get_forward().unit_test_flag == 0
    with pytest.raises(ValueError):
        declare_forward_flag("unit_test_flag", 1, compiled=True)


def test_bag_and_parallel_reads_trace_without_graph_breaks():
    torch = pytest.importorskip("torch")
    from sglang.srt.runtime_context import get_context, get_exec, get_parallel

    def forward(x):
        if (
            get_exec().kernel.attention_backend == "torch_native"
            and not get_forward().in_graph_capture
        ):
            x = x + 1
        return x * get_parallel().attn_tp_size

    with get_context().override_server_args(tp_size=2):
        compiled = torch.compile(forward, fullgraph=True, backend="eager")
        assert compiled(torch.ones(2)).tolist() == [4.0, 4.0]
