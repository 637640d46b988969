"""Issue 9, part 1: admission and decode-fit checks count whole KV pages."""

from __future__ import annotations

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import (
    NewTokenRatio,
    PrefillBudget,
    decode_need,
    page_span,
    pick_retractions,
)
from sglang.srt.sampling.sampling_params import SamplingParams


def running_req(n_in: int, n_out: int, max_new: int = 16) -> Req:
    req = Req("r", list(range(n_in)), SamplingParams(max_new_tokens=max_new))
    req.output_ids = [1] * n_out
    req.kv_len = n_in + n_out - 1
    return req


def test_page_span_rounds_to_whole_pages_and_uses_the_last_page_tail():
    assert page_span(0, 5, 1) == 5
    assert page_span(0, 5, 4) == 8
    assert page_span(0, 8, 4) == 8
    assert page_span(5, 8, 4) == 0  # the tail of the page holding position 4
    assert page_span(5, 10, 4) == 4
    assert page_span(8, 9, 4) == 4
    assert page_span(7, 7, 4) == 0


def test_budget_charges_pages_not_tokens():
    # 8 pages of 4 slots: six 5-token prompts need 2 pages each, so 4 fit, not 6.
    budget = PrefillBudget(
        rem_total_tokens=32,
        rem_input_tokens=1000,
        rem_chunk_tokens=None,
        rem_running_slots=16,
        page_size=4,
        has_running=False,
    )
    granted = [budget.grant(5, reserve_output=0) for _ in range(6)]
    assert granted == [5, 5, 5, 5, None, None]


def test_budget_counts_a_held_prefix_page_tail():
    budget = PrefillBudget(
        rem_total_tokens=4,
        rem_input_tokens=1000,
        rem_chunk_tokens=None,
        rem_running_slots=16,
        page_size=4,
    )
    # positions [6, 10): 2 in the prefix's last page, 2 in one new page
    assert budget.grant(4, reserve_output=0, prefix_len=6) == 4
    assert budget.rem_total_tokens == 0


def test_alone_request_admitted_without_reserve_only_if_its_pages_fit():
    budget = PrefillBudget(
        rem_total_tokens=8,
        rem_input_tokens=1000,
        rem_chunk_tokens=None,
        rem_running_slots=16,
        page_size=4,
        has_running=False,
    )
    assert budget.grant(9, reserve_output=0) is None  # 3 pages > 2
    assert budget.grant(7, reserve_output=100) == 7


def test_decode_need_and_reserve_in_pages():
    at_boundary, mid_page = running_req(4, 1), running_req(5, 1)  # kv_len 4 / 5
    assert decode_need([at_boundary, mid_page], 1) == 2
    assert decode_need([at_boundary, mid_page], 4) == 4
    ratio = NewTokenRatio()
    ratio.value = 1.0
    req = running_req(4, 1, max_new=5)  # 4 tokens still to come from kv_len 4
    assert ratio.reserve([req]) == 4
    assert ratio.reserve([req], page_size=4) == 4
    assert ratio.reserve([running_req(3, 1, max_new=5)], page_size=4) == 4  # 3 + 4 -> page 2


def test_pick_retractions_counts_freed_pages():
    reqs = [running_req(5, 1), running_req(5, 2), running_req(5, 3)]
    # each holds 2 pages (kv_len 5..7); retracting one frees 8 slots
    assert len(pick_retractions(reqs, need_tokens=8, free_tokens=0, page_size=4)) == 1
