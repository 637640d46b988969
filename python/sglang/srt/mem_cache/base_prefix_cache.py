"""The prefix-cache seam: what the scheduler may ask of a KV prefix cache.

Vocabulary used by every implementation, for one request `req`:

    positions  [0, req.cache_protected_len)      KV slots owned by the cache,
                                                 pinned by a lock ref on req.last_node
    positions  [req.cache_protected_len, kv_len) KV slots owned by the request
    kv_len = number of leading tokens of the request whose KV is written;
    req_to_token[req.req_pool_idx, :kv_len] holds their slot indices.

The cache never allocates; it frees slots through the allocator's `free`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class CacheableReq(Protocol):
    """The fields of a scheduler request the cache reads and writes."""

    req_pool_idx: int | None
    cache_protected_len: int
    last_node: Any


@dataclass
class MatchResult:
    # int64[prefix_len]: KV slot indices of the matched prefix (CPU).
    device_indices: torch.Tensor
    # The deepest matched node; lock it (inc_lock_ref) to pin the prefix.
    last_node: Any

    @property
    def prefix_len(self) -> int:
        return int(self.device_indices.numel())


class BasePrefixCache(ABC):
    """A cache of KV slots keyed by token prefixes.

    Callers run in the scheduler process only (no locking). The caller must
    hold a lock ref on a node while any request relies on the slots under it.
    """

    @abstractmethod
    def reset(self) -> None:
        """Drop every entry, freeing its slots; only valid with no lock held."""

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of `key` (page-aligned). Mutates only access times
        (and may split a node so the match ends on a node boundary)."""

    @abstractmethod
    def cache_finished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        """Hand a leaving request's KV to the cache (or free it).

        `token_ids` are the request's first kv_len tokens. Frees duplicate and
        unaligned-tail slots, releases the request's lock. Leaves req_pool_idx
        to the caller."""

    @abstractmethod
    def cache_unfinished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        """Cache a running request's computed prefix (chunked prefill).

        Rewrites req_to_token for the newly cached positions to the cache's
        slots, moves the request's lock to the new last node and advances
        `req.cache_protected_len`."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Pin `node` and its ancestors against eviction."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None:
        """Undo one inc_lock_ref."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked entries if possible;
        returns the number freed."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Slots held by the cache and not locked."""

    @abstractmethod
    def protected_size(self) -> int:
        """Slots held by the cache and locked by some request."""

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError when internal bookkeeping is inconsistent."""
