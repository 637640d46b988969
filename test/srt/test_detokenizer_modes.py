"""detokenizer_mode: inline (the CPU default: the TokenizerManager detokenizes, no
detokenizer process) gives the same text, streamed chunks, stop-string trimming and
finish reasons as a detokenizer process."""

from __future__ import annotations

import os

import psutil
import pytest

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "max_new_tokens": 24}
PROMPTS = ["def add(a, b):\n    return", "The quick brown fox", "class Foo:\n", "1, 2, 3,"]


def _children(engine_pid: int) -> list[str]:
    """Command lines of this process's spawned children (not the resource tracker)."""
    procs = psutil.Process(engine_pid).children()
    return [" ".join(p.cmdline()) for p in procs if "resource_tracker" not in " ".join(p.cmdline())]


def _run(engine) -> dict:
    """What a user sees: full outputs, streamed chunks, stop strings, a finish by length."""
    full = [engine.generate(p, GREEDY) for p in PROMPTS]
    streamed = [list(engine.generate(p, GREEDY, stream=True)) for p in PROMPTS]
    # stop at a piece of each prompt's own greedy text, so every stop string matches
    stops = [out["text"][4:7] or "x" for out in full]
    stopped = [
        engine.generate(p, {**GREEDY, "stop": [s]}) for p, s in zip(PROMPTS, stops, strict=True)
    ]
    return {
        "text": [o["text"] for o in full],
        "ids": [o["output_ids"] for o in full],
        "finish": [o["meta_info"]["finish_reason"] for o in full],
        "streamed_text": ["".join(c["text"] for c in chunks) for chunks in streamed],
        "streamed_ids": [sum((c["output_ids"] for c in chunks), []) for chunks in streamed],
        "streamed_chunks": [len(chunks) for chunks in streamed],  # timing: may coalesce
        "stopped": [(o["text"], o["meta_info"]["finish_reason"]) for o in stopped],
    }


@pytest.fixture(scope="module")
def runs(tiny_llama_dir):
    import sglang as sgl

    results = {}
    for mode in ("auto", "process"):
        engine = sgl.Engine(
            model_path=str(tiny_llama_dir),
            num_threads=1,
            log_level="warning",
            max_total_tokens=4096,
            detokenizer_mode=mode,
        )
        try:
            children = _children(os.getpid())
            info = engine.get_server_info()
            results[mode] = (_run(engine), children, info)
        finally:
            engine.shutdown()
    return results


def test_cpu_default_is_inline_without_a_detokenizer_process(runs):
    _, children, info = runs["auto"]
    assert info["detokenizer_mode"] == "inline"
    assert len(children) == 1, children  # the scheduler only
    _, children, info = runs["process"]
    assert info["detokenizer_mode"] == "process"
    assert len(children) == 2, children  # the scheduler and the detokenizer


def test_inline_outputs_equal_the_detokenizer_process(runs):
    inline, process = runs["auto"][0], runs["process"][0]
    inline_chunks, process_chunks = inline.pop("streamed_chunks"), process.pop("streamed_chunks")
    assert inline == process
    assert inline["streamed_text"] == inline["text"]
    assert inline["streamed_ids"] == inline["ids"]
    assert all(n >= 2 for n in inline_chunks + process_chunks)
    for (text, reason), full_text in zip(inline["stopped"], inline["text"], strict=True):
        assert (
            reason["type"] == "stop" and full_text.startswith(text) and len(text) < len(full_text)
        )
