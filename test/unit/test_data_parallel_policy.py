"""The DP controller's routing policies (pure: no processes, no sockets)."""

from __future__ import annotations

import pytest

from sglang.srt.managers.data_parallel_policy import (
    LOAD_BALANCE_METHODS,
    PrefixAware,
    PrefixIndex,
    RoundRobin,
    ShortestQueue,
    is_new_request,
    make_load_balancer,
    prefix_block_hashes,
)
from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReqInput,
    GetInternalStateReq,
    LoadReport,
    TokenizedGenerateReqInput,
)


def report(rank: int, running: int = 0, queued: int = 0, free: int = 1000, received: int = 0):
    return LoadReport(rank, running, queued, free, 1000, received)


def test_round_robin_cycles_over_ranks():
    policy = RoundRobin(3)
    assert [policy.route([1, 2]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_shortest_queue_picks_fewest_requests_then_most_free_kv():
    policy = ShortestQueue(3)
    policy.on_report(report(0, running=4))
    policy.on_report(report(1, running=1, queued=1))
    policy.on_report(report(2, running=2, free=2000))
    assert policy.route([1]) == 2  # 2 requests on both 1 and 2; rank 2 has more free KV


def test_shortest_queue_counts_requests_sent_since_the_last_report():
    """A burst between reports spreads over the ranks instead of piling on one."""
    policy = ShortestQueue(2)
    assert [policy.route([1]) for _ in range(6)] == [0, 1, 0, 1, 0, 1]
    # rank 0 took its 3 off the queue and finished them; rank 1 has not reported yet
    policy.on_report(report(0, received=3))
    assert policy.route([1]) == 0
    policy.on_report(report(1, running=1, received=3))
    assert policy.loads[1].num_reqs == 1 and policy.route([1]) == 0


def test_prefix_hashes_are_chained_over_whole_blocks():
    a = prefix_block_hashes(list(range(40)), 16)
    b = prefix_block_hashes([*range(16), 99, *range(17, 40)], 16)
    assert len(a) == 2  # the last 8 tokens are no whole block
    assert a[0] == b[0] and a[1] != b[1]
    assert prefix_block_hashes(list(range(15)), 16) == []


def test_prefix_index_matches_leading_blocks_and_evicts_least_recent():
    index = PrefixIndex(block_size=4)
    index.capacity_blocks = 3
    first, second = prefix_block_hashes(list(range(8)), 4), prefix_block_hashes([9] * 8, 4)
    index.insert(first)
    assert index.match_len(prefix_block_hashes(list(range(12)), 4)) == 8
    index.insert(second)  # 4 blocks > 3: first's first block goes, so first no longer matches
    assert len(index) == 3
    assert index.match_len(first) == 0 and index.match_len(second) == 8


def test_prefix_aware_keeps_a_shared_prefix_on_one_rank():
    policy = PrefixAware(2, block_size=4)
    system_a, system_b = list(range(100, 132)), list(range(200, 232))
    ranks_a = [policy.route(system_a + [k]) for k in range(6)]
    ranks_b = [policy.route(system_b + [k]) for k in range(6)]
    assert len(set(ranks_a)) == 1 and len(set(ranks_b)) == 1
    assert ranks_a[0] != ranks_b[0]  # the second prefix went to the idler rank


def test_prefix_aware_falls_back_to_shortest_queue():
    policy = PrefixAware(2, block_size=4, max_imbalance_reqs=2)
    shared = list(range(64))
    assert policy.route(shared) == 0
    policy.on_report(report(0, running=5, received=1))
    assert policy.route(list(range(500, 520))) == 1  # no cached prefix anywhere
    assert policy.route(shared) == 1  # rank 0 holds it but is 5 > 1 + 2 requests busier


def test_prefix_aware_learns_each_ranks_pool_size():
    policy = PrefixAware(2, block_size=4)
    policy.on_report(LoadReport(1, 0, 0, 64, 64, 0))
    assert policy.indexes[1].capacity_blocks == 16 and policy.indexes[0].capacity_blocks is None


def test_make_load_balancer_knows_every_choice_of_the_flag():
    from sglang.srt.server_args import ServerArgs

    choices = ServerArgs.__dataclass_fields__["load_balance_method"].metadata["choices"]
    assert tuple(choices) == LOAD_BALANCE_METHODS
    for method in LOAD_BALANCE_METHODS:
        assert make_load_balancer(method, 2).dp_size == 2
    with pytest.raises(ValueError, match="load_balance_method"):
        make_load_balancer("minimum_tokens", 2)


def test_new_requests_go_to_one_rank_everything_else_to_all():
    req = TokenizedGenerateReqInput(rid="r", input_text=None, input_ids=[1], sampling_params=None)
    assert is_new_request(req)
    for msg in (AbortReq("r"), FlushCacheReqInput(), GetInternalStateReq()):
        assert not is_new_request(msg)
