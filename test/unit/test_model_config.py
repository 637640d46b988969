"""ModelConfig reads both transformers-4 and -5 config.json layouts."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.rotary_embedding import get_rope

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "eos_token_id": 7,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


def _write(tmp_path, extra: dict, gen: dict | None = None) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **extra}))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return str(tmp_path)


def test_transformers4_layout(tmp_path):
    path = _write(
        tmp_path,
        {"rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING, "torch_dtype": "bfloat16"},
        gen={"eos_token_id": [7, 9]},
    )
    cfg = ModelConfig(path)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.dtype == torch.bfloat16
    assert cfg.eos_token_ids == {7, 9}
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2
    assert cfg.context_len == 1024 and cfg.architecture == "LlamaForCausalLM"


def test_transformers5_layout_and_explicit_head_dim(tmp_path):
    params = {"rope_theta": 1e6, **LLAMA3_SCALING}
    path = _write(
        tmp_path,
        {
            "rope_parameters": params,
            "dtype": "float16",
            "head_dim": 32,
            "tie_word_embeddings": True,
        },
    )
    cfg = ModelConfig(path, context_length=512, dtype="float32")
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling["factor"] == 8.0
    assert cfg.head_dim == 32 and cfg.tie_word_embeddings
    assert cfg.dtype == torch.float32 and cfg.context_len == 512


def test_default_rope_is_no_scaling(tmp_path):
    cfg = ModelConfig(
        _write(tmp_path, {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})
    )
    assert cfg.rope_scaling is None and cfg.rope_theta == 10000.0


def test_bad_dtype_and_missing_config(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(_write(tmp_path, {}), dtype="int8")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ModelConfig(str(tmp_path / "nowhere" / "x"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig(str(tmp_path / "empty"))


YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "linear", "factor": 4.0}, LLAMA3_SCALING, YARN_SCALING,
     # without its original length, HF takes max_position_embeddings (not Meta's 8192)
     {k: v for k, v in LLAMA3_SCALING.items() if k != "original_max_position_embeddings"}],
    ids=["default", "linear", "llama3", "yarn", "llama3-no-original"],
)
def test_rope_matches_hf(tmp_path, scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hf_cfg = LlamaConfig(
        **{k: v for k, v in BASE.items() if k != "architectures"},
        rope_theta=10000.0,
        rope_scaling=dict(scaling) if scaling else None,  # HF fills in missing keys in place
    )
    hf_rope = LlamaRotaryEmbedding(hf_cfg)
    ours = get_rope(16, 1024, 10000.0, scaling)
    pos = torch.tensor([0, 5, 300, 1000])
    q, k = torch.randn(4, 4 * 16), torch.randn(4, 2 * 16)
    cos, sin = hf_rope(q, pos[None])
    hq, hk = apply_rotary_pos_emb(
        q.view(1, 4, 4, 16).transpose(1, 2), k.view(1, 4, 2, 16).transpose(1, 2), cos, sin
    )
    oq, ok = ours(pos, q, k)
    torch.testing.assert_close(oq.view(4, 4, 16), hq[0].transpose(0, 1))
    torch.testing.assert_close(ok.view(4, 2, 16), hk[0].transpose(0, 1))


def test_dynamic_rope_matches_hf_generate():
    """Dynamic NTK: the plain base within max_position_embeddings (every prompt that
    fits); past it, position p as HF's generate rotates it: with the base for p + 1
    tokens (HF recomputes the base per forward from the sequence length)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "dynamic", "factor": 4.0}
    hf_cfg = LlamaConfig(
        **{k: v for k, v in BASE.items() if k not in ("architectures", "max_position_embeddings")},
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_scaling=scaling,
    )
    ours = get_rope(16, 256, 10000.0, scaling)
    assert ours.cos_cache.shape[0] == 1024
    hf_rope = LlamaRotaryEmbedding(hf_cfg)
    x = torch.zeros(1, 1, 16)
    prompt = torch.arange(200)
    cos, sin = hf_rope(x, prompt[None])  # a prompt that fits
    torch.testing.assert_close(ours.cos_cache[:200], cos[0, :, :8])
    torch.testing.assert_close(ours.sin_cache[:200], sin[0, :, :8])
    for p in (256, 300, 1023):  # a decode step at position p: HF's sequence is p + 1 long
        hf_rope = LlamaRotaryEmbedding(hf_cfg)
        cos, sin = hf_rope(x, torch.arange(p + 1)[None])
        # float32 rounding of p * inv_freq (up to ~1e3 rad here): a few ulps of 1e3
        torch.testing.assert_close(ours.cos_cache[p], cos[0, p, :8], rtol=0, atol=2e-4)
        torch.testing.assert_close(ours.sin_cache[p], sin[0, p, :8], rtol=0, atol=2e-4)


