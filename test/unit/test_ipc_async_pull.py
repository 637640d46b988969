"""AsyncPullEndpoint: the loop watches a plain socket's (edge-triggered) FD."""

from __future__ import annotations

import asyncio
import os
import pickle
import tempfile
import uuid

import pytest
import zmq

from sglang.srt.managers.ipc import AsyncPullEndpoint, PushEndpoint


@pytest.fixture
def pair():
    ctx = zmq.Context(1)
    address = f"ipc://{tempfile.gettempdir()}/test-async-pull-{uuid.uuid4().hex[:8]}"
    pull, push = AsyncPullEndpoint(ctx, address), PushEndpoint(ctx, address)
    yield pull, push
    push.close()
    pull.close()
    ctx.term()
    os.unlink(address[len("ipc://") :])


def test_messages_sent_before_the_first_recv_arrive_in_order(pair):
    pull, push = pair
    for i in range(50):
        push.send({"i": i})

    async def take(n: int) -> list:
        return [await asyncio.wait_for(pull.recv(), 5) for _ in range(n)]

    assert asyncio.run(take(50)) == [{"i": i} for i in range(50)]


def test_bursts_while_waiting_are_all_delivered(pair):
    pull, push = pair

    async def main() -> list:
        async def produce() -> None:
            for burst in range(20):
                for k in range(5):
                    push.send((burst, k))
                await asyncio.sleep(0.002)

        producer = asyncio.create_task(produce())
        got = [await asyncio.wait_for(pull.recv(), 5) for _ in range(100)]
        await producer
        return got

    assert asyncio.run(main()) == [(b, k) for b in range(20) for k in range(5)]


def test_an_undecodable_message_raises_and_the_next_one_arrives(pair):
    pull, push = pair
    push.send_encoded(b"not a pickle")
    push.send("after")

    async def main() -> str:
        with pytest.raises(pickle.UnpicklingError):
            await asyncio.wait_for(pull.recv(), 5)
        return await asyncio.wait_for(pull.recv(), 5)

    assert asyncio.run(main()) == "after"


def test_a_second_loop_takes_over_after_the_first_closed(pair):
    pull, push = pair
    push.send(1)
    assert asyncio.run(asyncio.wait_for(pull.recv(), 5)) == 1
    push.send(2)
    assert asyncio.run(asyncio.wait_for(pull.recv(), 5)) == 2
