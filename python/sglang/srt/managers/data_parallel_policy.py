"""Which DP rank serves a request: the data-parallel controller's routing policies.

Pure: no I/O, no clocks. The controller feeds each rank's `LoadReport` to
`on_report` and asks `route(input_ids)` for every new request; `route` also
counts the request as sent to the rank it picked, so requests routed between two
reports are not all sent to the rank that looked idlest at the last report.

    round_robin     rank 0, 1, ..., dp_size - 1, 0, ...
    shortest_queue  fewest requests (running + queued + sent but not yet received),
                    then most free KV tokens, then the lowest rank
    prefix_aware    the rank whose prefix cache holds the longest prefix of the
                    prompt, unless that rank is more than `max_imbalance_reqs`
                    requests busier than the idlest; no cached prefix (or a tie)
                    falls back to shortest_queue

The controller cannot see the schedulers' radix trees, so `prefix_aware` keeps an
approximate copy per rank (as SGLang's router does): the prompts it routed there,
as chained hashes of whole `block_size`-token blocks, evicted least recently used
once a rank's copy holds as many tokens as that rank's KV pool. A prompt shorter
than one block never matches.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sglang.srt.managers.io_struct import LoadReport

LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "prefix_aware")


def is_new_request(msg: object) -> bool:
    """A new request (generate, embed) carries its prompt's `input_ids` and goes to
    one DP rank; every other message (abort, control) goes to all of them."""
    return isinstance(getattr(msg, "input_ids", None), list)


@dataclass
class RankLoad:
    """What the controller knows of one DP rank's load."""

    num_running_reqs: int = 0
    num_queued_reqs: int = 0
    num_free_kv_tokens: int = 0
    max_total_num_tokens: int = 0
    num_sent_reqs: int = 0  # routed to this rank by the controller
    num_received_reqs: int = 0  # taken off its input queue, as of its last report

    @property
    def num_reqs(self) -> int:
        """Running + queued + sent since the last report (still in the pipe)."""
        in_pipe = max(self.num_sent_reqs - self.num_received_reqs, 0)
        return self.num_running_reqs + self.num_queued_reqs + in_pipe


class LoadBalancer:
    """Base of the policies: load bookkeeping; subclasses implement `choose`."""

    def __init__(self, dp_size: int) -> None:
        assert dp_size >= 1
        self.dp_size = dp_size
        self.loads = [RankLoad() for _ in range(dp_size)]

    def route(self, input_ids: list[int]) -> int:
        rank = self.choose(input_ids)
        self.loads[rank].num_sent_reqs += 1
        return rank

    def choose(self, input_ids: list[int]) -> int:
        raise NotImplementedError

    def on_report(self, report: LoadReport) -> None:
        load = self.loads[report.dp_rank]
        load.num_running_reqs = report.num_running_reqs
        load.num_queued_reqs = report.num_queued_reqs
        load.num_free_kv_tokens = report.num_free_kv_tokens
        load.max_total_num_tokens = report.max_total_num_tokens
        load.num_received_reqs = report.num_received_reqs

    def shortest_queue(self, ranks: range | list[int] | None = None) -> int:
        candidates = range(self.dp_size) if ranks is None else ranks
        return min(
            candidates, key=lambda r: (self.loads[r].num_reqs, -self.loads[r].num_free_kv_tokens, r)
        )


class RoundRobin(LoadBalancer):
    def __init__(self, dp_size: int) -> None:
        super().__init__(dp_size)
        self._next = 0

    def choose(self, input_ids: list[int]) -> int:
        rank, self._next = self._next, (self._next + 1) % self.dp_size
        return rank


class ShortestQueue(LoadBalancer):
    def choose(self, input_ids: list[int]) -> int:
        return self.shortest_queue()


class PrefixIndex:
    """One rank's approximate prefix cache: chained block hashes, LRU-evicted.

    A hash stands for the whole prefix up to the end of its block, so a prompt's
    match length is the number of its leading block hashes present here.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.capacity_blocks: int | None = None  # None until the rank reports its pool
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match_len(self, hashes: list[int]) -> int:
        """Tokens of the prompt (whole blocks) this rank is believed to hold."""
        num_blocks = 0
        for h in hashes:
            if h not in self._blocks:
                break
            num_blocks += 1
        return num_blocks * self.block_size

    def insert(self, hashes: list[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        if self.capacity_blocks is not None:
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)


def prefix_block_hashes(input_ids: list[int], block_size: int) -> list[int]:
    """hash_k covers tokens [0, (k + 1) * block_size): chained, so equal only for
    equal prefixes (up to 64-bit collisions)."""
    hashes, h = [], 0
    for start in range(0, len(input_ids) - block_size + 1, block_size):
        h = hash((h, *input_ids[start : start + block_size]))
        hashes.append(h)
    return hashes


class PrefixAware(LoadBalancer):
    def __init__(self, dp_size: int, block_size: int = 32, max_imbalance_reqs: int = 32) -> None:
        super().__init__(dp_size)
        self.block_size = block_size
        self.max_imbalance_reqs = max_imbalance_reqs
        self.indexes = [PrefixIndex(block_size) for _ in range(dp_size)]

    def choose(self, input_ids: list[int]) -> int:
        hashes = prefix_block_hashes(input_ids, self.block_size)
        rank = self._choose(hashes)
        self.indexes[rank].insert(hashes)
        return rank

    def _choose(self, hashes: list[int]) -> int:
        idlest = self.shortest_queue()
        matches = [index.match_len(hashes) for index in self.indexes]
        best = max(matches)
        if best == 0:
            return idlest
        holders = [r for r, m in enumerate(matches) if m == best]
        rank = self.shortest_queue(holders)
        if self.loads[rank].num_reqs - self.loads[idlest].num_reqs > self.max_imbalance_reqs:
            return idlest
        return rank

    def on_report(self, report: LoadReport) -> None:
        super().on_report(report)
        if report.max_total_num_tokens > 0:
            capacity = max(report.max_total_num_tokens // self.block_size, 1)
            self.indexes[report.dp_rank].capacity_blocks = capacity


def make_load_balancer(method: str, dp_size: int) -> LoadBalancer:
    policies = {
        "round_robin": RoundRobin,
        "shortest_queue": ShortestQueue,
        "prefix_aware": PrefixAware,
    }
    if method not in policies:
        raise ValueError(f"load_balance_method={method!r}; choose one of {LOAD_BALANCE_METHODS}")
    return policies[method](dp_size)
