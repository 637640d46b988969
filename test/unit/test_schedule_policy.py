from __future__ import annotations

import pytest

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import (
    PREFIX_POLICY_MAX_WAIT_S,
    NewTokenRatio,
    PrefillBudget,
    SchedulePolicy,
    pick_retractions,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, resolution_result


def make_req(rid: str, n_in: int = 4, n_out: int = 0, max_new: int = 16) -> Req:
    req = Req(rid, list(range(n_in)), SamplingParams(max_new_tokens=max_new))
    req.output_ids = [1] * n_out
    req.kv_len = n_in + n_out - 1 if n_out else 0
    return req


class Node:
    def __init__(self, parent=None):
        self.parent = parent


def test_fcfs_keeps_order_and_random_is_a_permutation():
    reqs = [make_req(str(i)) for i in range(10)]
    assert SchedulePolicy("fcfs").order(reqs, lambda r: (0, None)) == reqs
    shuffled = SchedulePolicy("random", seed=3).order(reqs, lambda r: (0, None))
    assert sorted(r.rid for r in shuffled) == sorted(r.rid for r in reqs)


def test_lpm_puts_longest_prefix_first():
    reqs = [make_req("a"), make_req("b"), make_req("c")]
    lens = {"a": 1, "b": 9, "c": 4}
    ordered = SchedulePolicy("lpm").order(reqs, lambda r: (lens[r.rid], None))
    assert [r.rid for r in ordered] == ["b", "c", "a"]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_a_request_waiting_past_the_bound_goes_first_under_prefix_policies(policy):
    # a prompt no cached prefix matches must not starve behind requests sharing one
    reqs = [make_req("cached-1"), make_req("cold"), make_req("cached-2"), make_req("old")]
    lens = {"cached-1": 9, "cold": 0, "cached-2": 9, "old": 0}
    reqs[3].arrival_time_s -= PREFIX_POLICY_MAX_WAIT_S + 1
    reqs[1].arrival_time_s -= PREFIX_POLICY_MAX_WAIT_S + 2  # came before "old"
    node = Node()
    ordered = SchedulePolicy(policy).order(reqs, lambda r: (lens[r.rid], node))
    assert [r.rid for r in ordered][:2] == ["cold", "old"]
    assert {r.rid for r in ordered} == {r.rid for r in reqs}


def test_waiting_is_measured_at_the_schedulers_step_time_not_each_ranks_clock():
    # under TP every rank orders the queue: each read its own clock, and a rank that
    # ran late moved a request first that the others did not (a collective mismatch)
    reqs = [make_req("cached"), make_req("cold")]
    lens = {"cached": 9, "cold": 0}
    reqs[0].arrival_time_s, reqs[1].arrival_time_s = 1003.0, 1000.0  # long ago, by the clock
    order = SchedulePolicy("lpm").order
    before = order(reqs, lambda r: (lens[r.rid], None), 1000.0 + PREFIX_POLICY_MAX_WAIT_S - 1)
    after = order(reqs, lambda r: (lens[r.rid], None), 1000.0 + PREFIX_POLICY_MAX_WAIT_S + 1)
    assert [r.rid for r in before] == ["cached", "cold"]  # by prefix: nobody overdue yet
    assert [r.rid for r in after] == ["cold", "cached"]  # "cold" waited past the bound


def test_dfs_weight_groups_requests_of_the_heavier_subtree():
    root = Node()
    heavy, light = Node(root), Node(root)
    nodes = {"a": light, "b": heavy, "c": heavy, "d": light, "e": heavy}
    reqs = [make_req(k) for k in "abcde"]
    ordered = SchedulePolicy("dfs-weight").order(reqs, lambda r: (0, nodes[r.rid]))
    assert [r.rid for r in ordered] == ["b", "c", "e", "a", "d"]


def test_dfs_weight_admits_requests_matched_to_no_node():
    # without a radix cache no request matches a node: all are still admitted, in order
    # (the queue never ran: every step admitted nothing)
    reqs = [make_req(k) for k in "abc"]
    ordered = SchedulePolicy("dfs-weight").order(reqs, lambda r: (0, None))
    assert [r.rid for r in ordered] == ["a", "b", "c"]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_prefix_policies_without_a_radix_cache_run_fcfs(policy):
    # resolved in the config, so /server_info shows the fcfs that runs (it showed lpm)
    def resolved(**fields):
        args = ServerArgs(model_path="org/m", device="cpu", schedule_policy=policy, **fields)
        return resolution_result(args.resolve_once(), "schedule_policy")

    assert resolved(disable_radix_cache=True) == "fcfs"
    assert resolved() == policy
    random_policy = ServerArgs(model_path="org/m", device="cpu", schedule_policy="random",
                               disable_radix_cache=True).resolve_once()  # fmt: skip
    assert resolution_result(random_policy, "schedule_policy") == "random"


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown schedule policy"):
        SchedulePolicy("lifo")


def test_budget_chunks_and_stops():
    budget = PrefillBudget(
        rem_total_tokens=1000, rem_input_tokens=1000, rem_chunk_tokens=16, rem_running_slots=8
    )
    assert budget.grant(10, reserve_output=5) == 10
    assert budget.grant(40, reserve_output=5) == 6  # the chunk's remainder
    assert budget.stopped and budget.grant(1, 0) is None


def test_budget_refuses_what_does_not_fit():
    budget = PrefillBudget(
        rem_total_tokens=50, rem_input_tokens=1000, rem_chunk_tokens=None, rem_running_slots=8
    )
    assert budget.grant(40, reserve_output=20) is None
    assert budget.grant(20, reserve_output=20) == 20
    budget = PrefillBudget(
        rem_total_tokens=10**6, rem_input_tokens=100, rem_chunk_tokens=None, rem_running_slots=1
    )
    assert budget.grant(500, 0) == 500  # a first request may exceed max_prefill_tokens
    assert budget.grant(1, 0) is None  # no running slot left


def test_page_aligned_chunks():
    budget = PrefillBudget(
        rem_total_tokens=1000,
        rem_input_tokens=1000,
        rem_chunk_tokens=10,
        rem_running_slots=8,
        page_size=4,
    )
    assert budget.grant(30, 0) == 8


@pytest.mark.parametrize("chunk", [8, 15])  # below the page; a mixed batch's reduced 16
def test_a_chunk_budget_under_a_page_still_grants_the_first_prompt_a_page(chunk):
    # aligned down to 0 tokens, the prompt was never admitted: the server hung (chunk 8
    # with page 16), or a new prompt waited for every running request (mixed, 16 / 16)
    def budget():
        return PrefillBudget(rem_total_tokens=1000, rem_input_tokens=1000,
                             rem_chunk_tokens=chunk, rem_running_slots=8, page_size=16)  # fmt: skip

    first = budget()
    assert first.grant(40, 0) == 16
    assert first.grant(40, 0) is None  # the batch is full: one page a batch
    assert budget().grant(5, 0) == 5  # a prompt shorter than a page fits whole


def test_new_token_ratio_decays_and_resets():
    ratio = NewTokenRatio(1.0, decay_steps=10)
    start = ratio.value
    for _ in range(100):
        ratio.decay()
    assert ratio.value == pytest.approx(ratio.min)
    ratio.on_retract()
    assert ratio.value == start
    assert ratio.reserve([make_req("a", max_new=100)]) == int(100 * start)


def test_a_request_only_its_length_can_end_is_reserved_in_full():
    """ignore_eos with no stop or grammar takes every remaining token: admission must
    not over-admit on the decaying ratio and retract later (lost work)."""
    ratio = NewTokenRatio(1.0, decay_steps=10)
    for _ in range(100):
        ratio.decay()
    bound = Req("a", [1, 2], SamplingParams(max_new_tokens=100, ignore_eos=True))
    assert bound.ends_by_length_only
    assert ratio.reserve([bound]) == 100
    assert ratio.reserve([make_req("b", max_new=100)]) == int(100 * ratio.min)
    for params in (
        SamplingParams(max_new_tokens=100, ignore_eos=True, stop_token_ids=[3]),
        SamplingParams(max_new_tokens=100, ignore_eos=True, stop=["x"]),
        SamplingParams(max_new_tokens=100, ignore_eos=True, regex="a+"),
    ):
        params.normalize()
        assert not Req("c", [1], params).ends_by_length_only
        assert ratio.reserve([Req("c", [1], params)]) == int(100 * ratio.min)


def test_pick_retractions_prefers_least_progress_and_keeps_one():
    reqs = [
        make_req("a", n_in=10, n_out=5),
        make_req("b", n_in=50, n_out=1),
        make_req("c", n_in=10, n_out=1),
    ]
    victims = pick_retractions(reqs, need_tokens=3, free_tokens=0)
    assert victims[0].rid == "b"
    assert len(pick_retractions(reqs, need_tokens=10**6, free_tokens=0)) == 2


def test_a_lone_request_is_admitted_without_its_output_reserve():
    budget = PrefillBudget(
        rem_total_tokens=50,
        rem_input_tokens=1000,
        rem_chunk_tokens=None,
        rem_running_slots=8,
        has_running=False,
    )
    assert budget.grant(40, reserve_output=100) == 40
    assert budget.grant(5, reserve_output=100) is None
