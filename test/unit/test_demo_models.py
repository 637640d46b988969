"""The bundled demo pair: files, config, sizes, tokenizer; and the training script's pieces.

These read files and headers only (no forward pass); the model-quality checks are in
test/srt/test_demo_model.py.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import struct
import sys
from pathlib import Path

import pytest

from sglang.demo_models import DEMO_DIR, demo_draft_path, demo_target_path
from sglang.test import corpus

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


@functools.cache
def load_script():
    spec = importlib.util.spec_from_file_location(
        "train_demo_model", REPO / "scripts" / "train_demo_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def num_params(path: Path) -> int:
    header = safetensors_header(path / "model.safetensors")
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


@pytest.fixture(scope="module", params=["target", "draft"])
def checkpoint(request) -> Path:
    path = demo_target_path() if request.param == "target" else demo_draft_path()
    assert path is not None, f"no bundled demo {request.param} under {DEMO_DIR}"
    return path


def test_checkpoint_files_present(checkpoint):
    for name in CHECKPOINT_FILES:
        assert (checkpoint / name).is_file(), name


def test_weights_are_bf16(checkpoint):
    header = safetensors_header(checkpoint / "model.safetensors")
    dtypes = {t["dtype"] for k, t in header.items() if k != "__metadata__"}
    assert dtypes == {"BF16"}


def test_config_is_llama_with_shared_vocab(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 8192
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] >= 512


def test_parameter_counts():
    assert 5e6 <= num_params(demo_target_path()) <= 15e6
    assert 1e6 <= num_params(demo_draft_path()) <= 2e6


def test_total_size_is_small():
    total = sum(f.stat().st_size for f in DEMO_DIR.rglob("*") if f.is_file())
    assert total < 40e6


def test_pair_shares_one_tokenizer():
    target, draft = demo_target_path(), demo_draft_path()
    assert (target / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()


def test_generation_config_stops_on_im_end_and_endoftext(checkpoint):
    vocab = json.loads((checkpoint / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    gen = json.loads((checkpoint / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["eos_token_id"] == ids["<|im_end|>"]


def test_chat_template_renders_chatml():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_target_path()))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"


def test_model_card_states_corpus_license_and_command():
    card = (DEMO_DIR / "README.md").read_text()
    assert "PSF License Agreement" in card
    assert "python scripts/train_demo_model.py --seed" in card
    assert "python -m sglang.launch_server" in card
    for word in ("held-out loss", "Unigram baseline", "agreement"):
        assert word in card


# ---------------------------------------------------------------- training script pieces


def test_heldout_files_are_not_trained_on():
    heldout = corpus.heldout_documents()
    assert len(heldout) == len(corpus.HELDOUT_STDLIB_FILES)
    train = set(corpus.iter_train_documents())
    assert not train.intersection(heldout)


def test_lr_schedule_warms_up_then_decays_to_floor():
    script = load_script()
    lrs = [script.lr_at(s, script.progress(s, 100, 0.0, 0.0), 1.0, warmup=10) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0, abs=0.03)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == pytest.approx(0.1)


def test_progress_follows_the_clock_when_it_is_ahead():
    script = load_script()
    assert script.progress(10, 100, elapsed_s=0.0, budget_s=0.0) == pytest.approx(0.1)
    assert script.progress(10, 100, elapsed_s=50.0, budget_s=100.0) == pytest.approx(0.5)
    assert script.progress(90, 100, elapsed_s=50.0, budget_s=100.0) == pytest.approx(0.9)


def test_window_shape_keeps_tokens_per_step():
    script = load_script()
    args = script.parse_args([])
    shapes = [script.window_shape(s / 100, args) for s in range(100)]
    assert shapes[0] == (args.batch_size, args.seq_len)
    assert shapes[-1][1] == args.long_seq_len
    assert {b * s for b, s in shapes} == {args.batch_size * args.seq_len}
    assert sum(s == args.long_seq_len for _, s in shapes) == round(args.long_frac * 100)


def test_unigram_loss_is_add_one_cross_entropy():
    import torch

    script = load_script()
    train = torch.tensor([0, 0, 1])  # counts +1 over vocab 4: [3, 2, 1, 1] / 7
    windows = torch.tensor([[3, 0, 1]])  # positions 1.. are predicted: tokens 0 and 1
    expected = -(math.log(3 / 7) + math.log(2 / 7)) / 2
    assert script.unigram_loss(train, windows, vocab_size=4) == pytest.approx(expected)


def test_encode_stream_separates_documents():
    script = load_script()
    tok = corpus.train_tokenizer(vocab_size=300, max_bytes=20_000)
    stream = script.encode_stream(tok, ["a = 1", "b = 2"])
    eot = tok.token_to_id("<|endoftext|>")
    assert stream.tolist().count(eot) == 2 and stream[-1].item() == eot