def test_unsupported_rope_type():
    with pytest.raises(ValueError, match="supported"):
        get_rope(16, 64, 10000.0, {"rope_type": "mystery", "factor": 2.0})
    with pytest.raises(ValueError, match="needs a 'factor'"):  # not a bare KeyError
        get_rope(16, 64, 10000.0, {"rope_type": "yarn"})


W = 512
SLIDE, FULL = "sliding_attention", "full_attention"


@pytest.mark.parametrize(
    "extra, windows",
    [
        (
            {"model_type": "mistral", "sliding_window": W, "architectures": ["MistralForCausalLM"]},
            [W, W],
        ),
        ({"model_type": "mistral", "sliding_window": None}, [None, None]),
        ({"model_type": "qwen2", "sliding_window": W, "use_sliding_window": False}, [None, None]),
        (
            {
                "model_type": "qwen2",
                "sliding_window": W,
                "use_sliding_window": True,
                "max_window_layers": 1,
            },
            [None, W],
        ),
        ({"model_type": "gemma2", "sliding_window": W}, [W, None]),
        (
            {"model_type": "gemma3_text", "sliding_window": W, "num_hidden_layers": 7},
            [W] * 5 + [None, W],
        ),
        (
            {"model_type": "gemma3_text", "sliding_window": W, "layer_types": [FULL, SLIDE]},
            [None, W],
        ),
    ],
    ids=["mistral", "mistral-none", "qwen2-off", "qwen2-on", "gemma2", "gemma3", "layer_types"],
)
def test_sliding_window_layers_keep_the_full_context(tmp_path, extra, windows):
    config = ModelConfig(_write(tmp_path, extra))
    assert config.layer_windows == windows
    assert config.context_len == 1024


def test_sliding_window_caps_the_context_where_not_implemented(tmp_path):
    extra = {"model_type": "starcoder2", "sliding_window": W, "use_sliding_window": True}
    config = ModelConfig(_write(tmp_path, extra))
    assert config.context_len == W and config.layer_windows == [None, None]


@pytest.mark.parametrize("scaling", [LLAMA3_SCALING, YARN_SCALING], ids=["llama3", "yarn"])
def test_a_top_level_original_max_position_embeddings_wins(tmp_path, scaling):
    # Phi-3 keeps it beside rope_scaling; transformers gives that one priority (the
    # scaling's own value was used: logprobs off by up to 0.98)
    path = _write(tmp_path, {"rope_scaling": scaling, "original_max_position_embeddings": 32})
    assert ModelConfig(path).rope_scaling["original_max_position_embeddings"] == 32


def test_missing_keys_take_the_model_types_transformers_defaults(tmp_path):
    # a Mixtral config.json without rope_theta / rms_norm_eps: MixtralConfig's 1e6 and 1e-5
    # (llama's 10000 and 1e-6 were used: greedy tokens differed from HF's)
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
               "num_local_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(
        {k: v for k, v in {**BASE, **mixtral}.items() if k != "rms_norm_eps"}))  # fmt: skip
    cfg = ModelConfig(str(tmp_path))
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1_000_000.0, 1e-5)
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert hf.rms_norm_eps == cfg.rms_norm_eps
    # a Mistral config without sliding_window: HF's 4096 on every layer
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **mistral}))
    assert set(ModelConfig(str(tmp_path)).layer_windows) == {4096}


def test_gemma_and_mixtral_defaults_match_transformers(tmp_path):
    # Gemma 2 without head_dim / query_pre_attn_scalar / softcaps / activation, and a
    # Mixtral whose rope_parameters name no theta: each as transformers fills it in
    from transformers import AutoConfig

    gemma = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"}
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **gemma}))
    ours, hf = ModelConfig(str(tmp_path)), AutoConfig.from_pretrained(str(tmp_path))
    assert ours.head_dim == hf.head_dim == 256
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                "hidden_activation"):  # fmt: skip
        assert ours.raw[key] == getattr(hf, key), key
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
               "num_local_experts": 4, "num_experts_per_tok": 2,
               "rope_parameters": {"rope_type": "default"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **mixtral}))
    assert ModelConfig(str(tmp_path)).rope_theta == 1_000_000.0
