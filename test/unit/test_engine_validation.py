"""Engine.generate / encode argument checks that run before any request is sent: the
batch shape and SGLang's keywords, refused as /generate's 400s are (InvalidParamError
naming the field)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sglang.srt.entrypoints.engine import (
    RequestOptions,
    _build_requests,
    _embedding_requests,
    _has_exited,
    _own_keywords,
)
from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.protocol import UnsupportedSGLangFields
from sglang.srt.entrypoints.openai.serving_native import GenerateRequest, build_inputs
from sglang.srt.sampling.param_types import InvalidParamError

G = {"max_new_tokens": 2, "temperature": 0}
OWN = RequestOptions.__annotations__


def refusal(call) -> InvalidParamError:
    with pytest.raises(InvalidParamError) as info:
        call()
    return info.value


def http_refusal(body: dict) -> APIError:
    with pytest.raises(APIError) as info:
        build_inputs(GenerateRequest(**body))
    return info.value


@pytest.mark.parametrize(
    "engine_args, body",
    [
        ((["a", "b"], [G, G, G]), {"text": ["a", "b"], "sampling_params": [G, G, G]}),
        (("a", [G, G]), {"text": "a", "sampling_params": [G, G]}),
        ((["a", "b"], [dict(G, n=1), dict(G, n=3)]),
         {"text": ["a", "b"], "sampling_params": [dict(G, n=1), dict(G, n=3)]}),
        (([], G), {"text": [], "sampling_params": G}),
    ],
)  # fmt: skip
def test_batch_shape_is_refused_as_generate_refuses_it(engine_args, body):
    """Same message and param as /generate's 400."""
    exc = refusal(lambda: _build_requests(*engine_args, None, False))
    http = http_refusal(body)
    assert (str(exc), exc.param) == (str(http), http.param)


@pytest.mark.parametrize(
    "name, value",
    [("rid", ["x", "y", "z"]), ("return_logprob", [True] * 3), ("top_logprobs_num", [1] * 3),
     ("logprob_start_len", [0] * 3), ("token_ids_logprob", [[1]] * 3)],
)  # fmt: skip
def test_a_per_prompt_option_of_the_wrong_length_names_its_field(name, value):
    exc = refusal(lambda: _build_requests(["a", "b"], G, None, False, **{name: value}))
    assert exc.param == name and str(exc) == f"{name}: got 3 entries for 2 prompts"


def test_empty_prompt_lists_are_refused():
    assert refusal(lambda: _build_requests([], G, None, False)).param == "text"
    exc = refusal(lambda: _embedding_requests([], None, None, None))
    assert (str(exc), exc.param) == ("the prompt list is empty", "text")
    # one empty token-id list is one (empty) prompt, refused later by the tokenizer manager
    assert len(_build_requests(None, G, [], False)[0]) == 1


def test_sglang_keywords_at_their_default_are_accepted():
    """As SGLang code passes them: None, False (and 0 for the DP rank with one rank)."""
    given = {name: None for name in UnsupportedSGLangFields.model_fields}
    given.update(image_data=None, audio_data=None, video_data=None, bootstrap_host=None,
                 bootstrap_port=None, bootstrap_room=None, data_parallel_rank=0,
                 routed_dp_rank=None, return_hidden_states=False, require_reasoning=False,
                 routed_experts_start_len=0, external_trace_header=None, cache_salt=None,
                 return_logprob=True, top_logprobs_num=None, logprob_start_len=None)  # fmt: skip
    assert _own_keywords("generate", given, OWN, 1) == {
        "return_logprob": True, "require_reasoning": False}  # fmt: skip
    reqs, _ = _build_requests("a", G, None, False, **_own_keywords("generate", given, OWN, 1))
    assert reqs[0].return_logprob and reqs[0].top_logprobs_num == 0


@pytest.mark.parametrize("name", sorted(UnsupportedSGLangFields.model_fields))
def test_sglang_fields_the_routes_refuse_are_refused_with_the_same_message(name):
    exc = refusal(lambda: _own_keywords("generate", {name: "x"}, OWN, 1))
    with pytest.raises(ValueError) as http:  # the DP-rank fields: by the server's ranks
        UnsupportedSGLangFields(**{name: "x"}).check_dp_routing(1)
    assert exc.param == name and str(exc).removeprefix(f"{name}: ") in str(http.value)


@pytest.mark.parametrize(
    "name, value",
    [("image_data", "x.png"), ("audio_data", [b""]), ("bootstrap_room", 7),
     ("routed_experts_start_len", 3), ("session_id", "s")],
)  # fmt: skip
def test_sglang_keywords_not_implemented_are_refused_naming_them(name, value):
    exc = refusal(lambda: _own_keywords("generate", {name: value}, OWN, 1))
    assert exc.param == name and "not supported" in str(exc)


def test_a_dp_rank_is_refused_where_it_would_choose_a_rank():
    """The DP controller routes by --load-balance-method; it has no per-request rank."""
    for name in ("data_parallel_rank", "routed_dp_rank"):
        assert refusal(lambda name=name: _own_keywords("generate", {name: 1}, OWN, 1)).param == name
        assert refusal(lambda name=name: _own_keywords("generate", {name: 0}, OWN, 2)).param == name
        assert _own_keywords("generate", {name: None}, OWN, 2) == {}


def test_an_unknown_keyword_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="generate\\(\\) got an unexpected keyword argument 'lora'"):
        _own_keywords("generate", {"lora": None}, OWN, 1)
    with pytest.raises(TypeError, match="'return_logprob'"):
        _own_keywords("encode", {"return_logprob": True}, (), 1)


def test_a_child_reaped_by_someone_else_counts_as_exited():
    """An application's os.wait() can reap the scheduler; multiprocessing then reads it
    as alive forever, and the watchdog never failed the requests (they hung)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: the pid no longer exists
    assert _has_exited(SeenAlive(gone.pid))
    assert not _has_exited(SeenAlive(os.getpid()))


class SeenAlive:
    """A process as multiprocessing sees one that another wait reaped: alive."""

    exitcode = None

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self) -> bool:
        return True
