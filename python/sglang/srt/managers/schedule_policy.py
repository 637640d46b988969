"""Admission policy: the order of the waiting queue and the prefill budget.

Pure decisions over numbers and request fields; no I/O, no allocation.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.srt.arg_groups.schedule import PREFIX_POLICIES
from sglang.srt.managers.schedule_batch import Req

logger = logging.getLogger(__name__)

POLICIES = ("fcfs", "lpm", "dfs-weight", "random")
# Past this queue length, prefix-aware orderings cost more than they save.
PREFIX_POLICY_MAX_QUEUE = 128
# Under a prefix-aware policy a request that has waited this long goes ahead of the
# prefix order (first come first): a prompt no cached prefix matches is not starved
# by a stream of requests that share one.
PREFIX_POLICY_MAX_WAIT_S = 5.0



class SchedulePolicy:
    """Orders the waiting queue. Prefix-aware policies take a `match_len(req)` callback."""

    def __init__(self, policy: str, seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule policy {policy!r}; choose from {POLICIES}")
        self.policy = policy
        self.rng = random.Random(seed)

    def order(
        self,
        waiting: list[Req],
        match: Callable[[Req], tuple[int, Any]],
        now_s: float | None = None,
    ) -> list[Req]:
        """A new list: the admission order for this step (stable within ties). `now_s`:
        the step's time.monotonic() (the scheduler's, the same on every TP rank)."""
        policy = self.policy
        if policy in PREFIX_POLICIES and len(waiting) > PREFIX_POLICY_MAX_QUEUE:
            policy = "fcfs"
        if policy == "fcfs":
            return list(waiting)
        if policy == "random":
            out = list(waiting)
            self.rng.shuffle(out)
            return out
        matches = {id(r): match(r) for r in waiting}
        if policy == "lpm":
            ordered = sorted(waiting, key=lambda r: -matches[id(r)][0])
        else:
            ordered = _dfs_weight_order(waiting, {k: v[1] for k, v in matches.items()})
        return _waited_long_first(ordered, waiting, time.monotonic() if now_s is None else now_s)


def _waited_long_first(ordered: list[Req], waiting: list[Req], now: float) -> list[Req]:
    """`ordered`, with the requests waiting past PREFIX_POLICY_MAX_WAIT_S at `now` moved
    to the front in arrival order."""
    overdue = [r for r in waiting if now - r.arrival_time_s > PREFIX_POLICY_MAX_WAIT_S]
    if not overdue:
        return ordered
    moved = {id(r) for r in overdue}
    return overdue + [r for r in ordered if id(r) not in moved]


def _dfs_weight_order(waiting: list[Req], last_nodes: dict[int, Any]) -> list[Req]:
    """Walk the prefix tree, heaviest subtree (most waiting requests) first."""
    weight: dict[int, int] = {}
    children: dict[int, list[Any]] = {}
    by_node: dict[int, list[Req]] = {}
    roots: list[Any] = []
    for req in waiting:
        node = last_nodes[id(req)]
        by_node.setdefault(id(node), []).append(req)
        while node is not None:
            first_visit = id(node) not in weight
            weight[id(node)] = weight.get(id(node), 0) + 1
            parent = getattr(node, "parent", None)
            if first_visit:
                (children.setdefault(id(parent), []) if parent is not None else roots).append(node)
            node = parent
    out: list[Req] = []
    stack = sorted(roots, key=lambda n: weight[id(n)])
    while stack:
        node = stack.pop()
        out.extend(by_node.get(id(node), []))
        stack.extend(sorted(children.get(id(node), []), key=lambda n: weight[id(n)]))
    # a request matched to no node (no cache to match) is still admitted, last
    return out + by_node.get(id(None), [])


def page_span(start: int, end: int, page_size: int = 1) -> int:
    """KV slots the allocator hands out for positions [start, end) of a request
    that already holds [0, start): whole pages, the tail of its last page first."""
    if end <= start:
        return 0
    if page_size == 1:
        return end - start
    return (-(-end // page_size) - -(-start // page_size)) * page_size


@dataclass
class PrefillBudget:
    """What one prefill batch may still take (all in tokens unless named).

    KV is charged in whole pages (`page_span`): with page_size > 1 a request of
    5 tokens takes 8 slots of a 4-slot-page pool, and admission must not
    promise what the allocator cannot give."""

    rem_total_tokens: int  # free + evictable KV, minus what running requests will need
    rem_input_tokens: int  # max_prefill_tokens left
    rem_chunk_tokens: int | None  # chunked_prefill_size left; None = no chunking
    rem_running_slots: int  # max_running_requests minus running and admitted
    page_size: int = 1
    # With nothing running, a request that fits without its output reserve is
    # admitted anyway (else it would wait forever); retraction covers the rest.
    has_running: bool = True
    stopped: bool = False
    num_admitted: int = 0

    def grant(self, extend_len: int, reserve_output: int, prefix_len: int = 0) -> int | None:
        """Tokens of this request to compute now (< extend_len: a chunk), or None.

        `prefix_len` is what the request already holds KV for (its pages are
        paid for). None means the request does not fit; the caller stops admitting."""
        if self.stopped or self.rem_running_slots <= 0:
            return None
        granted = extend_len
        if self.rem_chunk_tokens is not None and granted > self.rem_chunk_tokens:
            granted = self._aligned(self.rem_chunk_tokens)
            if granted <= 0 and self.num_admitted == 0:
                # A chunk budget under one page (a chunk size below the page size, or a
                # mixed batch's reduced one): the batch's first prompt still gets a page,
                # else it would wait forever.
                granted = min(self.page_size, extend_len)
        if granted <= 0:
            return None
        truncated = granted < extend_len
        end = prefix_len + granted
        need = page_span(prefix_len, end + (0 if truncated else reserve_output), self.page_size)
        if need > self.rem_total_tokens:
            alone = not self.has_running and self.num_admitted == 0
            need = page_span(prefix_len, end, self.page_size)
            if not alone or need > self.rem_total_tokens:
                return None
        if granted > self.rem_input_tokens and self.num_admitted > 0:
            return None
        self._charge(granted, need, truncated)
        return granted

    def charge_locked(self, num_tokens: int) -> None:
        """Evictable tokens that became locked (a matched prefix) are no longer free."""
        self.rem_total_tokens -= num_tokens

    def _charge(self, granted: int, need: int, truncated: bool) -> None:
        self.rem_total_tokens -= need
        self.rem_input_tokens -= granted
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= granted
        self.rem_running_slots -= 1
        self.num_admitted += 1
        if truncated or self.rem_input_tokens <= 0:
            self.stopped = True

    def _aligned(self, n: int) -> int:
        return n // self.page_size * self.page_size


class NewTokenRatio:
    """Fraction of a running request's remaining max_new_tokens assumed still needed.

    Starts optimistic-but-safe, decays each decode step, and jumps back up after
    a retraction (memory ran short, so the estimate was too low).
    """

    def __init__(self, conservativeness: float = 1.0, decay_steps: int = 600) -> None:
        self.init = min(0.7 * conservativeness, 1.0)
        self.min = min(0.1 * conservativeness, self.init)
        self.step = (self.init - self.min) / decay_steps
        self.value = self.init

    def decay(self) -> None:
        self.value = max(self.value - self.step, self.min)

    def on_retract(self) -> None:
        self.value = self.init

    def reserve(self, reqs: list[Req], page_size: int = 1) -> int:
        """KV slots the running requests are assumed to still take (whole pages): all of
        the remaining tokens of one that only its length can end, the ratio of the rest's."""
        if page_size == 1:
            return sum(self._expected(r) for r in reqs)
        return sum(page_span(r.kv_len, r.kv_len + self._expected(r), page_size) for r in reqs)

    def _expected(self, req: Req) -> int:
        if req.ends_by_length_only:
            return req.remaining_new_tokens()
        return int(req.remaining_new_tokens() * self.value)


def decode_need(reqs: list[Req], page_size: int = 1) -> int:
    """KV slots one decode step of `reqs` takes: a new page for each request whose
    next position (kv_len) starts one."""
    return sum(page_span(r.kv_len, r.kv_len + 1, page_size) for r in reqs)


def pick_retractions(
    running: list[Req], need_tokens: int, free_tokens: int, page_size: int = 1
) -> list[Req]:
    """Requests to retract so that `need_tokens` fit: fewest outputs, longest inputs first.

    Always keeps at least one request running."""
    order = sorted(running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
    out: list[Req] = []
    for req in order[:-1]:
        if free_tokens >= need_tokens:
            break
        out.append(req)
        free_tokens += page_span(0, req.kv_len, page_size)
        need_tokens -= page_span(req.kv_len, req.kv_len + 1, page_size)
    return out
