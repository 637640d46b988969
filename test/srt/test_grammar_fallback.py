"""A grammar backend that cannot start leaves a serving engine that says so.

With --skip-tokenizer-init there is no tokenizer to build xgrammar's vocabulary
from: the scheduler falls back to no grammar backend, records the fallback with
get_context().override (so the readback shows the backend in effect while the
operator's ServerArgs keeps the requested one), and a constrained request gets a
clear 400 saying why, while unconstrained requests are served.
"""

from __future__ import annotations

import pytest

import sglang as sgl
from sglang.srt.managers.request_errors import InvalidRequestError

pytestmark = pytest.mark.slow

IDS = [501, 77, 1203, 9, 3300, 42]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with sgl.Engine(
        model_path=str(tiny_llama_dir),
        skip_tokenizer_init=True,
        grammar_backend="xgrammar",
        num_threads=1,
        log_level="warning",
        max_total_tokens=4096,
        context_length=256,
    ) as llm:
        yield llm


def test_fallback_is_reported_and_constrained_requests_refused(engine):
    state = engine.get_server_info()["internal_states"][0]
    assert state["grammar_backend"] == "none"  # in effect, via the override
    assert engine.server_args.grammar_backend == "xgrammar"  # what the operator asked
    with pytest.raises(
        InvalidRequestError, match="xgrammar is unavailable.*without a tokenizer"
    ) as info:
        engine.generate(input_ids=IDS, sampling_params={"regex": "[ab]+", "max_new_tokens": 4})
    assert info.value.param == "sampling_params.regex" and info.value.status_code == 400
    out = engine.generate(input_ids=IDS, sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert len(out["output_ids"]) == 3
