"""The TokenizerManager's receive loop: one unusable output fails its request only."""

from __future__ import annotations

import asyncio
import logging
import types

import pytest

from sglang.srt.managers.io_struct import (
    HEALTH_PROBE_RID_PREFIX,
    BatchStrOutput,
    GenerateReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
)
from sglang.srt.managers.request_errors import RequestFailedError, error_of_finish
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from sglang.srt.sampling.param_types import InvalidParamError


class _Recorder:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, obj) -> None:
        self.sent.append(obj)


def _bare_manager() -> TokenizerManager:
    """The receive-side state only: no processes, no sockets."""
    tm = TokenizerManager.__new__(TokenizerManager)
    tm._init_request_state()
    tm._dead_message = None
    tm.send_to_scheduler = _Recorder()
    return tm


def _state(rid: str, parent: str | None = None) -> ReqState:
    return ReqState(obj=GenerateReqInput(text="x", rid=rid, parent_rid=parent), prompt_tokens=1)


def test_a_fanned_out_request_holds_its_rid_and_abort_reaches_only_its_samples():
    tm = _bare_manager()
    samples = [_state("fam-0", "fam"), _state("fam-1", "fam")]
    for state in [*samples, _state("solo-1")]:
        tm._register(state)
    for taken in ("fam", "fam-1", "solo-1"):  # the parent of samples in flight, or in flight
        with pytest.raises(ValueError, match="duplicate request id"):
            tm._register(_state(taken))
    with pytest.raises(ValueError, match="duplicate request id 'solo-1'"):
        tm._register(_state("solo-1-0", "solo-1"))  # a sample whose parent is a plain request
    assert tm.abort_request("solo", with_samples=True) is False  # solo-1 is no sample of it
    assert tm.abort_request("fam", with_samples=True) is True
    assert [m.rid for m in tm.send_to_scheduler.sent] == ["solo", "fam", "fam-0", "fam-1"]
    for state in samples:
        assert tm._unregister(state) and not tm._unregister(state)
    tm._register(_state("fam"))  # free again once the samples are done
    with pytest.raises(ValueError) as refused:
        tm._register(_state("fam"))
    assert refused.value.param == "rid"  # the 400 names the field


def test_abort_all_aborts_every_request_and_wait_idle_sees_them_end():
    tm = _bare_manager()
    states = [_state("a"), _state("b-0", "b"), _state("left")]
    for state in states:
        tm._register(state)
    states[2].abandoned_at = 0.0  # its caller left: being aborted already, not counted
    assert tm.abort_all() == 2
    assert sorted(m.rid for m in tm.send_to_scheduler.sent) == ["a", "b-0", "left"]

    async def run() -> tuple[bool, bool]:
        busy = await tm.wait_idle(0.01)
        for state in states:
            asyncio.get_running_loop().call_soon(tm._unregister, state)
        return busy, await tm.wait_idle(5)

    assert asyncio.run(run()) == (False, True)


