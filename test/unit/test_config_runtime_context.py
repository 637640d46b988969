"""publish, bags, get_context().override, readback, the test kit, snapshots."""

from __future__ import annotations

import logging

import pytest

from sglang.srt.runtime_context import (
    ConfigNotPublishedError,
    assert_published,
    config_bag,
    get_context,
    get_device,
    get_exec,
    get_memory,
    get_model,
    get_observability,
    get_schedule,
    get_server_args,
    get_serving,
    is_config_namespace_published,
    publish,
    restore_context,
    snapshot_context,
)
from sglang.srt.server_args import ServerArgs, resolution_result

pytestmark = pytest.mark.usefixtures("clean_context")


def published(**fields) -> ServerArgs:
    sa = ServerArgs(**{"model_path": "org/model", "device": "cpu", **fields})
    publish(sa, role="test")
    return sa


def test_reading_before_publish_names_the_bag():
    with pytest.raises(ConfigNotPublishedError, match="'exec' not published"):
        get_exec()
    with pytest.raises(ValueError, match="Global server args is not set yet!"):
        get_server_args()
    assert not is_config_namespace_published("memory")


def test_publish_projects_the_resolution_result():
    sa = published(tp_size=1, page_size=4)
    assert get_exec().kernel.attention_backend == "torch_native"
    assert get_exec().random_seed == resolution_result(sa, "random_seed")
    assert get_memory().page_size == 4
    assert get_schedule().chunked_prefill_size == 2048
    assert get_device().device == "cpu"
    assert get_model().tokenizer_path == "org/model"
    assert get_serving().port == 30000
    assert get_observability().log_level == "info"
    assert "page_size" in get_memory() and "nope" not in get_memory()
    assert get_server_args() is sa


def test_publish_resolves_an_unresolved_record():
    sa = ServerArgs(model_path="org/model", device="cpu")
    publish(sa, role="test")
    assert sa.is_resolved


def test_bag_is_read_only_and_names_the_path():
    published()
    with pytest.raises(AttributeError, match="override"):
        get_memory().page_size = 2
    with pytest.raises(AttributeError, match="exec.kernel"):
        _ = get_exec().kernel.no_such_leaf


def test_bag_override_is_scoped_and_transactional():
    published()
    kernel = get_exec().kernel
    with kernel.override(attention_backend="triton"):
        assert get_exec().kernel.attention_backend == "triton"
    assert kernel.attention_backend == "torch_native"
    with pytest.raises(ValueError, match="typo"):
        kernel.override(attention_backend="triton", typo=1)
    assert kernel.attention_backend == "torch_native"
    with pytest.raises(RuntimeError), kernel.override(sampling_backend="flashinfer"):
        raise RuntimeError("restored even on exceptions")
    assert kernel.sampling_backend == "pytorch"


def test_override_lands_on_bag_only_and_is_logged():
    sa = published()
    get_context().override("hicache_attach", page_size=16, max_total_tokens=1000)
    assert get_memory().page_size == 16
    assert sa.page_size == 1 and resolution_result(sa, "page_size") == 1
    assert get_context().overrides_log() == [
        ("hicache_attach", {"page_size": 16, "max_total_tokens": 1000})
    ]
    assert get_context().config_leaf("max_total_tokens") == 1000


def test_override_is_all_or_nothing():
    published()
    with pytest.raises(ValueError, match="not_a_field"):
        get_context().override("bad", page_size=16, not_a_field=1)
    assert get_memory().page_size == 1
    assert get_context().overrides_log() == []


def test_override_before_publish_says_not_published():
    with pytest.raises(ConfigNotPublishedError):
        get_context().override("early", page_size=2)


def test_overrides_log_returns_copies():
    published()
    get_context().override("a", page_size=2)
    get_context().overrides_log()[0][1]["page_size"] = 99
    assert get_context().overrides_log() == [("a", {"page_size": 2})]


def test_resolved_server_args_dict_overlays_the_log():
    published()
    get_context().override("hicache_attach", max_total_tokens=4096)
    readback = get_context().resolved_server_args_dict()
    assert readback["max_total_tokens"] == 4096
    assert readback["chunked_prefill_size"] == 2048
    assert readback["model_path"] == "org/model"


def test_republish_is_last_wins_and_warns_about_dropped_overrides(caplog):
    published(page_size=2)
    get_context().override("x", page_size=8)
    with caplog.at_level(logging.WARNING, logger="sglang.srt.runtime_context"):
        published(page_size=4)
    assert get_memory().page_size == 4
    assert get_context().overrides_log() == []
    assert "discards" in caplog.text


def test_assert_published_explains_each_case():
    sa = ServerArgs(model_path="org/model", device="cpu")
    with pytest.raises(ConfigNotPublishedError, match="nothing is published"):
        assert_published(sa, role="scheduler")
    publish(sa, role="scheduler")
    assert_published(sa, role="scheduler")
    with pytest.raises(ValueError, match="role"):
        assert_published(sa, role="tokenizer")
    with pytest.raises(ValueError, match="another ServerArgs"):
        assert_published(ServerArgs(model_path="org/model", device="cpu"), role="scheduler")


def test_test_kit_publishes_and_restores_everything():
    outer = published(page_size=2)
    get_context().override("outer", stream_interval=3)
    kit = get_context().override_server_args(page_size=64, disable_radix_cache=True)
    inner = kit.install()
    assert get_server_args() is inner and get_context().role == "test"
    assert get_memory().page_size == 64 and get_memory().disable_radix_cache
    get_context().override("inner", page_size=128)
    kit.restore()
    assert get_server_args() is outer
    assert get_memory().page_size == 2
    assert get_schedule().stream_interval == 3
    assert get_context().overrides_log() == [("outer", {"stream_interval": 3})]


def test_test_kit_as_context_manager_and_unknown_field():
    with get_context().override_server_args(tp_size=1) as sa:
        assert get_server_args() is sa
    assert not is_config_namespace_published("parallel")
    with pytest.raises(ValueError, match="bogus"):
        get_context().override_server_args(bogus=1)


def test_snapshot_restore_round_trip():
    published(page_size=2)
    snap = snapshot_context()
    get_context().override("x", page_size=32)
    with get_memory().override(disable_radix_cache=True):
        restore_context(snap)
    assert get_memory().page_size == 2


def test_config_bag_by_name():
    published()
    assert config_bag("exec").graph.disable_cuda_graph is False
    assert get_exec().features.grammar_backend == "xgrammar"
    assert get_exec().as_dict()["kernel"]["sampling_backend"] == "pytorch"


def test_publish_seeds_capture_flag():
    from sglang.srt.runtime_context import get_flags

    # enable_torch_compile is refused until it lands: publish seeds the flag from the bag.
    get_flags().capture.enable_torch_compile = True
    published()
    assert get_flags().capture.enable_torch_compile is False
