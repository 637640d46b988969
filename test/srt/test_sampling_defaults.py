"""--sampling-defaults model (the default, as SGLang's and vLLM's): a request's unset
sampling fields take the values of the model's generation_config.json."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, tmp_path_factory):
    import sglang as sgl

    model_dir = tmp_path_factory.mktemp("gen-defaults") / "model"
    shutil.copytree(tiny_llama_dir, model_dir)
    gen = json.loads((model_dir / "generation_config.json").read_text())
    gen.update(do_sample=True, top_k=1, temperature=0.7)  # top_k 1: sampling is greedy
    (model_dir / "generation_config.json").write_text(json.dumps(gen))
    with sgl.Engine(model_path=str(model_dir), num_threads=1, log_level="warning",
                    max_total_tokens=4096) as llm:  # fmt: skip
        yield llm


def test_unset_fields_take_the_models_defaults(engine):
    greedy = engine.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0})["output_ids"]
    for seed in (1, 2, 3):
        out = engine.generate(PROMPT, {"max_new_tokens": 8, "seed": seed})["output_ids"]
        assert out == greedy, seed
    info = engine.get_server_info()
    assert info["sampling_defaults"] == "model"
    assert info["default_sampling_params"] == {"temperature": 0.7, "top_k": 1}


def test_a_field_the_request_sets_wins(engine):
    outs = {tuple(engine.generate(PROMPT, {"max_new_tokens": 8, "seed": s, "top_k": -1,
                                           "temperature": 1.5})["output_ids"])
            for s in range(6)}  # fmt: skip
    assert len(outs) > 1  # sampled from the whole vocabulary again
