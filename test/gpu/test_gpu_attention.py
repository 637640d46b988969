"""triton and flashinfer attention against torch_native on a GPU (needs CUDA).

Each backend runs on the same random paged pools as torch_native: extend over cached
prefixes of mixed lengths, the speculative verify shape (k + 1 = 4 new tokens per
request), then decode, with GQA, sliding windows and logit caps. Tolerances:
float32 1e-4 (triton only: flashinfer's kernels take half precision), bfloat16
2e-2 absolute and relative (two summation orders over bf16 inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from gpu_cases import has_flashinfer

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
MIXED_PREFIX, MIXED_EXTEND = [0, 1, 7, 19, 0, 300], [5, 33, 1, 4, 40, 70]


@dataclass
class FakeRunner:
    """What the backends read from a ModelRunner."""

    model: torch.nn.Module
    kv_cache_dtype: torch.dtype
    req_to_token_pool: ReqToTokenPool
    device: torch.device = field(default_factory=lambda: torch.device("cuda"))

    @property
    def model_config(self) -> SimpleNamespace:
        return SimpleNamespace(dtype=self.kv_cache_dtype)  # the model dtype = the KV dtype


def make_pools(lens, hkv, d, page_size, dtype, gen):
    """Random pages (never page 0) in random table rows; random K/V."""
    pages_per_req = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per_req) + 3
    kv = MHATokenToKVPool(num_pages * page_size, dtype, hkv, d, 1, "cuda", page_size)
    kv.kv_buffer[0][page_size:] = torch.randn(kv.kv_buffer[0][page_size:].shape, generator=gen).to(
        "cuda", dtype
    )
    table = ReqToTokenPool(len(lens) + 3, max(lens) + page_size, "cuda")
    rows = torch.randperm(table.size, generator=gen)[: len(lens)].tolist()
    pages = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    for row, n, count in zip(rows, lens, pages_per_req):
        mine, pages = torch.tensor(pages[:count]), pages[count:]
        slots = mine.repeat_interleave(page_size) * page_size + torch.arange(page_size).repeat(
            count
        )
        table.req_to_token[row, :n] = slots[:n].to("cuda", torch.int32)
    return table, kv, rows


def make_batch(table, kv, rows, mode, prefix, extend) -> ForwardBatch:
    seq = [p + e for p, e in zip(prefix, extend)]
    t2t = table.req_to_token
    out_loc = torch.cat([t2t[r, p:s] for r, p, s in zip(rows, prefix, seq)]).to(torch.int64)
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]).cuda()
    return ForwardBatch(
        forward_mode=mode, batch_size=len(seq),
        input_ids=torch.zeros(len(positions), dtype=torch.int64, device="cuda"),
        positions=positions, req_pool_indices=torch.tensor(rows, device="cuda"),
        seq_lens=torch.tensor(seq, device="cuda"), out_cache_loc=out_loc, seq_lens_cpu=seq,
        extend_seq_lens_cpu=None if mode.is_decode() else extend,
        extend_prefix_lens_cpu=None if mode.is_decode() else prefix,
        req_to_token_pool=table, token_to_kv_pool=kv,
    )  # fmt: skip


def build_backend(name: str, layer: RadixAttention, dtype: torch.dtype, table: ReqToTokenPool):
    runner = FakeRunner(torch.nn.ModuleList([layer]), dtype, table)
    if name == "torch_native":
        return TorchNativeAttnBackend(runner)
    if name == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(runner)
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend(runner)


def run_both(name: str, fb: ForwardBatch, layer: RadixAttention, dtype, gen) -> None:
    """torch_native, then `name`, on the same batch and pools: outputs agree to TOL."""
    t, hq, hkv, d = len(fb.positions), layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
    q, k, v = (torch.randn(t, h * d, generator=gen).to("cuda", dtype) for h in (hq, hkv, hkv))
    outs = []
    for backend_name in ("torch_native", name):
        backend = build_backend(backend_name, layer, dtype, fb.req_to_token_pool)
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k, v, layer, fb).float())
    torch.testing.assert_close(outs[1], outs[0], atol=TOL[dtype], rtol=TOL[dtype])


def backends_and_dtypes():
    cases = [("triton", torch.float32), ("triton", torch.bfloat16)]
    flashinfer = pytest.mark.skipif(not has_flashinfer(), reason="flashinfer not installed")
    return cases + [pytest.param("flashinfer", torch.bfloat16, marks=flashinfer)]


@pytest.mark.parametrize("name, dtype", backends_and_dtypes())
@pytest.mark.parametrize("hq, hkv, d", [(8, 8, 64), (16, 2, 128), (32, 4, 128)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_then_decode(name, dtype, hq, hkv, d, page_size):
    gen = torch.Generator().manual_seed(hq + d + page_size)
    seq = [p + e for p, e in zip(MIXED_PREFIX, MIXED_EXTEND)]
    table, kv, rows = make_pools([s + 1 for s in seq], hkv, d, page_size, dtype, gen)
    layer = RadixAttention(hq, d, d**-0.5, hkv, 0)
    extend = make_batch(table, kv, rows, ForwardMode.EXTEND, MIXED_PREFIX, MIXED_EXTEND)
    run_both(name, extend, layer, dtype, gen)
    decode = make_batch(table, kv, rows, ForwardMode.DECODE, seq, [1] * len(seq))
    run_both(name, decode, layer, dtype, gen)


@pytest.mark.parametrize("name, dtype", backends_and_dtypes())
def test_verify_shape(name, dtype):
    gen = torch.Generator().manual_seed(5)
    prefix, extend = [3, 17, 300], [4, 4, 4]
    table, kv, rows = make_pools([p + 4 for p in prefix], 2, 128, 1, dtype, gen)
    layer = RadixAttention(16, 128, 128**-0.5, 2, 0)
    run_both(
        name, make_batch(table, kv, rows, ForwardMode.EXTEND, prefix, extend), layer, dtype, gen
    )


@pytest.mark.parametrize("name, dtype", backends_and_dtypes())
@pytest.mark.parametrize("window, cap", [(16, None), (None, 30.0), (40, 5.0)])
def test_window_and_cap(name, dtype, window, cap):
    gen = torch.Generator().manual_seed(9)
    prefix, extend = [0, 25, 90], [40, 3, 12]
    seq = [p + e for p, e in zip(prefix, extend)]
    table, kv, rows = make_pools([s + 1 for s in seq], 2, 64, 1, dtype, gen)
    layer = RadixAttention(8, 64, 0.125, 2, 0, sliding_window_size=window, logit_cap=cap)
    run_both(
        name, make_batch(table, kv, rows, ForwardMode.EXTEND, prefix, extend), layer, dtype, gen
    )
    decode = make_batch(table, kv, rows, ForwardMode.DECODE, seq, [1] * len(seq))
    run_both(name, decode, layer, dtype, gen)
