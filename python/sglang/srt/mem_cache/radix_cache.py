"""A radix tree over token ids whose nodes own KV slot indices.

Invariants:
- Every non-root node has a non-empty key; with page_size > 1 every key length
  is a multiple of page_size and children are keyed by their first page.
- `len(node.value) == len(node.key)`; values are int64 slot indices (CPU).
- A node with lock_ref > 0 has all ancestors locked too (locks walk to root).
- evictable_size_ + protected_size_ == sum of len(value) over all nodes, split
  by lock_ref == 0 / > 0.
No I/O here: the scheduler wires this to the allocator and req_to_token pool.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import torch

from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, CacheableReq, MatchResult

_EMPTY = torch.empty((0,), dtype=torch.int64)
_access_clock = itertools.count()


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access")

    def __init__(self, parent: TreeNode | None = None) -> None:
        self.children: dict[Any, TreeNode] = {}
        self.parent = parent
        self.key: list[int] = []
        self.value: torch.Tensor = _EMPTY
        self.lock_ref = 0
        self.last_access = next(_access_clock)

    def touch(self) -> None:
        self.last_access = next(_access_clock)

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


class RadixCache(BasePrefixCache):
    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, page_size: int = 1):
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.reset()

    # ------------------------------------------------------------------ keys

    def _child_key(self, key: list[int]) -> Any:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _aligned_len(self, n: int) -> int:
        return n if self.page_size == 1 else n // self.page_size * self.page_size

    def _match_len(self, a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return self._aligned_len(n)

    # ------------------------------------------------------------------ public

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def match_prefix(self, key: list[int]) -> MatchResult:
        key = key[: self._aligned_len(len(key))]
        values: list[torch.Tensor] = []
        node = self.root
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.touch()
            n = self._match_len(child.key, key)
            if n < len(child.key):
                if n > 0:
                    child = self._split(child, n)
                    values.append(child.value)
                    node = child
                break
            values.append(child.value)
            node = child
            key = key[n:]
        indices = torch.cat(values) if values else _EMPTY
        return MatchResult(device_indices=indices, last_node=node)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Insert `key -> value` (page-aligned lengths); returns how many leading
        tokens were already cached (their slots in `value` are then duplicates)."""
        assert len(key) == len(value) and len(key) == self._aligned_len(len(key))
        node, prefix_len = self.root, 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                self._add_leaf(node, key, value)
                return prefix_len
            child.touch()
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            prefix_len += n
            node, key, value = child, key[n:], value[n:]
        return prefix_len

    def cache_finished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        kv = self._req_slots(req, len(token_ids))
        aligned = self._aligned_len(len(token_ids))
        new_prefix_len = self.insert(token_ids[:aligned], kv[:aligned].clone())
        self._free(kv[req.cache_protected_len : new_prefix_len])
        self._free(kv[aligned:])
        self.dec_lock_ref(req.last_node)
        req.cache_protected_len = 0
        req.last_node = None

    def cache_unfinished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        kv = self._req_slots(req, len(token_ids))
        aligned = self._aligned_len(len(token_ids))
        old_len = req.cache_protected_len
        new_prefix_len = self.insert(token_ids[:aligned], kv[:aligned].clone())
        self._free(kv[old_len:new_prefix_len])
        match = self.match_prefix(token_ids[:aligned])
        assert match.prefix_len == aligned
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        row[old_len:aligned] = match.device_indices[old_len:aligned].to(row.dtype)
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(req.last_node)
        req.cache_protected_len = aligned
        req.last_node = match.last_node

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, "lock ref underflow"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        heap = [n for n in self._all_nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            self._free(leaf.value)
            freed += len(leaf.value)
            self._remove_leaf(leaf)
            parent = leaf.parent
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._all_nodes():
            assert len(node.key) == len(node.value) > 0, "empty or mismatched node"
            assert len(node.key) % self.page_size == 0, "unaligned node"
            assert node.parent.children.get(self._child_key(node.key)) is node, "bad child key"
            assert node.lock_ref >= 0
            if node.lock_ref > 0:
                assert node.parent is self.root or node.parent.lock_ref > 0, "unlocked ancestor"
                protected += len(node.value)
            else:
                evictable += len(node.value)
        assert evictable == self.evictable_size_, (evictable, self.evictable_size_)
        assert protected == self.protected_size_, (protected, self.protected_size_)

    def all_cached_slots(self) -> torch.Tensor:
        values = [n.value for n in self._all_nodes()]
        return torch.cat(values) if values else _EMPTY

    # ------------------------------------------------------------------ internals

    def _req_slots(self, req: CacheableReq, kv_len: int) -> torch.Tensor:
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        return row[:kv_len].to(torch.int64)

    def _free(self, slots: torch.Tensor) -> None:
        if slots.numel() > 0:
            self.allocator.free(slots)

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> None:
        leaf = TreeNode(parent)
        leaf.key, leaf.value = list(key), value
        parent.children[self._child_key(key)] = leaf
        self.evictable_size_ += len(value)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after its first n tokens; returns the new upper node."""
        upper = TreeNode(child.parent)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.parent.children[self._child_key(upper.key)] = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _remove_leaf(self, leaf: TreeNode) -> None:
        del leaf.parent.children[self._child_key(leaf.key)]
        self.evictable_size_ -= len(leaf.value)

    def _all_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
