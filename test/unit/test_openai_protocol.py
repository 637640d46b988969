"""Request models, sampling translation, usage and fan-out (no HTTP server)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from openai_fake_tm import FakeTokenizer, FakeTokenizerManager
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.fanout import ChoiceFanout, ClientDisconnected, to_api_error
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.sampling import for_choice, sampling_params
from sglang.srt.entrypoints.openai.serving_base import ChoiceStream, choice_rids
from sglang.srt.entrypoints.openai.serving_completions import split_prompts
from sglang.srt.entrypoints.openai.usage import usage_of
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.chat_template import ChatTemplateError, render_chat


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -0.1},
        {"top_p": 0},
        {"n": 0},
        {"top_k": -2},
        {"n": 129},
        {"seed": "5"},
        {"seed": 1.5},
        {"stop": [1]},
        {"stop_token_ids": [1.5]},
        {"skip_special_tokens": "no"},
        {"max_tokens": 4.0},
        {"presence_penalty": 2.5},
        {"logit_bias": {"5": 101}},
        {"logit_bias": {"366": 100, "0366": 100}},  # one token twice: +200 past the cap
        {"logit_bias": {"-0": 5}},
        {"logit_bias": {"+5": 5}},
        {"top_logprobs": 21},
        {"stop": ["", "x"]},
    ],
)
def test_out_of_range_fields_rejected(fields):
    with pytest.raises(ValidationError):
        chat(**fields)


def test_explicit_nulls_take_the_defaults():
    """OpenAI marks these nullable; LangChain and LiteLLM send them as null."""
    nulls = {"n": None, "stream": None, "presence_penalty": None, "frequency_penalty": None}
    req = chat(**nulls, logprobs=None, parallel_tool_calls=None, top_k=None)
    assert (req.n, req.stream, req.presence_penalty, req.frequency_penalty) == (1, False, 0, 0)
    assert (req.logprobs, req.parallel_tool_calls, req.top_k) == (False, True, -1)
    options = {"include_usage": None, "continuous_usage_stats": None}
    assert not chat(stream=True, stream_options=options).stream_options.include_usage
    comp = CompletionRequest(model="m", prompt="x", echo=None, **nulls)
    assert (comp.echo, comp.n, comp.stream) == (False, 1, False)
    with pytest.raises(ValidationError):  # a required field's null is still refused
        CompletionRequest(model="m", prompt=None)


def test_unknown_role_rejected():
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=[{"role": "robot", "content": "x"}])


def test_sampling_params_translation():
    params = sampling_params(chat(temperature=0, stop="\n", seed=3, top_k=4), 9)
    assert params["max_new_tokens"] == 9 and params["temperature"] == 0
    assert params["stop"] == "\n" and params["top_k"] == 4
    assert for_choice(params, 0)["seed"] == 3 and for_choice(params, 2)["seed"] == 5
    unseeded = sampling_params(chat(), None)
    assert "seed" not in for_choice(unseeded, 1) and "max_new_tokens" not in unseeded


def test_split_prompts():
    assert split_prompts("a") == ["a"]
    assert split_prompts(["a", "b"]) == ["a", "b"]
    assert split_prompts([1, 2]) == [[1, 2]]
    assert split_prompts([[1], [2, 3]]) == [[1], [2, 3]]
    assert CompletionRequest(model="m", prompt=[[1], [2]]).prompt == [[1], [2]]


def test_choice_rids():
    assert choice_rids("req", "mine", 1) == ["mine"]
    assert choice_rids("req", "mine", 2) == ["mine-0", "mine-1"]
    assert choice_rids("req", None, 2) == ["req-0", "req-1"]
    # one choice runs under the response id a client sees: /abort_request with it works
    assert choice_rids("req", None, 1) == ["req"]


def test_usage_counts_each_prompt_once():
    metas = [
        {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 1},
        {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 5},
        {"prompt_tokens": 7, "completion_tokens": 1, "cached_tokens": 0},
        {"prompt_tokens": 7, "completion_tokens": 1, "cached_tokens": 7},
    ]
    usage = usage_of(metas, n=2)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 7, 19)
    assert usage.prompt_tokens_details.cached_tokens == 1


def test_choice_stream_deltas():
    state = ChoiceStream()
    assert state.take_text("ab") == "ab" and state.take_text("abcd") == "cd"
    assert state.take_logprob_start({"output_token_logprobs": [1, 2]}) == 0
    assert state.take_logprob_start({"output_token_logprobs": [1, 2, 3]}) == 2


def test_render_chat_template_override_and_errors():
    tok = FakeTokenizer()
    text = render_chat(tok, [{"role": "developer", "content": [{"type": "text", "text": "s"}]}],
                       "{{ messages[0]['role'] }}:{{ messages[0]['content'] }}")  # fmt: skip
    assert text == "system:s"
    with pytest.raises(ChatTemplateError):
        render_chat(tok, [{"role": "user", "content": [{"type": "image_url"}]}])
    tok.chat_template = None
    with pytest.raises(ChatTemplateError):
        render_chat(tok, [{"role": "user", "content": "x"}])


_PARTS = [{"type": "text", "text": "line one\n"}, {"type": "text", "text": "\nline two"}]
# as Gemma 3's: a template that loops over the parts, trimming each
_LOOPING = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for part in m['content'] %}{{ part['text'] | trim }}{% endfor %}"
            "{% endif %}{% endfor %}")  # fmt: skip


@pytest.mark.parametrize(
    "template, expected",
    [("{{ messages[0]['content'] }}", "line one\n \nline two"),  # joined by a space
     (_LOOPING, "line oneline two"),  # the parts themselves, as HF renders them
     ("{% for p in messages[0].content | list %}[{{ p.text }}]{% endfor %}",
      "[line one\n][\nline two]")],
)  # fmt: skip
def test_content_parts_reach_a_template_that_loops_over_them(template, expected):
    """As SGLang and vLLM: parts stay a list for a template that iterates over a
    message's content; a template that reads it as text gets the texts joined."""
    assert render_chat(FakeTokenizer(), [{"role": "user", "content": _PARTS}], template) == (
        expected
    )


