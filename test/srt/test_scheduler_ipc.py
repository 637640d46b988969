"""ZMQ plumbing and message codec (no model, no child processes)."""

from __future__ import annotations

import dataclasses

import zmq

from sglang.srt.managers import io_struct
from sglang.srt.managers.ipc import PortArgs, PullEndpoint, PushEndpoint, decode, encode


def test_port_args_are_unique_per_launch():
    a, b = PortArgs.init_new(), PortArgs.init_new()
    assert a.tokenizer_ipc_name != b.tokenizer_ipc_name
    assert a.dist_init_method != "" and a.scheduler_input_ipc_name.startswith("ipc://")


def test_every_message_round_trips_through_the_codec():
    from sglang.srt.sampling.sampling_params import SamplingParams

    samples = [
        io_struct.GenerateReqInput(text="hi"),
        io_struct.TokenizedGenerateReqInput("r", None, [1, 2], SamplingParams()),
        io_struct.AbortReq("r"),
        io_struct.BatchTokenIDOutput(
            ["r"], [[1]], [None], [2], [1], [0], [0.25], [io_struct.DecodeParams(stop_strs=("x",))]
        ),
        io_struct.BatchStrOutput(
            ["r"], ["a"], [[1]], [{"type": "stop", "matched": 1}], [2], [1], [0], [None]
        ),
        io_struct.GetInternalStateReqOutput({"a": 1}),
        io_struct.ChildFailed("scheduler", 1, "Traceback ..."),
    ]
    for msg in samples:
        assert dataclasses.asdict(decode(encode(msg))) == dataclasses.asdict(msg)


def test_push_pull_endpoints():
    ctx = zmq.Context(1)
    address = PortArgs.init_new().scheduler_input_ipc_name
    pull = PullEndpoint(ctx, address)
    push = PushEndpoint(ctx, address)
    try:
        assert pull.recv(timeout_ms=10) is None
        push.send(io_struct.AbortReq("x"))
        push.send(io_struct.AbortReq("y"))
        first = pull.recv(timeout_ms=2000)
        rest = []
        for _ in range(50):
            rest += pull.recv_all_nowait()
            if rest:
                break
            pull.socket.poll(20)
        assert [m.rid for m in [first, *rest]] == ["x", "y"]
    finally:
        push.close()
        pull.close()
        ctx.term()


def test_detokenizer_reply_carries_every_per_request_field():
    tok = io_struct.BatchTokenIDOutput(
        ["r"],
        [[1]],
        [None],
        [2],
        [1],
        [0],
        [0.25],
        [None],
        output_token_logprobs=[[(-0.5, 1)]],
    )
    out = io_struct.BatchStrOutput.from_token_output(tok, ["a"])
    assert out.new_texts == ["a"]
    for f in dataclasses.fields(io_struct.BatchStrOutput):
        if f.name != "new_texts":
            assert getattr(out, f.name) == getattr(tok, f.name), f.name
