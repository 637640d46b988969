"""ServerArgs: composition, resolution, validation, derive, late resolution, pickling."""

from __future__ import annotations

import json
import pickle

import pytest

from sglang.srt.arg_groups import resolvers
from sglang.srt.runtime_context import get_context, publish
from sglang.srt.server_args import (
    ServerArgs,
    declare_late_resolution,
    resolution_result,
    resolution_sources,
)

pytestmark = pytest.mark.usefixtures("clean_context")


def cpu_args(**fields) -> ServerArgs:
    return ServerArgs(**{"model_path": "org/model", "device": "cpu", **fields})


def write_checkpoint(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_cpu_defaults_are_declared_not_written():
    sa = cpu_args().resolve_once()
    assert sa.chunked_prefill_size is None  # the record keeps the operator's input
    assert resolution_result(sa, "chunked_prefill_size") == 2048
    assert resolution_result(sa, "attention_backend") == "torch_native"
    assert resolution_result(sa, "sampling_backend") == "pytorch"
    assert resolution_result(sa, "mem_fraction_static") is None  # runner: bounded CPU pool
    assert resolution_result(sa, "grammar_backend") == "xgrammar"
    assert resolution_result(sa, "tokenizer_path") == "org/model"
    assert resolution_result(sa, "served_model_name") == "org/model"
    assert isinstance(resolution_result(sa, "random_seed"), int)
    assert resolution_sources(sa, "chunked_prefill_size") == ["chunked_prefill_by_device"]


@pytest.mark.parametrize(
    "fields,mode",
    [
        ({}, "inline"),
        ({"dp_size": 2}, "process"),
        ({"device": "cuda"}, "process"),
        ({"detokenizer_mode": "process"}, "process"),
    ],
)
def test_detokenizer_mode_inline_on_one_cpu_group(fields, mode):
    sa = cpu_args(**fields).resolve_once()
    assert resolution_result(sa, "detokenizer_mode") == mode


def test_detokenizer_mode_inline_refused_with_dp():
    with pytest.raises(ValueError, match="detokenizer_mode=inline is not accepted with dp_size=2"):
        cpu_args(detokenizer_mode="inline", dp_size=2).resolve_once()


def test_explicit_values_win():
    sa = cpu_args(chunked_prefill_size=-1, random_seed=7, dtype="bfloat16").resolve_once()
    assert resolution_result(sa, "chunked_prefill_size") == -1
    assert resolution_result(sa, "random_seed") == 7
    assert resolution_result(sa, "dtype") == "bfloat16"


def test_context_length_and_dtype_from_config_json(tmp_path, monkeypatch):
    monkeypatch.setattr(resolvers, "cpu_native_half_flags", lambda dtype: "")  # no fast bf16
    path = write_checkpoint(tmp_path, max_position_embeddings=512, dtype="bfloat16")
    sa = cpu_args(model_path=path).resolve_once()
    assert resolution_result(sa, "context_length") == 512
    assert resolution_result(sa, "dtype") == "float32"  # half on such a cpu runs float32


def test_text_config_and_torch_dtype(tmp_path):
    path = write_checkpoint(
        tmp_path, text_config={"max_position_embeddings": 64}, torch_dtype="float32"
    )
    sa = cpu_args(model_path=path).resolve_once()
    assert resolution_result(sa, "context_length") == 64
    assert resolution_result(sa, "dtype") == "float32"


def test_cuda_keeps_half_dtype_and_sizes(tmp_path):
    path = write_checkpoint(tmp_path, max_position_embeddings=8, dtype="bfloat16")
    sa = ServerArgs(model_path=path, device="cuda").resolve_once()
    assert resolution_result(sa, "dtype") == "bfloat16"
    assert resolution_result(sa, "chunked_prefill_size") == 8192
    assert resolution_result(sa, "mem_fraction_static") == 0.85


def test_hub_id_leaves_context_length_unresolved():
    assert resolution_result(cpu_args().resolve_once(), "context_length") is None


def test_missing_local_model_path_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="model_path"):
        cpu_args(model_path=str(tmp_path / "nope")).resolve_once()


def test_no_model_path_without_demo_names_the_field(monkeypatch):
    import sglang.demo_models as demo

    monkeypatch.setattr(demo, "demo_target_path", lambda: None)
    with pytest.raises(ValueError, match="model_path"):
        ServerArgs(device="cpu").resolve_once()


