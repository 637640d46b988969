"""Request-to-token table and the token-slot KV pool.

Slot 0 of the KV pool is reserved as a padding slot: the allocator never hands
it out, and attention reads it for padded key positions (it stays zero).
"""

from __future__ import annotations

import torch

from sglang.srt import huge_pages

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # --kv-cache-dtype fp8_e4m3 / fp8_e5m2


class ReqToTokenPool:
    """`req_to_token[req_idx, pos]` = KV slot of a request's token at position `pos`.

    The scheduler owns the rows: it allocates a row per running request, writes
    the slots of each new token before the forward that computes them, and frees
    the row when the request finishes. The model only reads it.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        # int32[size, max_context_len]
        self.req_to_token = torch.zeros(size, max_context_len, dtype=torch.int32, device=device)
        self.free_slots: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return taken

    def free(self, free_index: int | list[int]) -> None:
        if isinstance(free_index, int):
            self.free_slots.append(free_index)
        else:
            self.free_slots.extend(free_index)

    def write(self, indices, values: torch.Tensor) -> None:
        """indices: (req_idx, slice-or-index) into req_to_token; values: slot ids."""
        self.req_to_token[indices] = values.to(self.device, torch.int32)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class MHATokenToKVPool:
    """Per-layer K and V for every token slot: `[num_slots, num_kv_heads, head_dim]` each.

    Storage is one tensor per layer of shape [num_slots, 2, num_kv_heads, head_dim]
    (K at [:, 0], V at [:, 1]) so attention gathers K and V with one index op.
    `set_kv_buffer` writes slots; the caller (the attention backend during a
    forward) must only write slots the scheduler allocated for this step.
    """

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str,
        page_size: int = 1,
    ) -> None:
        self.size = size  # usable slots; page 0 (slot 0 on) is padding: size + page_size rows
        self.dtype = dtype
        self.head_num, self.head_dim, self.layer_num = head_num, head_dim, layer_num
        self.device = device
        shape = (size + page_size, 2, head_num, head_dim)
        on_cpu = torch.device(device).type == "cpu"
        self.kv_buffer = [
            huge_pages.empty(shape, dtype)
            if on_cpu
            else torch.empty(shape, dtype=dtype, device=device)
            for _ in range(layer_num)
        ]
        for buf in self.kv_buffer:
            buf[0].zero_()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id][:, 0]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id][:, 1]

    def get_kv_buffer(self, layer_id: int) -> torch.Tensor:
        """[num_slots + 1, 2, num_kv_heads, head_dim]."""
        return self.kv_buffer[layer_id]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """loc: int64[T]; k, v: [T, num_kv_heads, head_dim]."""
        kv = torch.stack((k, v), dim=1)
        largest = torch.finfo(self.dtype).max
        if largest < torch.finfo(kv.dtype).max:
            # a pool narrower than the compute (fp8; float16 under float32 / bf16)
            # saturates as the CPU kernel's store does: a value stored as inf would poison
            # every later step over the slot (a K past 65504 made them NaN)
            kv = kv.clamp(-largest, largest)
        if self.dtype in FP8_DTYPES:  # copied as bytes: index_copy_ has no float8 CPU kernel
            kv = kv.to(self.dtype).view(torch.uint8)
            self.kv_buffer[layer_id].view(torch.uint8).index_copy_(0, loc, kv)
            return
        self.kv_buffer[layer_id].index_copy_(0, loc, kv.to(self.dtype))

    @staticmethod
    def bytes_per_token(dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int) -> int:
        return 2 * head_num * head_dim * layer_num * torch.finfo(dtype).bits // 8
