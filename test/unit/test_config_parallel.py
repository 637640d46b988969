"""get_parallel(): override -> stamp -> published leaf; ranks live from parallel_state."""

from __future__ import annotations

import socket

import pytest

from sglang.srt.runtime_context import (
    ConfigNotPublishedError,
    get_context,
    get_parallel,
    publish,
    reset_context,
)
from sglang.srt.server_args import ServerArgs

pytestmark = pytest.mark.usefixtures("clean_context")


def publish_topology(**fields) -> None:
    publish(ServerArgs(model_path="org/model", device="cpu", **fields), role="test")


def test_quotients_are_computed_at_publish():
    publish_topology(tp_size=4)
    p = get_parallel()
    assert (p.attn_tp_size, p.attn_dp_size) == (4, 1)
    assert (p.moe_tp_size, p.moe_ep_size) == (4, 1)
    assert (p.dcp_enabled, p.attn_dcp_size) == (False, 1)
    assert p.tp_size == 4 and p.dp_size == 1


def _quotients(**topology) -> dict:
    # dp-attention and decode CP are refused until they land (no ServerArgs can
    # carry them), so the quotients are checked on the Derived fns.
    from types import SimpleNamespace

    from sglang.srt.server_args import server_args_derived

    base = {
        "tp_size": 1,
        "dp_size": 1,
        "ep_size": 1,
        "enable_dp_attention": False,
        "decode_context_parallel_size": 1,
    }
    view = SimpleNamespace(**{**base, **topology})
    return {name: d.fn(view) for name, (_, d) in server_args_derived().items()}


def test_quotients_of_refused_topologies():
    q = _quotients(tp_size=4, dp_size=2, enable_dp_attention=True, ep_size=2)
    assert (q["attn_tp_size"], q["attn_dp_size"]) == (2, 2)
    assert (q["moe_tp_size"], q["moe_ep_size"]) == (2, 2)
    q = _quotients(tp_size=2, decode_context_parallel_size=2)
    assert (q["dcp_enabled"], q["attn_dcp_size"]) == (True, 2)


def test_overriding_tp_size_does_not_move_attn_tp_size():
    publish_topology(tp_size=2)
    get_context().override("scale", tp_size=4)
    assert get_parallel().tp_size == 4
    assert get_parallel().attn_tp_size == 2
    with get_parallel().override(attn_tp_size=4):
        assert get_parallel().attn_tp_size == 4
    assert get_parallel().attn_tp_size == 2


def test_reading_a_quotient_with_nothing_published_names_the_field():
    with pytest.raises(ConfigNotPublishedError, match="attn_tp_size"):
        _ = get_parallel().attn_tp_size


def test_reading_a_leaf_before_publish_says_not_published():
    with pytest.raises(ConfigNotPublishedError, match="'parallel' not published"):
        _ = get_parallel().tp_size


def test_stamp_beats_leaf_and_override_beats_stamp():
    publish_topology(tp_size=2)
    get_parallel().stamp(attn_dp_size=2)
    assert get_parallel().attn_dp_size == 2
    with get_parallel().override(attn_dp_size=4):
        with get_parallel().override(tp_size=8):
            assert get_parallel().attn_dp_size == 4 and get_parallel().tp_size == 8
    assert get_parallel().attn_dp_size == 2
    reset_context()
    publish_topology(tp_size=2)
    assert get_parallel().attn_dp_size == 1  # reset_context cleared the stamp


def test_stamp_without_publish_answers():
    get_parallel().stamp(attn_tp_size=3)
    assert get_parallel().attn_tp_size == 3


def test_override_and_stamp_reject_unknown_names():
    with pytest.raises(ValueError, match="attn_tpsize"):
        with get_parallel().override(attn_tpsize=2):
            pass
    with pytest.raises(ValueError, match="tp_size"):
        get_parallel().stamp(tp_size=2)
    with pytest.raises(AttributeError):
        _ = get_parallel().no_such_name


def test_ranks_raise_before_distributed_init():
    with pytest.raises(RuntimeError, match="initialize_model_parallel"):
        _ = get_parallel().tp_rank
    with get_parallel().override(tp_rank=1):
        assert get_parallel().tp_rank == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parallel_state_single_rank_gloo_stamps_widths():
    from sglang.srt.distributed import parallel_state as ps

    publish_topology(tp_size=1)
    ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{_free_port()}", backend="gloo")
    try:
        ps.initialize_model_parallel(1)
        assert ps.model_parallel_is_initialized()
        assert get_parallel().tp_rank == 0 and get_parallel().world_size == 1
        assert ps.get_tensor_model_parallel_world_size() == 1
        assert ps.get_tp_group().broadcast_object({"a": 1}) == {"a": 1}
        assert get_parallel().attn_tp_size == 1
    finally:
        ps.destroy_distributed_environment()
    assert not ps.model_parallel_is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        ps.get_tp_group()