def test_no_model_path_serves_demo(monkeypatch, tmp_path):
    import sglang.demo_models as demo

    write_checkpoint(tmp_path, max_position_embeddings=32)
    monkeypatch.setattr(demo, "demo_target_path", lambda: tmp_path)
    sa = ServerArgs(device="cpu").resolve_once()
    assert resolution_result(sa, "model_path") == str(tmp_path)
    assert resolution_result(sa, "context_length") == 32


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"tp_size": 0}, "tp_size"),
        ({"attention_backend": "magic"}, "attention_backend"),
        ({"schedule_policy": "lifo"}, "schedule_policy"),
        ({"page_size": 0}, "page_size"),
        ({"port": 70000}, "port"),
        ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
        ({"attention_backend": "flashinfer"}, "attention_backend"),
        ({"tp_size": 2, "ep_size": 3}, "ep_size"),
        ({"speculative_algorithm": "MEDUSA"}, "speculative_algorithm"),
        ({"watchdog_timeout": float("nan")}, "watchdog_timeout"),  # would turn it off
    ],
)
def test_validation_names_field(fields, name):
    with pytest.raises(ValueError, match=name):
        cpu_args(**fields).resolve_once()


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"random_seed": "x"}, "random_seed"),
        ({"max_total_tokens": 1.5}, "max_total_tokens"),
        ({"disable_radix_cache": "yes"}, "disable_radix_cache"),
        ({"tp_size": True}, "tp_size"),
        ({"mem_fraction_static": "0.5"}, "mem_fraction_static"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_at_construction(fields, name):
    """A Python caller (ServerArgs, Engine) is not type-checked by the CLI parser."""
    with pytest.raises(ValueError, match=f"{name}=.* is not accepted; it must be"):
        ServerArgs(**fields)
    ServerArgs(random_seed=3, mem_fraction_static=1, max_total_tokens=None)  # int for float


def test_failed_resolution_leaves_record_unresolved():
    sa = cpu_args(tp_size=0)
    with pytest.raises(ValueError):
        sa.resolve_once()
    assert not sa.is_resolved
    sa.tp_size = 1  # still an input record: fixable
    assert sa.resolve_once().is_resolved


def test_resolved_record_refuses_assignment():
    sa = cpu_args().resolve_once()
    with pytest.raises(AttributeError, match="tp_size"):
        sa.tp_size = 2


def test_published_instance_refuses_assignment():
    sa = cpu_args()
    publish(sa, role="test")
    with pytest.raises(AttributeError, match="port"):
        sa.port = 1


def test_receiver_survives_derive():
    sa = cpu_args().resolve_once()
    variant = sa.derive("draft", context_length=128, load_format="dummy")
    assert resolution_result(variant, "context_length") == 128
    assert resolution_result(sa, "context_length") is None
    assert resolution_result(sa, "load_format") == "auto"
    assert resolution_sources(variant, "context_length") == ["draft"]


def test_derive_does_not_publish_and_leaves_bags():
    sa = cpu_args()
    publish(sa, role="test")
    variant = sa.derive("other", page_size=16)
    assert get_context().server_args is sa
    assert get_context().config_leaf("page_size") == 1
    declare_late_resolution(variant, "ok_on_unpublished_variant", chat_template="x")


def test_derive_rejects_unknown_and_invalid_fields():
    sa = cpu_args().resolve_once()
    with pytest.raises(ValueError, match="nope"):
        sa.derive("x", nope=1)
    with pytest.raises(ValueError, match="page_size"):
        sa.derive("x", page_size=0)


def test_derive_on_unresolved_record_sets_inputs():
    variant = cpu_args().derive("x", port=1234)
    assert variant.port == 1234 and not variant.is_resolved


def test_declare_late_resolution_before_publish_only():
    sa = cpu_args().resolve_once()
    declare_late_resolution(sa, "chat_template_detect", chat_template="chatml")
    assert resolution_result(sa, "chat_template") == "chatml"
    publish(sa, role="test")
    assert get_context().config_leaf("chat_template") == "chatml"
    with pytest.raises(ValueError, match="published"):
        declare_late_resolution(sa, "too_late", chat_template="x")


def test_declare_late_resolution_needs_resolution():
    with pytest.raises(ValueError, match="resolve"):
        declare_late_resolution(cpu_args(), "x", chat_template="y")


def test_pickle_keeps_stash_and_freeze():
    sa = cpu_args(tp_size=2).resolve_once()
    declare_late_resolution(sa, "late", chat_template="llama3")
    clone = pickle.loads(pickle.dumps(sa))
    assert clone.is_resolved
    assert clone.resolved_dict() == sa.resolved_dict()
    assert resolution_sources(clone, "chat_template") == ["late"]
    with pytest.raises(AttributeError):
        clone.tp_size = 4


def test_resolve_once_is_idempotent():
    sa = cpu_args().resolve_once()
    seed = resolution_result(sa, "random_seed")
    assert sa.resolve_once() is sa
    assert resolution_result(sa, "random_seed") == seed


def test_fields_are_keyword_only():
    with pytest.raises(TypeError):
        ServerArgs("org/model")  # type: ignore[misc]


def test_speculative_defaults_resolver():
    # Speculative flags are refused until speculative decoding lands; the resolver that
    # fills their defaults is kept and tested alone, on a plain view of resolved values.
    from types import SimpleNamespace

    from sglang.srt.arg_groups.resolvers import resolve_speculative

    names = [n for n in ServerArgs.__dataclass_fields__ if n.startswith("speculative_")]
    view = SimpleNamespace(
        **dict.fromkeys(names),
        attention_backend="torch_native",
        load_format="auto",
    )
    assert resolve_speculative(view) is None
    view.speculative_algorithm, view.speculative_num_steps = "NGRAM", 5
    source, declared = resolve_speculative(view)
    assert source == "speculative_defaults"
    assert declared["speculative_num_draft_tokens"] == 6
    assert "speculative_draft_attention_backend" not in declared  # NGRAM has no draft model
    view.speculative_algorithm, view.speculative_num_steps = "STANDALONE", None
    view.speculative_num_draft_tokens = 3
    source, declared = resolve_speculative(view)
    assert declared["speculative_num_steps"] == 2  # from num_draft_tokens
    assert declared["speculative_draft_attention_backend"] == "torch_native"
    assert declared["speculative_draft_load_format"] == "auto"
    assert declared["speculative_draft_model_path"].endswith("demo_models/draft")


def test_speculative_flags_checked_naming_the_field():
    with pytest.raises(ValueError, match="speculative_algorithm.*EAGLE drafting"):
        cpu_args(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="speculative_eagle_topk=2.*tree drafting"):
        cpu_args(speculative_algorithm="NGRAM", speculative_eagle_topk=2).resolve_once()
    with pytest.raises(ValueError, match="speculative_num_draft_tokens=3.*num_steps \\+ 1"):
        cpu_args(speculative_algorithm="NGRAM", speculative_num_steps=4,
                 speculative_num_draft_tokens=3).resolve_once()  # fmt: skip
    with pytest.raises(ValueError, match="speculative_num_draft_tokens=1 is not accepted"):
        cpu_args(speculative_algorithm="NGRAM", speculative_num_draft_tokens=1).resolve_once()
    with pytest.raises(ValueError, match="speculative_draft_model_path is not used by NGRAM"):
        cpu_args(speculative_algorithm="NGRAM", speculative_draft_model_path="/tmp").resolve_once()
    with pytest.raises(ValueError, match="page_size=4 is not supported yet"):
        cpu_args(speculative_algorithm="NGRAM", page_size=4).resolve_once()
    with pytest.raises(ValueError, match="not accepted with is_embedding"):
        cpu_args(speculative_algorithm="NGRAM", is_embedding=True).resolve_once()
    with pytest.raises(ValueError, match="min <= max"):
        cpu_args(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=5,
                 speculative_ngram_max_match_window_size=2).resolve_once()  # fmt: skip
    sa = cpu_args(speculative_algorithm="NGRAM").resolve_once()
    assert resolution_result(sa, "speculative_num_steps") == 3  # the record keeps None


@pytest.mark.parametrize(
    "field, value",
    [("speculative_num_steps", 3), ("speculative_draft_model_path", "/tmp"),
     ("speculative_eagle_topk", 1), ("speculative_ngram_max_match_window_size", 4),
     ("speculative_disable_by_batch_size", 4)],
)  # fmt: skip
def test_speculative_flags_without_an_algorithm_are_refused(field, value):
    # parsed and ignored otherwise: the server would decode without speculation
    with pytest.raises(ValueError, match=f"{field} is set but speculative_algorithm is not"):
        cpu_args(**{field: value}).resolve_once()


def test_ngram_flags_with_a_draft_model_algorithm_are_refused():
    with pytest.raises(ValueError, match="used by NGRAM only"):
        cpu_args(speculative_algorithm="STANDALONE",
                 speculative_ngram_min_match_window_size=2).resolve_once()  # fmt: skip


def test_mixed_chunk_refused_where_nothing_decodes_beside_a_prefill():
    with pytest.raises(ValueError, match="enable_mixed_chunk is not accepted with is_embedding"):
        cpu_args(enable_mixed_chunk=True, is_embedding=True).resolve_once()
    with pytest.raises(ValueError, match="enable_mixed_chunk .*speculative_algorithm='NGRAM'"):
        cpu_args(enable_mixed_chunk=True, speculative_algorithm="NGRAM").resolve_once()
    sa = cpu_args(enable_mixed_chunk=True, chunked_prefill_size=512).resolve_once()
    assert sa.enable_mixed_chunk and resolution_result(sa, "chunked_prefill_size") == 512


def test_env_fills_num_threads_and_log_level(monkeypatch):
    monkeypatch.setenv("SGLANG_NUM_THREADS", "3")
    monkeypatch.setenv("SGLANG_LOG_LEVEL", "debug")
    sa = cpu_args().resolve_once()
    assert resolution_result(sa, "num_threads") == 3
    assert resolution_result(sa, "log_level") == "debug"


def test_a_window_that_caps_the_context_is_the_resolved_context_length(tmp_path):
    # Mixtral's window runs here as a cap on the context: the readback says so (it said
    # max_position_embeddings while requests were refused past the window)
    path = write_checkpoint(tmp_path, model_type="mixtral", max_position_embeddings=4096,
                            sliding_window=8)  # fmt: skip
    sa = ServerArgs(model_path=path, device="cpu").resolve_once()
    assert resolution_result(sa, "context_length") == 8
    (tmp_path / "m").mkdir()
    windowed = write_checkpoint(tmp_path / "m", model_type="mistral",
                                max_position_embeddings=4096, sliding_window=8)  # fmt: skip
    sa = ServerArgs(model_path=windowed, device="cpu").resolve_once()
    assert resolution_result(sa, "context_length") == 4096  # Mistral's window runs


@pytest.mark.parametrize(
    "config, field",
    [({"num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 64}, "num_key_value_heads"),
     ({"num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 64}, "num_attention_heads"),
     ({"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 687}, "intermediate_size"),
     ({"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
       "moe_intermediate_size": 127, "num_experts": 4}, "moe_intermediate_size")],
)  # fmt: skip
def test_a_model_tp_cannot_split_is_refused_naming_the_field(tmp_path, config, field):
    # 3 KV heads over 2 ranks gave other tokens than tp 1, silently; 3 heads crashed the
    # first request; an odd MLP width was a bare AssertionError
    path = write_checkpoint(tmp_path, model_type="llama", hidden_size=64, **config)
    with pytest.raises(ValueError, match=f"tp_size=2 cannot split this model: {field}="):
        ServerArgs(model_path=path, device="cpu", tp_size=2).resolve_once()


def test_splits_tp_can_run_are_accepted(tmp_path):
    for kv_heads in (1, 2, 4):  # replicated on 2 ranks, one each, two each
        (tmp_path / str(kv_heads)).mkdir()
        path = write_checkpoint(tmp_path / str(kv_heads), model_type="llama", hidden_size=64,
                                num_attention_heads=4, num_key_value_heads=kv_heads,
                                intermediate_size=64)  # fmt: skip
        ServerArgs(model_path=path, device="cpu", tp_size=2).resolve_once()
    path = write_checkpoint(tmp_path, model_type="qwen3_moe", hidden_size=64,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                            moe_intermediate_size=127, num_experts=4)  # fmt: skip
    ServerArgs(model_path=path, device="cpu", tp_size=2, ep_size=2).resolve_once()  # experts split
    # Mixtral's intermediate_size is its experts' width: whole experts per rank (refused)
    (tmp_path / "mixtral").mkdir()
    path = write_checkpoint(tmp_path / "mixtral", model_type="mixtral", hidden_size=64,
                            num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=129, num_local_experts=4)  # fmt: skip
    ServerArgs(model_path=path, device="cpu", tp_size=2, ep_size=2).resolve_once()
    with pytest.raises(ValueError, match="tp_size=2 cannot split this model: intermediate_size"):
        ServerArgs(model_path=path, device="cpu", tp_size=2).resolve_once()


def test_experts_ep_cannot_split_are_refused_before_any_child_starts(tmp_path):
    # 3 experts over ep_size 2: the scheduler child started, then failed with a traceback
    path = write_checkpoint(tmp_path, model_type="qwen3_moe", hidden_size=64,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                            moe_intermediate_size=64, num_experts=3)  # fmt: skip
    with pytest.raises(ValueError, match="ep_size=2 cannot split this model: num_experts=3"):
        ServerArgs(model_path=path, device="cpu", tp_size=2, ep_size=2).resolve_once()