def test_a_request_whose_caller_left_is_logged_and_its_rid_held(caplog):
    # --log-requests logged only finished requests: a disconnect left no line
    tm = _bare_manager()
    tm.log_requests = True
    state = _state("gone")
    tm._register(state)
    with caplog.at_level(logging.INFO, logger="sglang.srt.managers.tokenizer_manager"):
        tm._release(state)
    assert any("request gone:" in r.getMessage() and "caller left" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert [m.rid for m in tm.send_to_scheduler.sent] == ["gone"]  # aborted
    with pytest.raises(ValueError, match="still being aborted"):
        tm._register(_state("gone"))


def test_one_malformed_output_fails_its_request_and_aborts_it():
    async def run() -> None:
        tm = _bare_manager()
        for rid in ("bad", "good"):
            tm.rid_to_state[rid] = ReqState(
                obj=GenerateReqInput(text="x", rid=rid), prompt_tokens=1
            )
        msg = BatchStrOutput(
            rids=["bad", "good"], new_texts=[None, "hi"], new_output_ids=[[1], [2, 3]],
            finished_reasons=[None, None], prompt_tokens=[1, 1], completion_tokens=[1, 2],
            cached_tokens=[0, 0], queue_times=[None, None],
        )  # fmt: skip
        tm._handle_batch_output(msg)  # "bad" has a None text: += raises inside
        bad, good = tm.rid_to_state["bad"], tm.rid_to_state["good"]
        assert isinstance(error_of_finish(bad.finished_reason), RequestFailedError)
        assert bad.event.is_set() and [m.rid for m in tm.send_to_scheduler.sent] == ["bad"]
        assert good.text == "hi" and good.output_ids == [2, 3] and good.finished_reason is None

    asyncio.run(run())


def test_a_failed_request_raises_with_its_status():
    reason = {"type": "abort", "matched": None, "message": "boom", "status_code": 500}
    with pytest.raises(RequestFailedError, match="boom"):
        raise error_of_finish(reason)
    assert error_of_finish({"type": "abort", "matched": None, "message": "by client"}) is None


def test_the_abort_that_follows_a_failure_does_not_replace_its_error():
    """A request failed here (its output unusable) is aborted in the scheduler, whose
    abort finish can arrive before the waiting coroutine runs: the error must stay."""

    async def run() -> None:
        tm = _bare_manager()
        tm.rid_to_state["bad"] = ReqState(obj=GenerateReqInput(text="x", rid="bad"), prompt_tokens=1)

        def output(text, reason) -> BatchStrOutput:
            return BatchStrOutput(
                rids=["bad"], new_texts=[text], new_output_ids=[[1]], finished_reasons=[reason],
                prompt_tokens=[1], completion_tokens=[1], cached_tokens=[0], queue_times=[None],
            )  # fmt: skip

        tm._handle_batch_output(output(None, None))  # unusable: fails here
        tm._handle_batch_output(output("", {"type": "abort", "message": "Aborted by request."}))
        bad = tm.rid_to_state["bad"]
        assert isinstance(error_of_finish(bad.finished_reason), RequestFailedError)
        assert bad.text == "" and bad.output_ids == []

    asyncio.run(run())


def _scripted_updates(tm: TokenizerManager, replies: list[list[bool]]) -> list:
    """`tm`'s DP ranks answer each weight update with the next row of `replies` (one
    success flag per rank); the (model_path, load_format) of each update is recorded."""
    sent: list = []

    async def control(req: UpdateWeightFromDiskReqInput, _reply_type: type) -> list:
        sent.append((req.model_path, req.load_format))
        return [
            UpdateWeightFromDiskReqOutput(ok, "loaded" if ok else "busy", dp_rank=rank)
            for rank, ok in enumerate(replies.pop(0))
        ]

    tm._control = control
    tm.model_path = "/old"
    tm._base_config, tm._config_updates = {"load_format": "auto"}, {}
    return sent


def test_a_weight_update_only_some_dp_ranks_took_is_rolled_back_on_every_rank():
    tm = _bare_manager()
    sent = _scripted_updates(tm, [[True, False], [True, True]])
    success, message = asyncio.run(tm.update_weights_from_disk("/new"))
    assert not success and sent == [("/new", None), ("/old", "auto")]
    assert message == "DP rank 1: busy; every DP rank serves /old again"
    assert tm.model_path == "/old" and tm.config_value("load_format") == "auto"


def test_a_rollback_that_fails_on_a_rank_says_the_ranks_differ():
    tm = _bare_manager()
    sent = _scripted_updates(tm, [[False, True], [True, False]])
    success, message = asyncio.run(tm.update_weights_from_disk("/new", "safetensors"))
    assert not success and sent == [("/new", "safetensors"), ("/old", "auto")]
    assert message.endswith("rolling back to /old failed on DP ranks 1: ranks now differ")


def test_a_weight_update_every_rank_refused_is_not_rolled_back():
    tm = _bare_manager()
    sent = _scripted_updates(tm, [[False, False]])
    success, _ = asyncio.run(tm.update_weights_from_disk("/new"))
    assert not success and sent == [("/new", None)] and tm.model_path == "/old"


def test_a_weight_update_every_rank_took_is_recorded():
    tm = _bare_manager()
    sent = _scripted_updates(tm, [[True, True]])
    assert asyncio.run(tm.update_weights_from_disk("/new", "safetensors")) == (True, "loaded")
    assert sent == [("/new", "safetensors")] and tm.model_path == "/new"
    assert tm.config_value("load_format") == "safetensors"


def test_a_request_that_comes_during_a_weight_update_waits_for_it():
    tm = _bare_manager()
    _scripted_updates(tm, [[True, True]])
    loaded = asyncio.Event()
    control = tm._control

    async def slow_control(req, reply_type):
        await loaded.wait()
        return await control(req, reply_type)

    tm._control = slow_control

    async def run() -> list[str]:
        events: list[str] = []
        update = asyncio.ensure_future(tm.update_weights_from_disk("/new"))
        await asyncio.sleep(0)  # the update starts, and closes the gate

        async def request() -> None:
            await tm._wait_for_weight_update()
            events.append("request admitted")

        waiting = asyncio.ensure_future(request())
        for _ in range(5):
            await asyncio.sleep(0)
        events.append("weights loaded")
        loaded.set()
        assert (await update)[0] is True
        await waiting
        return events

    assert asyncio.run(run()) == ["weights loaded", "request admitted"]


def _admitting_manager() -> TokenizerManager:
    """A bare manager whose requests tokenize to 3 ids; its weight-update gate closed."""
    tm = _bare_manager()
    tm._check_alive = tm.check_serves_generation = tm._ensure_handle_loop = lambda: None

    async def tokenize(obj):
        return types.SimpleNamespace(input_ids=[1, 2, 3])

    tm._tokenize_off_loop = tokenize
    tm.log_requests = False
    tm._admitting.clear()  # a weight update runs
    return tm


@pytest.mark.parametrize("how", ["rid", "parent", "all"])
def test_a_request_waiting_out_a_weight_update_is_reached_by_an_abort(how):
    """Accepted, not yet at the scheduler: an abort used to miss it (success false) and
    it ran to its end once the update was over."""
    tm = _admitting_manager()
    obj = GenerateReqInput(text="x", rid="late-0", parent_rid="late")

    async def run() -> tuple[object, list[dict]]:
        outputs: list[dict] = []

        async def consume() -> None:
            async for out in tm.generate_request(obj):
                outputs.append(out)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # it waits at the gate
        if how == "all":
            answer = tm.abort_all()
        else:
            answer = tm.abort_request("late-0" if how == "rid" else "late", with_samples=True)
        tm._admitting.set()  # the update ends
        await task
        return answer, outputs

    answer, outputs = asyncio.run(run())
    assert answer == (1 if how == "all" else True)
    assert len(outputs) == 1 and outputs[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert not [m for m in tm.send_to_scheduler.sent if getattr(m, "input_ids", None)]
    assert tm.rid_to_state == {} and tm._pending_rids == {}


def test_abort_all_leaves_the_servers_own_health_probe_alone():
    tm = _bare_manager()
    tm._register(_state("client"))
    tm._register(_state(f"{HEALTH_PROBE_RID_PREFIX}1"))
    assert tm.abort_all() == 1
    assert [m.rid for m in tm.send_to_scheduler.sent] == ["client"]


def test_a_request_the_runtime_refuses_is_logged_once_with_its_outcome(caplog):
    """--log-requests logged finished and aborted requests only: a 429 (queue full) or a
    runtime 400 left no request line."""
    tm = _bare_manager()
    tm.log_requests = True
    state = _state("full")
    tm._register(state)
    state.finished_reason = {"type": "abort", "matched": None, "message": "queue is full",
                             "status_code": 429}  # fmt: skip
    state.event.set()

    async def run() -> None:
        async for _ in tm._wait_outputs(state):
            pass

    with caplog.at_level(logging.INFO, logger="sglang.srt.managers.tokenizer_manager"):
        with pytest.raises(RequestFailedError, match="queue is full"):
            asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if "request full:" in r.getMessage()]
    assert len(lines) == 1 and "queue is full" in lines[0]


def test_a_text_the_tokenizer_encodes_past_the_models_vocabulary_names_text():
    # a --tokenizer-path whose added tokens lie past the model's vocabulary: the 400
    # named input_ids, which the request did not send
    tm = _bare_manager()
    tm.tokenizer = types.SimpleNamespace(encode=lambda text: [3, 9000, 4])
    tm.model_config = types.SimpleNamespace(vocab_size=8192)
    tm.allow_auto_truncate = False
    tm.context_len, tm._max_token_chars = 64, 16
    with pytest.raises(InvalidParamError, match="does not match the model") as refused:
        tm._input_ids(GenerateReqInput(text="hi <think>"))
    assert refused.value.param == "text" and "9000" in str(refused.value)
    with pytest.raises(InvalidParamError, match=r"token ids in \[0, 8192\)") as refused:
        tm._input_ids(GenerateReqInput(input_ids=[3, 9000]))
    assert refused.value.param == "input_ids"


def test_a_tokenizer_larger_than_the_vocabulary_is_named_at_start_up(caplog):
    from sglang.srt.managers.tokenizer_manager import _warn_if_tokenizer_outgrows

    with caplog.at_level(logging.WARNING):
        _warn_if_tokenizer_outgrows([0] * 8196, 8192)
        _warn_if_tokenizer_outgrows([0] * 8000, 8192)  # a padded vocabulary is fine
    assert [r.message for r in caplog.records if "tokenizer has" in r.message] == [
        "the tokenizer has 8196 tokens, the model's vocabulary 8192: a prompt that encodes "
        "to an id past it is refused (does --tokenizer-path match the model?)"
    ]


def test_a_requests_logprob_entries_are_bounded_over_its_choices():
    # 4,000 input positions x (1 + 100 + 1024) alternatives x n=8, each field within its
    # own limit: the answer took the launcher past 5.8 GB and /health 17 s
    from sglang.srt.managers.io_struct import (
        MAX_LOGPROB_ENTRIES_PER_REQUEST,
        share_logprob_budget,
    )

    tm = _bare_manager()
    tm.context_len = 4096
    params = types.SimpleNamespace(max_new_tokens=1)

    def choice(**fields) -> tuple[GenerateReqInput, types.SimpleNamespace]:
        obj = GenerateReqInput(input_ids=[5] * 4000, return_logprob=True, **fields)
        return obj, types.SimpleNamespace(input_ids=obj.input_ids, sampling_params=params,
                                          logprob_start_len=obj.logprob_start_len)  # fmt: skip

    heavy = {"logprob_start_len": 0, "top_logprobs_num": 100, "token_ids_logprob": list(range(1024))}
    objs = [choice(**heavy) for _ in range(8)]
    share_logprob_budget([obj for obj, _ in objs])
    with pytest.raises(InvalidParamError, match="more than 2,097,152 logprob entries") as refused:
        for obj, tokenized in objs:
            tm._charge_logprobs(obj, tokenized)
    assert refused.value.param == "return_logprob"
    # an evaluation's input logprobs (top 5 over the whole prompt), n = 1: charged, served
    obj, tokenized = choice(logprob_start_len=0, top_logprobs_num=5)
    tm._charge_logprobs(obj, tokenized)
    assert obj.logprob_budget is None  # its own budget: nothing shared to draw down
    # 1,024 token ids over 4,000 positions is 4.1M entries even at n = 1 (1.3 GB there)
    assert 4001 * 1025 > MAX_LOGPROB_ENTRIES_PER_REQUEST
    obj, tokenized = choice(logprob_start_len=0, token_ids_logprob=list(range(1024)))
    with pytest.raises(InvalidParamError, match="logprob entries"):
        tm._charge_logprobs(obj, tokenized)