class _DisconnectingRequest:
    """An ASGI request whose client leaves after `after_s`."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s

    async def receive(self) -> dict:
        await asyncio.sleep(self.after_s)
        return {"type": "http.disconnect"}


def _objs(n: int, max_new_tokens: int = 200) -> list[GenerateReqInput]:
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    return [GenerateReqInput(text="ab", sampling_params=params, rid=f"r{i}") for i in range(n)]


def test_fanout_disconnect_aborts_every_choice():
    tm = FakeTokenizerManager(step_delay_s=0.005)

    async def run() -> None:
        async with ChoiceFanout(tm, _objs(3), request=_DisconnectingRequest(0.05)) as fanout:
            await fanout.collect()

    with pytest.raises(ClientDisconnected):
        asyncio.run(run())
    assert tm.aborted == {"r0", "r1", "r2"}


def test_fanout_consumer_leaving_early_aborts():
    tm = FakeTokenizerManager(step_delay_s=0.001)

    async def run() -> None:
        async with ChoiceFanout(tm, _objs(2)) as fanout:
            await fanout.prime()
            async for _ in fanout.events():
                break
        await asyncio.sleep(0.01)

    asyncio.run(run())
    assert tm.aborted == {"r0", "r1"} and not tm.running


def test_fanout_finished_choices_not_aborted():
    tm = FakeTokenizerManager()

    async def run() -> list:
        async with ChoiceFanout(tm, _objs(2, max_new_tokens=3)) as fanout:
            return await fanout.collect()

    outputs = asyncio.run(run())
    assert [len(o["output_ids"]) for o in outputs] == [3, 3] and not tm.aborted


def test_a_reader_that_falls_behind_gets_the_latest_output_not_every_step():
    """Outputs are cumulative: a consumer that reads nothing while 200 steps run (a
    stalled HTTP client) holds one queued output per choice, not one per step (memory
    grew with the square of the output), and reads the same final text."""
    tm = FakeTokenizerManager()

    async def run() -> tuple[int, list, list]:
        async with ChoiceFanout(tm, _objs(2)) as fanout:
            while len(tm.requests) < 2 or tm.running:  # every step pumped, none read
                await asyncio.sleep(0.001)
            queued = fanout._queue.qsize()
            events = [event async for event in fanout.events()]
            return queued, events, [e.output for e in events if e.finished]

    queued, events, finals = asyncio.run(run())
    assert queued == 2 and len(events) == 2
    assert [len(o["output_ids"]) for o in finals] == [200, 200]
    assert all(len(o["text"]) == 200 for o in finals)


class _StayingRequest:
    """An ASGI request whose client stays until the answer is done."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("max_tokens", [3, -1], ids=["finished", "rejected"])
def test_fanout_freed_without_the_cycle_collector(max_tokens):
    # A served request's objects must go when it ends: each one left in a reference
    # cycle waits for a full collection, which stops the launcher for ~100 ms under load.
    tm = FakeTokenizerManager()
    fanouts: list[weakref.ref] = []
    answers: list[str] = []

    async def serve() -> None:
        fanout = ChoiceFanout(tm, _objs(2, max_new_tokens=max_tokens), request=_StayingRequest())
        fanouts.append(weakref.ref(fanout))
        try:
            async with fanout:
                await fanout.collect()
            answers.append("ok")
        except Exception as exc:  # the route answers with the mapped error only
            answers.append(to_api_error(exc).message)

    async def run() -> None:
        await serve()
        await asyncio.sleep(0)  # the cancelled helper tasks finish

    gc.collect()
    gc.disable()
    try:
        asyncio.run(run())
        assert fanouts[0]() is None
    finally:
        gc.enable()
    assert answers == ["ok"] if max_tokens > 0 else "max_new_tokens" in answers[0], answers


def test_unset_sampling_fields_are_left_to_the_model_defaults():
    """Only the fields a request set go to the runtime; the TokenizerManager fills the
    rest from --sampling-defaults (the model's generation_config.json or the API's)."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.sampling import sampling_params
    from sglang.srt.managers.tokenizer_manager import _model_sampling_defaults, _with_defaults

    bare = sampling_params(CompletionRequest(model="m", prompt="a"), 4)
    assert not {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"} & set(bare)
    given = CompletionRequest(model="m", prompt="a", top_k=5, temperature=0.2)
    assert sampling_params(given, 4)["top_k"] == 5
    model = {"temperature": 0.6, "top_k": 20}
    assert _with_defaults({"top_k": 5, "temperature": None}, model) == {"temperature": 0.6,
                                                                       "top_k": 5}  # fmt: skip

    class Config:
        vocab_size = 100
        sampling_defaults = {"temperature": 0.6, "top_p": 7.0}  # top_p 7: not usable

    assert _model_sampling_defaults(Config, "model") == {"temperature": 0.6}
    assert _model_sampling_defaults(Config, "openai") == {}


def test_running_out_of_file_descriptors_is_a_503_to_retry_not_an_internal_error():
    """Past `ulimit -n` a connection flood fails a lazy import or a socket: the server
    recovers as connections close, so the client is told to retry (it got a 500)."""
    import errno

    error = to_api_error(OSError(errno.EMFILE, "Too many open files"))
    assert (error.status_code, error.code) == (503, "server_overloaded")
    assert error.headers == {"Retry-After": "1"}
    assert to_api_error(OSError(errno.EACCES, "denied")).status_code == 500
