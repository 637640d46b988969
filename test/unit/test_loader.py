"""Checkpoint loading: sharded safetensors, tied embeddings, Mistral configs, dummy
weights, and the errors a bad checkpoint or model path gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_loader.loader import get_model
from sglang.srt.model_loader.weight_utils import resolve_model_path
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_logits
from sglang.test.runner_utils import MiniReq, MiniScheduler

SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
PROMPT = [5, 17, 300, 42, 42, 7, 99, 100, 1, 2]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _save_hf(tmp_path, config, **save_kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path, **save_kw)
    return model


def _our_last_logits(model_dir, load_format=None) -> torch.Tensor:
    with get_context().override_server_args(
        model_path=str(model_dir), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(model_dir)), load_format=load_format)
    sched = MiniScheduler(worker)
    req = MiniReq(PROMPT)
    return worker.forward_batch_logits(sched.build_extend([req])).next_token_logits[0]


def _config(kind: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    if kind == "mistral":
        return MistralConfig(**SMALL, sliding_window=None)
    if kind == "qwen2_tied":
        return Qwen2Config(**SMALL, tie_word_embeddings=True)
    if kind == "llama_partial_rotary":  # transformers' Llama rope rotates every dim anyway
        return LlamaConfig(**SMALL, partial_rotary_factor=0.5)
    return LlamaConfig(**SMALL, tie_word_embeddings=kind == "llama_tied")


@pytest.mark.parametrize("kind", ["mistral", "llama_tied", "qwen2_tied", "llama_partial_rotary"])
def test_config_variants_match_hf(tmp_path, kind):
    hf = _save_hf(tmp_path, _config(kind))
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("differs", [True, False])
def test_a_tied_config_with_a_stored_lm_head(tmp_path, differs):
    """transformers unties a stored lm_head that differs from the embeddings (and warns);
    one equal to them stays tied: ours must give HF's logits either way."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    _save_hf(tmp_path, _config("llama_tied"))
    state = load_file(str(tmp_path / "model.safetensors"))
    embed = state["model.embed_tokens.weight"]
    state["lm_head.weight"] = embed * 1.5 + 0.01 if differs else embed.clone()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    hf = _save_hf(tmp_path, _config("llama"), max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def _as_bin_checkpoint(model_dir, model, num_shards: int) -> None:
    """Rewrite a saved checkpoint as pytorch_model*.bin (transformers 5 writes only
    safetensors), with pytorch_model.bin.index.json when sharded."""
    import json

    for f in model_dir.glob("model*.safetensors*"):
        f.unlink()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if num_shards == 1:
        torch.save(state, model_dir / "pytorch_model.bin")
        return
    names, weight_map = sorted(state), {}
    for i in range(num_shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{num_shards:05d}.bin"
        part = names[i::num_shards]
        torch.save({k: state[k] for k in part}, model_dir / shard)
        weight_map.update({k: shard for k in part})
    index = {"metadata": {}, "weight_map": weight_map}
    (model_dir / "pytorch_model.bin.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("safe", [True, False])
def test_files_beside_the_weights_are_not_loaded(tmp_path, safe):
    """A Trainer's output dir (training_args.bin, optimizer.pt), a PEFT adapter and
    Mistral's consolidated copy sit beside the weights; HF loads the model's own only."""
    hf = _save_hf(tmp_path, _config("llama"))
    if not safe:
        _as_bin_checkpoint(tmp_path, hf, num_shards=1)
    torch.save({"lr": 1.0}, tmp_path / "optimizer.pt")
    (tmp_path / "training_args.bin").write_bytes(b"a pickle of TrainingArguments")
    junk = {"base_model.model.lora_A.weight": torch.zeros(2, 2)}
    if safe:
        from safetensors.torch import save_file

        save_file(junk, tmp_path / "adapter_model.safetensors")
        save_file({"tok_embeddings.weight": torch.zeros(2, 2)}, tmp_path / "consolidated.safetensors")
    else:
        torch.save(junk, tmp_path / "adapter_model.bin")
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_sharded_bin_checkpoint_reads_its_index(tmp_path):
    hf = _save_hf(tmp_path, _config("llama"))
    _as_bin_checkpoint(tmp_path, hf, num_shards=3)
    (tmp_path / "training_args.bin").write_bytes(b"a pickle of TrainingArguments")
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_hub_checkpoint_without_safetensors_fetches_its_bin_files(tmp_path, monkeypatch):
    """The hub download asks for .bin weights only when the repo has no safetensors,
    and never for a Trainer's state or an adapter."""
    import huggingface_hub

    from sglang.srt.model_loader import weight_utils

    repo = {"config.json": b"{}", "pytorch_model.bin": b"w", "training_args.bin": b"t"}
    asked = []

    def fake_download(repo_id, revision, allow_patterns, ignore_patterns, local_files_only):
        asked.append(list(allow_patterns))
        for name, data in repo.items():
            wanted = any(Path(name).match(p) for p in allow_patterns)
            if wanted and not any(Path(name).match(p) for p in ignore_patterns):
                (tmp_path / name).write_bytes(data)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert resolve_model_path("org/bin-only") == tmp_path
    assert len(asked) == 2 and "*.bin" in asked[1] and "*.bin" not in asked[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
    assert weight_utils.pt_files(tmp_path) == [tmp_path / "pytorch_model.bin"]


@pytest.mark.parametrize("field, value", [("hidden_act", "gelu"), ("mlp_bias", True)])
def test_an_mlp_we_do_not_run_is_refused_by_name(tmp_path, field, value):
    """Not silently run as SiLU without biases (the logits would be wrong)."""
    config = _config("llama")
    setattr(config, field, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=field):
        get_model(ModelConfig(str(tmp_path)), "cpu", "dummy")


def test_gemma3_ignores_attn_logit_softcapping_as_hf_does(tmp_path):
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(**SMALL, head_dim=16, attn_logit_softcapping=2.0,
                              sliding_window=4, initializer_range=0.2)  # fmt: skip
    config.architectures = ["Gemma3ForCausalLM"]
    hf = _save_hf(tmp_path, config)
    ours = _our_last_logits(tmp_path)
    torch.testing.assert_close(ours, hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)


def test_dummy_load_format_needs_only_config(tmp_path):
    _config("llama").save_pretrained(tmp_path)
    logits = _our_last_logits(tmp_path, load_format="dummy")
    assert logits.shape == (512,) and torch.isfinite(logits).all()


def test_unsupported_architecture_lists_supported(tmp_path):
    config = _config("llama")
    config.architectures = ["FooForCausalLM"]
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"FooForCausalLM.*supported: .*LlamaForCausalLM"):
        get_model(ModelConfig(str(tmp_path)), "cpu", "dummy")


def test_missing_and_corrupt_weights_name_the_file(tmp_path):
    _config("llama").save_pretrained(tmp_path)
    cfg = ModelConfig(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        get_model(cfg, "cpu", "safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RuntimeError, match="model.safetensors"):
        get_model(cfg, "cpu", "auto")


def test_a_shard_the_index_names_but_missing_is_the_error_given(tmp_path):
    # auto must not fall back to .bin files and blame their absence
    _save_hf(tmp_path, _config("llama"), max_shard_size="200KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=f"lists missing shard.*{shards[-1].name}"):
        get_model(ModelConfig(str(tmp_path)), "cpu", "auto")
    for f in tmp_path.glob("model*.safetensors*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match=r"no weight files \(\*.safetensors, \*.bin"):
        get_model(ModelConfig(str(tmp_path)), "cpu", "auto")


def test_hub_id_offline_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model_path("no-such-org/no-such-model")


def test_update_weights_from_disk(tmp_path):
    from transformers import LlamaConfig

    a, b, bad = tmp_path / "a", tmp_path / "b", tmp_path / "bad"
    _save_hf(a, _config("llama"))
    torch.manual_seed(1)
    from transformers import AutoModelForCausalLM

    hf_b = AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float32).eval()
    hf_b.save_pretrained(b)
    _save_hf(bad, LlamaConfig(**{**SMALL, "hidden_size": 32}))
    with get_context().override_server_args(
        model_path=str(a), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(a)))
    sched = MiniScheduler(worker)

    def last_logits():
        req = MiniReq(PROMPT)
        out = worker.forward_batch_logits(sched.build_extend([req])).next_token_logits[0]
        sched.release([req])
        return out

    before = last_logits()
    ok, message = worker.update_weights_from_disk(str(bad))
    assert not ok and "hidden_size" in message
    torch.testing.assert_close(last_logits(), before)
    ok, _ = worker.update_weights_from_disk(str(b))
    assert ok
    torch.testing.assert_close(last_logits(), hf_logits(hf_b, PROMPT)[-1], atol=1e-4, rtol=0)


def test_an_update_that_caps_the_context_lower_is_refused(tmp_path):
    # a sliding window this model type runs as a cap on the context: the update was
    # accepted and its requests ran full attention past the window, under the old limit
    from transformers import LlamaConfig

    good, windowed = tmp_path / "good", tmp_path / "windowed"
    _save_hf(good, _config("llama"))
    _save_hf(windowed, LlamaConfig(**SMALL, sliding_window=16, use_sliding_window=True))
    with get_context().override_server_args(
        model_path=str(good), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(good)))
    assert worker.context_len > 16
    ok, message = worker.update_weights_from_disk(str(windowed))
    assert not ok and "context length is 16 tokens" in message, message


def test_an_update_tp_cannot_split_is_refused_as_at_start_up(tmp_path):
    # its MLP width odd: the update failed on a bare assertion's tuple, "(687, 2)"
    from transformers import LlamaConfig

    good, odd = tmp_path / "good", tmp_path / "odd"
    _save_hf(good, _config("llama"))
    _save_hf(odd, LlamaConfig(**{**SMALL, "intermediate_size": 687}))
    with get_context().override_server_args(
        model_path=str(good), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(good)))
    worker.model_runner.tp_size = 2  # the check runs before any collective load
    ok, message = worker.update_weights_from_disk(str(odd))
    assert not ok and "tp_size=2 cannot split this model: intermediate_size=687" in message


@pytest.mark.parametrize("dropped", ["model.layers.1.self_attn.k_proj.weight",
                                     "model.layers.0.mlp.up_proj.weight"])  # fmt: skip
def test_a_missing_part_of_a_fused_weight_is_refused(tmp_path, dropped):
    # q, v without k (gate without up): the fused parameter's missing slice would stay
    # uninitialized memory, silently, at load and at a weight update
    from safetensors.torch import load_file, save_file

    good, cut = tmp_path / "good", tmp_path / "cut"
    _save_hf(good, _config("llama"))
    _save_hf(cut, _config("llama"))
    weights = load_file(cut / "model.safetensors")
    del weights[dropped]
    save_file(weights, cut / "model.safetensors", metadata={"format": "pt"})
    part = dropped.split(".")[-2].split("_")[0]  # "k" / "up" -> the part it names
    with pytest.raises(ValueError, match="checkpoint is missing weights for: .*\\((k|1)\\)"):
        get_model(ModelConfig(str(cut)), "cpu", "auto")
    with get_context().override_server_args(
        model_path=str(good), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(good)))
    ok, message = worker.update_weights_from_disk(str(cut))
    assert not ok and "missing weights" in message, (part, message)


def test_an_update_to_a_checkpoint_without_lm_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    good, headless = tmp_path / "good", tmp_path / "headless"
    _save_hf(good, _config("llama"))
    _save_hf(headless, _config("llama"))
    weights = load_file(headless / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, headless / "model.safetensors", metadata={"format": "pt"})
    with get_context().override_server_args(
        model_path=str(good), device="cpu", max_total_tokens=256, max_running_requests=4
    ):
        worker = TpModelWorker(ModelConfig(str(good)))
    before = _our_last_logits(good)
    ok, message = worker.update_weights_from_disk(str(headless))
    assert not ok and "no lm_head" in message
    sched = MiniScheduler(worker)
    after = worker.forward_batch_logits(sched.build_extend([MiniReq(PROMPT)])).next_token_logits[0]
    torch.testing.assert_close(after, before)  # the old weights still serve


def test_a_model_dir_without_tokenizer_files_says_what_to_pass(tmp_path):
    from sglang.srt.managers.tokenizer_manager import load_tokenizer

    _config("llama").save_pretrained(tmp_path)  # config.json only
    with get_context().override_server_args(model_path=str(tmp_path), device="cpu"):
        with pytest.raises(ValueError, match="holds no tokenizer files.*--tokenizer-path"):
            load_tokenizer()
    # the operator passed --tokenizer-path already: not "pass --tokenizer-path DIR"
    empty = tmp_path / "empty"
    empty.mkdir()
    with get_context().override_server_args(
        model_path=str(tmp_path), tokenizer_path=str(empty), device="cpu"
    ):
        with pytest.raises(ValueError, match="point --tokenizer-path at a directory"):
            load_tokenizer()


def test_the_tokenizer_says_nothing_of_prompts_past_its_max_length(tmp_path, capfd):
    # transformers' "will result in indexing errors" went past --log-level on a prompt
    # the server refuses itself with a 400 naming its context
    from sglang.srt.managers.tokenizer_manager import load_tokenizer
    from sglang.test.corpus import save_tokenizer_files
    from sglang.test.make_tiny_model import cached_tokenizer

    save_tokenizer_files(cached_tokenizer(), tmp_path, model_max_length=64)
    _config("llama").save_pretrained(tmp_path)
    with get_context().override_server_args(model_path=str(tmp_path), device="cpu"):
        tokenizer = load_tokenizer()
    tokenizer.encode("word " * (tokenizer.model_max_length + 10))
    assert "indexing errors" not in capfd.readouterr().err
