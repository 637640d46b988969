"""Our native CPU kernels (sgl-kernel/csrc/cpu) against torch references.

Each op on small shapes: RMSNorm and fused residual-add + RMSNorm, SiLU-and-mul, neox
rotary (full and partial, strided rows of a fused qkv output), and paged attention read
through req_to_token, decode and small extends over a cached prefix (random page tables
of page size 1 and 4, mixed lengths, GQA 1:1 / 4:1 / 8:1, head_dim 48 / 64 / 128,
sliding windows, logit caps), and long extends (prefill chunks, prompts over a cached
prefix) on the tiled path, fp32 to 1e-5 and bf16 to bf16's precision. Then the layers route decode-sized calls to
the kernels and keep torch ops for large ones and inside `cpu_kernels.disabled()`, and
a build that cannot find its sources falls back to torch ops.

Every op test runs twice: on the build this machine serves with (its AVX-512 or AVX2
vector paths) and on a build of the portable loops only. The first run on a machine
compiles both (about a minute and a half each on 2 cores); later runs load them from
torch's extension cache.
"""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.arg_groups import resolvers
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    HALF_WEIGHT_MAX_ROWS,
    LONG_K,
    PACKED_MAX_ROWS_AVX512,
    SMALL_M_MAX_ROWS,
    ColumnParallelLinear,
    linear,
)
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.layers.sampler import greedy_ids
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

FP32_TOL = 1e-5
NO_EXT = torch.empty(0, dtype=torch.int64)  # decode: one new token per request


@pytest.fixture(scope="module", params=["native", "scalar"])
def kernels(request):
    """Each op test runs on the build this machine serves with (its AVX-512 or AVX2
    vectors) and on the portable loops (-DSGL_FORCE_SCALAR), which CPUs without AVX2
    and aarch64 run."""
    if request.param == "scalar":
        module = cpu_kernels.build_scalar()
        assert module.vector_isa == "scalar" and not module.bf16_dot
        return module
    return _native()


@pytest.fixture(scope="module")
def native_kernels():
    """The build the layers call (routing tests patch its functions)."""
    return _native()


def _native():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels did not build (see the log)"
    return module


def _tol(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"atol": FP32_TOL, "rtol": FP32_TOL}
    return {"atol": 2e-2, "rtol": 2e-2}


def _torch_rmsnorm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 256), (7, 96), (300, 64)])
def test_rmsnorm_matches_torch(kernels, dtype, rows, width):
    x = torch.randn(rows, width, dtype=dtype)
    w = torch.rand(width, dtype=dtype) + 0.5
    out = torch.empty_like(x)
    kernels.rmsnorm_out(out, x, w, 1e-6)
    torch.testing.assert_close(out, _torch_rmsnorm(x, w, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rmsnorm_updates_both_in_place(kernels, dtype):
    x = torch.randn(5, 128, dtype=dtype)
    residual = torch.randn(5, 128, dtype=dtype)
    w = torch.rand(128, dtype=dtype) + 0.5
    summed = x + residual
    expected = _torch_rmsnorm(summed, w, 1e-5)
    kernels.fused_add_rmsnorm_(x, residual, w, 1e-5)
    torch.testing.assert_close(residual, summed, **_tol(dtype))
    torch.testing.assert_close(x, expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(1, 704), (3, 17), (64, 128)])
def test_silu_and_mul_matches_torch(kernels, dtype, rows, d):
    x = torch.randn(rows, 2 * d, dtype=dtype) * 3
    out = x.new_empty(rows, d)
    kernels.silu_and_mul_out(out, x)
    torch.testing.assert_close(out, F.silu(x[:, :d]) * x[:, d:], **_tol(dtype))


@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (128, 1.0), (48, 1.0), (64, 0.5)])
def test_rotary_in_place_on_strided_qkv_rows(kernels, head_dim, partial):
    rope = get_rope(head_dim, 512, 10000.0, None, partial)
    t, hq, hkv = 6, 4, 2
    qkv = torch.randn(t, (hq + 2 * hkv) * head_dim)
    positions = torch.randint(0, 512, (t,))
    qk_width = (hq + hkv) * head_dim
    with cpu_kernels.disabled():
        expected = rope.rotate_heads(positions, qkv[:, :qk_width].clone()).reshape(t, -1)
    v_before = qkv[:, qk_width:].clone()
    qk = qkv[:, :qk_width]  # a strided view: rows of the fused output
    kernels.rotary_neox_(qk, positions, rope.cos_cache, rope.sin_cache, head_dim)
    torch.testing.assert_close(qkv[:, :qk_width], expected, atol=FP32_TOL, rtol=FP32_TOL)
    assert torch.equal(qkv[:, qk_width:], v_before)  # v untouched


def test_rotary_rejects_positions_outside_the_cache(kernels):
    rope = get_rope(64, 16, 10000.0)
    x = torch.randn(1, 64)
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.rotary_neox_(x, torch.tensor([16]), rope.cos_cache, rope.sin_cache, 64)


# -- decode attention ---------------------------------------------------------------------


def _page_table(lens: list[int], page_size: int, gen: torch.Generator):
    """Random page-aligned slots per request: (req_to_token int32[R, L], rows, num_slots)."""
    pages_per_req = [-(-n // page_size) for n in lens]
    total_pages = sum(pages_per_req) + 3
    page_ids = (torch.randperm(total_pages, generator=gen) + 1).tolist()  # page 0: padding
    width = max(lens) + 4
    table = torch.zeros(len(lens) + 2, width, dtype=torch.int32)
    rows = [r + 1 for r in range(len(lens))]
    for b, (n, row) in enumerate(zip(lens, rows)):
        mine = page_ids[sum(pages_per_req[:b]) : sum(pages_per_req[: b + 1])]
        slots = [p * page_size + i for p in mine for i in range(page_size)][:n]
        table[row, :n] = torch.tensor(slots, dtype=torch.int32)
    return table, rows, (total_pages + 1) * page_size


def _reference_decode(q, pool, table, rows, lens, scale, window, cap, hkv):
    """q: [bs, Hq, D] -> [bs, Hq, D], attention over each request's gathered slots."""
    outs = []
    for b, (row, n) in enumerate(zip(rows, lens)):
        kv_len = min(n, window) if window else n
        slots = table[row, n - kv_len : n].long()
        keys = pool[slots, 0].float().transpose(0, 1)  # [Hkv, S, D]
        values = pool[slots, 1].float().transpose(0, 1)
        group = q.shape[1] // hkv
        keys = keys.repeat_interleave(group, 0)
        values = values.repeat_interleave(group, 0)
        scores = torch.einsum("hd,hsd->hs", q[b].float(), keys) * scale
        if cap:
            scores = cap * torch.tanh(scores / cap)
        outs.append(torch.einsum("hs,hsd->hd", scores.softmax(-1), values))
    return torch.stack(outs)


@pytest.mark.parametrize("page_size", [1, 4])
# groups 1, 4, 8 and 3 (a pair of query heads per KV head, then one)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1), (6, 2)])
@pytest.mark.parametrize("head_dim", [48, 64, 128])
def test_decode_attention_reads_the_pool_through_req_to_token(
    kernels, page_size, hq, hkv, head_dim
):
    gen = torch.Generator().manual_seed(hq * 1000 + head_dim * 10 + page_size)
    lens = [1, 37, 5, 64, 13]
    table, rows, num_slots = _page_table(lens, page_size, gen)
    pool = torch.randn(num_slots, 2, hkv, head_dim, generator=gen)
    bs = len(lens)
    qkv = torch.randn(bs, (hq + 2 * hkv) * head_dim, generator=gen)
    q = qkv[:, : hq * head_dim]
    k = qkv[:, hq * head_dim : (hq + hkv) * head_dim]
    v = qkv[:, (hq + hkv) * head_dim :]
    loc = torch.tensor([table[r, n - 1].item() for r, n in zip(rows, lens)], dtype=torch.int64)
    out = q.new_empty(bs, hq * head_dim)
    scale = head_dim**-0.5
    kernels.paged_attention(
        out,
        q,
        k,
        v,
        pool,
        loc,
        table,
        torch.tensor(rows),
        torch.tensor(lens),
        NO_EXT,
        scale,
        0.0,
        0,
        True,
    )
    assert torch.equal(pool[loc, 0], k.reshape(bs, hkv, head_dim))  # the new K/V were written
    assert torch.equal(pool[loc, 1], v.reshape(bs, hkv, head_dim))
    expected = _reference_decode(
        q.view(bs, hq, head_dim), pool, table, rows, lens, scale, 0, 0, hkv
    )
    torch.testing.assert_close(out.view(bs, hq, head_dim), expected, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize("window,cap", [(8, 0.0), (0, 30.0), (3, 5.0)])
def test_decode_attention_window_and_logit_cap(kernels, window, cap):
    gen = torch.Generator().manual_seed(window * 7 + int(cap))
    lens, hq, hkv, d = [20, 2, 9], 4, 2, 64
    table, rows, num_slots = _page_table(lens, 1, gen)
    pool = torch.randn(num_slots, 2, hkv, d, generator=gen) * 3
    q = torch.randn(len(lens), hq * d, generator=gen) * 3
    out = torch.empty_like(q)
    kernels.paged_attention(
        out, q, q, q, pool, torch.zeros(3, dtype=torch.int64), table, torch.tensor(rows),
        torch.tensor(lens), NO_EXT, d**-0.5, cap, window, False,
    )  # fmt: skip
    expected = _reference_decode(
        q.view(3, hq, d), pool, table, rows, lens, d**-0.5, window, cap, hkv
    )
    torch.testing.assert_close(out.view(3, hq, d), expected, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_extend_attention_is_causal_over_prefix_and_new_tokens(kernels, window, hq, hkv):
    """Each new token (position p) sees its request's keys at (p - window, p]: the cached
    prefix and the new tokens before it (the speculative verify shape: k + 1 per request)."""
    gen = torch.Generator().manual_seed(window + hq)
    prefix, ext, d = [0, 30, 7], [5, 4, 1], 64
    lens = [p + e for p, e in zip(prefix, ext)]
    table, rows, num_slots = _page_table(lens, 4, gen)
    pool = torch.randn(num_slots, 2, hkv, d, generator=gen)
    t = sum(ext)
    q = torch.randn(t, hq * d, generator=gen)
    k, v = torch.randn(t, hkv * d, generator=gen), torch.randn(t, hkv * d, generator=gen)
    loc = torch.cat([table[r, p:n].long() for r, p, n in zip(rows, prefix, lens)])
    out = torch.empty_like(q)
    kernels.paged_attention(
        out, q, k, v, pool, loc, table, torch.tensor(rows), torch.tensor(lens),
        torch.tensor(ext), d**-0.5, 0.0, window, True,
    )  # fmt: skip
    # per new token: a decode over its request's first p + 1 positions
    tok_rows = [r for r, e in zip(rows, ext) for _ in range(e)]
    tok_lens = [p + i + 1 for p, e in zip(prefix, ext) for i in range(e)]
    expected = _reference_decode(q.view(t, hq, d), pool, table, tok_rows, tok_lens, d**-0.5,
                                 window, 0, hkv)  # fmt: skip
    torch.testing.assert_close(out.view(t, hq, d), expected, atol=FP32_TOL, rtol=FP32_TOL)


def test_extend_lens_must_cover_q_rows(kernels):
    table = torch.zeros(2, 8, dtype=torch.int32)
    pool = torch.zeros(4, 2, 1, 64)
    q = torch.zeros(3, 64)
    with pytest.raises(RuntimeError, match="q has 3 rows but the batch has 2 new tokens"):
        kernels.paged_attention(
            q.clone(), q, q, q, pool, torch.zeros(3, dtype=torch.int64), table,
            torch.tensor([1]), torch.tensor([4]), torch.tensor([2]), 0.125, 0.0, 0, False,
        )  # fmt: skip


# -- long extends (prefill chunks, prompts over a cached prefix): the tiled path ----------


def _extend_case(prefix, ext, hq, hkv, d, page_size, gen, pool_dtype=torch.float32,
                 q_dtype=torch.float32, scale=1.0):
    """A batch of new tokens over cached prefixes: (args of paged_attention with out, the
    reference inputs, the q rows' k and v). The new K/V are written by the call."""
    lens = [p + e for p, e in zip(prefix, ext)]
    table, rows, num_slots = _page_table(lens, page_size, gen)
    pool = (torch.randn(num_slots, 2, hkv, d, generator=gen) * scale).to(pool_dtype)
    t = sum(ext)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=gen) * scale).to(q_dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)  # strided rows of one output
    loc = torch.cat([table[r, p:n].long() for r, p, n in zip(rows, prefix, lens)])
    out = q.new_empty(t, hq * d)
    tok_rows = [r for r, e in zip(rows, ext) for _ in range(e)]
    tok_lens = [p + i + 1 for p, e in zip(prefix, ext) for i in range(e)]
    args = [out, q, k, v, pool, loc, table, torch.tensor(rows), torch.tensor(lens),
            torch.tensor(ext)]  # fmt: skip
    return args, (tok_rows, tok_lens)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1), (6, 2)])
@pytest.mark.parametrize("head_dim", [48, 64, 128])
def test_long_extends_over_cached_prefixes(kernels, page_size, hq, hkv, head_dim):
    """Prompts of 17 to 150 new tokens, with and without a cached prefix, beside a short
    extend in the same batch: each new token at position p sees its request's keys
    [0, p], read from the pool after the call wrote the new K/V there."""
    gen = torch.Generator().manual_seed(hq * 100 + head_dim + page_size)
    prefix, ext = [0, 45, 3, 130], [150, 17, 2, 70]
    args, (tok_rows, tok_lens) = _extend_case(prefix, ext, hq, hkv, head_dim, page_size, gen)
    out, q, k, v, pool, loc, table = args[:7]
    kernels.paged_attention(*args, head_dim**-0.5, 0.0, 0, True)
    assert torch.equal(pool[loc, 0], k.reshape(-1, hkv, head_dim))
    assert torch.equal(pool[loc, 1], v.reshape(-1, hkv, head_dim))
    t = q.shape[0]
    expected = _reference_decode(q.reshape(t, hq, head_dim), pool, table, tok_rows, tok_lens,
                                 head_dim**-0.5, 0, 0, hkv)  # fmt: skip
    torch.testing.assert_close(out.view(t, hq, head_dim), expected, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize("window,cap", [(20, 0.0), (0, 30.0), (7, 5.0), (200, 0.0)])
def test_long_extends_window_and_logit_cap(kernels, window, cap):
    """Sliding windows (a token sees (p - window, p]; blocks before every row's window
    are skipped) and soft-capped scores, Gemma 2's pair."""
    gen = torch.Generator().manual_seed(window + int(cap))
    prefix, ext, hq, hkv, d = [0, 90], [120, 40], 8, 2, 64
    args, (tok_rows, tok_lens) = _extend_case(prefix, ext, hq, hkv, d, 1, gen, scale=3.0)
    out, q, pool, table = args[0], args[1], args[4], args[6]
    kernels.paged_attention(*args, d**-0.5, cap, window, True)
    expected = _reference_decode(q.reshape(-1, hq, d), pool, table, tok_rows, tok_lens,
                                 d**-0.5, window, cap, hkv)  # fmt: skip
    # inputs 3x (scores past the caps): outputs of ~3x the magnitude, so 3x the atol
    torch.testing.assert_close(out.view(-1, hq, d), expected, atol=3 * FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize(
    "q_dtype,pool_dtype,tol",
    [
        (torch.float32, torch.bfloat16, FP32_TOL),  # dtype auto widening a bf16 checkpoint
        (torch.float32, torch.float16, FP32_TOL),
        (torch.bfloat16, torch.bfloat16, 2e-2),  # a bf16 model: out rounded to bf16
        (torch.float16, torch.float16, 2e-2),
        (torch.float32, torch.float8_e4m3fn, FP32_TOL),  # --kv-cache-dtype fp8_e4m3
        (torch.float32, torch.float8_e5m2, FP32_TOL),
        (torch.bfloat16, torch.float8_e4m3fn, 2e-2),
        (torch.bfloat16, torch.float8_e5m2, 2e-2),
    ],
)
def test_long_extends_half_precision(kernels, q_dtype, pool_dtype, tol):
    """The tiled path reads the cached prefix from a bf16/fp16 pool and the new tokens' K/V
    unrounded: a float32 model's prompt attends to its own keys as computed (as SDPA did)."""
    gen = torch.Generator().manual_seed(7)
    prefix, ext, hq, hkv, d = [0, 33], [64, 29], 4, 2, 64
    args, (tok_rows, tok_lens) = _extend_case(prefix, ext, hq, hkv, d, 4, gen, pool_dtype,
                                              q_dtype)  # fmt: skip
    out, q, k, v, pool, loc, table = args[:7]
    kernels.paged_attention(*args, d**-0.5, 0.0, 0, True)
    assert torch.equal(pool[loc, 0], k.reshape(-1, hkv, d).to(pool_dtype))
    # the tiled path: the prefix from the pool, the new tokens' K/V as given (SDPA's view
    # of a prompt); the per-token path (the portable build) reads every key from the pool
    seen = pool.float()
    if kernels.extend_tiled(max(ext), d):
        seen[loc, 0], seen[loc, 1] = k.reshape(-1, hkv, d).float(), v.reshape(-1, hkv, d).float()
    expected = _reference_decode(q.reshape(-1, hq, d), seen, table, tok_rows, tok_lens,
                                 d**-0.5, 0, 0, hkv)  # fmt: skip
    torch.testing.assert_close(out.view(-1, hq, d).float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("amx", [True, False])
@pytest.mark.parametrize(
    "hq,hkv,d,window,cap,page_size",
    [(8, 2, 128, 0, 0.0, 1), (4, 4, 64, 0, 0.0, 4), (6, 2, 64, 20, 0.0, 1), (8, 1, 128, 0, 30.0, 4),
     (16, 8, 128, 7, 5.0, 1)],
)
def test_long_extends_all_bf16(native_kernels, amx_tiles, amx, hq, hkv, d, window, cap, page_size):
    """A bf16 model over a bf16 pool, the prefill path of `dtype auto` on AMX and AVX-512
    bf16 CPUs: on AMX tiles where the CPU has them (q k^T and p v as tile products, the
    probabilities rounded to bf16 as flash attention does on GPUs; head_dim a multiple of
    64), else the float32 vector path; within bf16's precision of float32 attention over
    the same values, GQA, windows, soft caps, pages of 1 and 4, prefixes up to 130."""
    amx_tiles(amx)
    gen = torch.Generator().manual_seed(hq * 10 + d + window)
    prefix, ext = [0, 45, 3, 130], [150, 17, 2, 70]
    args, (tok_rows, tok_lens) = _extend_case(prefix, ext, hq, hkv, d, page_size, gen,
                                              torch.bfloat16, torch.bfloat16, scale=2.0)  # fmt: skip
    out, q, k, v, pool, loc, table = args[:7]
    native_kernels.paged_attention(*args, d**-0.5, cap, window, True)
    seen = pool.float()  # the prefix from the pool, the new tokens' K/V as given
    seen[loc, 0], seen[loc, 1] = k.reshape(-1, hkv, d).float(), v.reshape(-1, hkv, d).float()
    expected = _reference_decode(q.float().reshape(-1, hq, d), seen, table, tok_rows, tok_lens,
                                 d**-0.5, window, cap, hkv)  # fmt: skip
    torch.testing.assert_close(out.view(-1, hq, d).float(), expected, atol=3e-2, rtol=2e-2)


def test_long_extends_without_save_kv_read_the_new_keys_from_the_pool(kernels):
    """save_kv false: the new tokens' K/V are already in the pool (k and v unused)."""
    gen = torch.Generator().manual_seed(5)
    prefix, ext, hq, hkv, d = [10, 0], [40, 25], 4, 2, 64
    args, (tok_rows, tok_lens) = _extend_case(prefix, ext, hq, hkv, d, 1, gen, torch.bfloat16)
    out, q, pool, table = args[0], args[1], args[4], args[6]
    args[2] = args[3] = q  # placeholders, as the callers that do not save pass
    kernels.paged_attention(*args, d**-0.5, 0.0, 0, False)
    expected = _reference_decode(q.reshape(-1, hq, d), pool, table, tok_rows, tok_lens,
                                 d**-0.5, 0, 0, hkv)  # fmt: skip
    torch.testing.assert_close(out.view(-1, hq, d), expected, atol=FP32_TOL, rtol=FP32_TOL)


def test_long_extends_same_result_on_any_thread_count(kernels):
    """Each (request, KV head, block of tokens) is one thread's: the threads change who
    computes a row, not how."""
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            gen = torch.Generator().manual_seed(11)
            args, _ = _extend_case([0, 200], [100, 60], 8, 2, 128, 1, gen)
            kernels.paged_attention(*args, 128**-0.5, 0.0, 0, True)
            results.append(args[0])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_extend_tiled_reports_where_the_tiled_path_serves(kernels):
    """The vector build tiles extends past the per-token path's 16 tokens when head_dim is
    a multiple of its vector width (at most 256); the portable build never does (the
    attention backend then keeps SDPA for long extends)."""
    vector = kernels.vector_isa != "scalar"
    width = {"avx512": 16, "avx2": 8}.get(kernels.vector_isa, 1)
    assert kernels.extend_tiled(17, 64 * width // 8) == vector
    assert not kernels.extend_tiled(16, 64)
    assert not kernels.extend_tiled(0, 64)  # decode
    assert not kernels.extend_tiled(500, 256 + width)
    assert not kernels.extend_tiled(500, width + 4)


def test_backend_routes_long_extends_to_the_tiled_kernel(native_kernels):
    """A prefill of 40 tokens takes the kernel (and the fused layers) where the build tiles
    it; a head_dim the tiled path lacks, or the kernels disabled, keep SDPA."""
    def fb(head_dim, ext):
        mode = SimpleNamespace(is_decode=lambda: False)
        pool = SimpleNamespace(dtype=torch.float32, head_dim=head_dim)
        return SimpleNamespace(forward_mode=mode, token_to_kv_pool=pool, extend_seq_lens_cpu=ext,
                               out_cache_loc=torch.zeros(sum(ext), dtype=torch.int64))  # fmt: skip

    usable = TorchNativeAttnBackend._kernel_usable
    assert usable(fb(64, [40, 3])) == native_kernels.extend_tiled(40, 64)
    assert usable(fb(64, [16, 3]))  # the per-token path, any build
    assert not usable(fb(60, [40]))
    with cpu_kernels.disabled():
        assert not usable(fb(64, [40]))


@pytest.mark.parametrize(
    "dtype,page_size,lens,hq,d",
    [
        (torch.bfloat16, 4, [30, 7], 8, 64),
        (torch.bfloat16, 1, [90, 3], 4, 128),
        (torch.float16, 1, [90, 3], 4, 128),
        (torch.bfloat16, 1, [70, 9], 6, 64),  # group 3: a pair of query heads, then one
    ],
)
def test_decode_attention_half_precision_pools(kernels, dtype, page_size, lens, hq, d):
    gen = torch.Generator().manual_seed(d + hq)
    hkv = 2
    table, rows, num_slots = _page_table(lens, page_size, gen)
    pool = torch.randn(num_slots, 2, hkv, d, generator=gen).to(dtype)
    q = torch.randn(2, hq * d, generator=gen).to(dtype)
    out = torch.empty_like(q)
    kernels.paged_attention(
        out, q, q, q, pool, torch.zeros(2, dtype=torch.int64), table, torch.tensor(rows),
        torch.tensor(lens), NO_EXT, d**-0.5, 0.0, 0, False,
    )  # fmt: skip
    expected = _reference_decode(q.view(2, hq, d), pool, table, rows, lens, d**-0.5, 0, 0, hkv)
    torch.testing.assert_close(out.view(2, hq, d).float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "pool_dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
)
@pytest.mark.parametrize("lens,head_dim", [([30, 7], 64), ([700, 65], 128), ([20, 9], 48)])
def test_float32_queries_over_a_half_precision_pool(kernels, pool_dtype, lens, head_dim):
    """--kv-cache-dtype bfloat16/float16/fp8_e4m3/fp8_e5m2 under a float32 model: the new
    K/V are stored rounded to the pool's dtype and attention reads them widened to float32
    exactly (every fp8 value, denormals included: the reference widens with torch)."""
    gen = torch.Generator().manual_seed(head_dim + len(lens))
    hq, hkv = 8, 2
    table, rows, num_slots = _page_table(lens, 1, gen)
    pool = torch.randn(num_slots, 2, hkv, head_dim, generator=gen).to(pool_dtype)
    qkv = torch.randn(len(lens), (hq + 2 * hkv) * head_dim, generator=gen)
    q, k, v = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=1)
    loc = torch.tensor([table[r, n - 1].item() for r, n in zip(rows, lens)], dtype=torch.int64)
    out = q.new_empty(len(lens), hq * head_dim)
    kernels.paged_attention(
        out, q, k, v, pool, loc, table, torch.tensor(rows), torch.tensor(lens), NO_EXT,
        head_dim**-0.5, 0.0, 0, True,
    )  # fmt: skip
    assert torch.equal(pool[loc, 0], k.reshape(-1, hkv, head_dim).to(pool_dtype))
    assert torch.equal(pool[loc, 1], v.reshape(-1, hkv, head_dim).to(pool_dtype))
    expected = _reference_decode(
        q.view(-1, hq, head_dim), pool, table, rows, lens, head_dim**-0.5, 0, 0, hkv
    )
    torch.testing.assert_close(out.view(-1, hq, head_dim), expected, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize("pool_dtype,largest", [(torch.float8_e4m3fn, 448.0),
                                                (torch.float8_e5m2, 57344.0)])  # fmt: skip
def test_an_fp8_pool_saturates_what_it_cannot_hold(kernels, pool_dtype, largest):
    """K/V past fp8's range are stored as its largest finite value, not inf or NaN, so
    attention over the slot stays finite; every stored byte reads back as torch widens it."""
    hq = hkv = 1
    d = 64
    table = torch.arange(8, dtype=torch.int32).view(1, 8)
    pool = torch.zeros(8, 2, hkv, d, dtype=pool_dtype)
    q = torch.full((1, hq * d), 0.01)
    k = torch.full((1, hkv * d), 1e6)
    v = torch.linspace(-1e6, 1e6, d).view(1, d)
    loc = torch.tensor([3])
    out = torch.empty_like(q)
    kernels.paged_attention(out, q, k, v, pool, loc, table, torch.tensor([0]), torch.tensor([4]),
                            NO_EXT, d**-0.5, 0.0, 0, True)  # fmt: skip
    assert torch.all(pool[3, 0].float() == largest)
    assert pool[3, 1].float().abs().max() == largest and torch.isfinite(out).all()
    every_byte = torch.arange(256, dtype=torch.uint8)
    every_byte = every_byte[torch.isfinite(every_byte.view(pool_dtype).float())]
    n = every_byte.numel() // 8 * 8  # whole rows of 8 keys
    kv = torch.zeros(n // 8 + 1, 2, 1, 8, dtype=pool_dtype)
    kv[1:, 1].view(torch.uint8).copy_(every_byte[:n].view(-1, 1, 8))
    table = torch.arange(n // 8 + 1, dtype=torch.int32).view(1, -1)
    rows = n // 8
    for key in range(1, rows + 1):  # a one-hot score picks value row `key` exactly
        q = torch.zeros(1, 8)
        kv[:, 0] = 0
        kv[key, 0] = torch.full((1, 8), 64.0).to(pool_dtype)
        q[0, 0] = 8.0
        out = torch.empty_like(q)
        kernels.paged_attention(out, q, q, q, kv, torch.tensor([0]), table, torch.tensor([0]),
                                torch.tensor([rows + 1]), NO_EXT, 1.0, 0.0, 0, False)  # fmt: skip
        torch.testing.assert_close(out[0], kv[key, 1, 0].float(), atol=1e-30, rtol=1e-6)


def test_a_float16_pool_under_float32_compute_saturates_as_the_python_store(kernels):
    """float32 compute keeps a float16 checkpoint's K/V in float16 (--dtype auto): a K
    past 65504 was stored as inf, and every later step over the slot was NaN (token 0,
    logprob -9999). The kernel's store and the pool's own set_kv_buffer both saturate."""
    d = 64
    table = torch.arange(8, dtype=torch.int32).view(1, 8)
    pool = torch.zeros(8, 2, 1, d, dtype=torch.float16)
    q = torch.full((1, d), 0.01)
    k = torch.full((1, d), 1e5)
    v = torch.linspace(-1e5, 1e5, d).view(1, d)
    out = torch.empty_like(q)
    kernels.paged_attention(out, q, k, v, pool, torch.tensor([3]), table, torch.tensor([0]),
                            torch.tensor([4]), NO_EXT, d**-0.5, 0.0, 0, True)  # fmt: skip
    assert torch.all(pool[3, 0].float() == 65504.0) and torch.isfinite(out).all()
    python_pool = MHATokenToKVPool(8, torch.float16, 1, d, 1, "cpu")
    python_pool.set_kv_buffer(0, torch.tensor([3]), k.view(1, 1, d), v.view(1, 1, d))
    assert torch.equal(python_pool.kv_buffer[0][3], pool[3])


def test_a_half_precision_query_needs_its_own_pool_dtype(kernels):
    q = torch.randn(1, 64).bfloat16()
    pool = torch.zeros(4, 2, 1, 64, dtype=torch.float16)
    table = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="kv_pool must have q's dtype"):
        kernels.paged_attention(
            torch.empty_like(q), q, q, q, pool, torch.zeros(1, dtype=torch.int64), table,
            torch.tensor([1]), torch.tensor([1]), NO_EXT, 0.125, 0.0, 0, False,
        )  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("head_dim,window,cap", [(64, 0, 0.0), (96, 0, 0.0), (256, 0, 0.0),
                                                 (64, 333, 0.0), (128, 0, 20.0)])  # fmt: skip
def test_decode_attention_long_contexts_split_over_threads(kernels, threads, head_dim, window, cap):
    """A batch smaller than the thread count splits each token's keys over several
    workers and merges their softmax partials: same result as one pass."""
    gen = torch.Generator().manual_seed(head_dim + window + threads)
    lens, hq, hkv = [700, 65], 8, 2
    table, rows, num_slots = _page_table(lens, 1, gen)
    pool = torch.randn(num_slots, 2, hkv, head_dim, generator=gen) * 2
    q = torch.randn(len(lens), hq * head_dim, generator=gen) * 2
    out = torch.empty_like(q)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.paged_attention(
            out, q, q, q, pool, torch.zeros(2, dtype=torch.int64), table, torch.tensor(rows),
            torch.tensor(lens), NO_EXT, head_dim**-0.5, cap, window, False,
        )  # fmt: skip
    finally:
        torch.set_num_threads(before)
    expected = _reference_decode(
        q.view(2, hq, head_dim), pool, table, rows, lens, head_dim**-0.5, window, cap, hkv
    )
    torch.testing.assert_close(out.view(2, hq, head_dim), expected, atol=FP32_TOL, rtol=FP32_TOL)


def test_decode_attention_rejects_a_bad_seq_len(kernels):
    table = torch.zeros(2, 8, dtype=torch.int32)
    pool = torch.zeros(4, 2, 1, 64)
    q = torch.zeros(1, 64)
    with pytest.raises(RuntimeError, match="seq_len out of range"):
        kernels.paged_attention(
            q.clone(), q, q, q, pool, torch.zeros(1, dtype=torch.int64), table,
            torch.tensor([1]), torch.tensor([9]), NO_EXT, 0.125, 0.0, 0, False,
        )  # fmt: skip


# -- routing in the layers ----------------------------------------------------------------


def test_layers_take_the_kernels_for_any_rows_unless_disabled(native_kernels, monkeypatch):
    calls = []
    real = native_kernels.silu_and_mul_out
    monkeypatch.setattr(native_kernels, "silu_and_mul_out", lambda *a: calls.append(1) or real(*a))
    act = SiluAndMul()
    small = torch.randn(4, 64)
    out = act(small)
    torch.testing.assert_close(out, F.silu(small[:, :32]) * small[:, 32:])
    assert calls == [1]
    big = torch.randn(3000, 64)  # a prefill chunk
    torch.testing.assert_close(act(big), F.silu(big[:, :32]) * big[:, 32:])
    assert calls == [1, 1]
    with cpu_kernels.disabled():
        act(small)
    assert calls == [1, 1]


def test_rmsnorm_layer_same_result_either_path(native_kernels):
    norm = RMSNorm(96, eps=1e-6)
    norm.weight.data = torch.rand(96) + 0.5
    x, residual = torch.randn(3, 96), torch.randn(3, 96)
    with cpu_kernels.disabled():
        want_out, want_res = norm(x.clone(), residual.clone())
        want_plain = norm(x.clone())
    got_out, got_res = norm(x.clone(), residual.clone())
    torch.testing.assert_close(got_out, want_out, atol=FP32_TOL, rtol=FP32_TOL)
    torch.testing.assert_close(got_res, want_res, atol=FP32_TOL, rtol=FP32_TOL)
    plain_in = x.clone()
    torch.testing.assert_close(norm(plain_in), want_plain, atol=FP32_TOL, rtol=FP32_TOL)
    assert torch.equal(plain_in, x)  # without a residual the input is left as it was


def test_missing_sources_fall_back_to_torch_ops(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "source_dir", lambda: tmp_path)
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert cpu_kernels._build() is None
    assert "CPU kernels unavailable" in caplog.text and "using torch ops" in caplog.text


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("SGLANG_CPU_KERNELS", "0")
    assert cpu_kernels._build() is None


def test_ninja_beside_the_interpreter_is_put_on_path(tmp_path, monkeypatch):
    """torch runs `ninja` from PATH; the venv's (the `ninja` dependency) serves when the
    venv is not activated and the system has none."""
    (tmp_path / "ninja").write_text("")
    monkeypatch.setattr(cpu_kernels.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/usr/bin")
    cpu_kernels._put_venv_ninja_on_path()
    assert cpu_kernels.os.environ["PATH"].split(cpu_kernels.os.pathsep)[0] == str(tmp_path)


def test_rotary_falls_back_for_a_dtype_the_kernels_lack(native_kernels):
    """prepare() leaves cos/sin to the kernel; an x the kernel cannot take (float64) still
    gets the torch rotation, which then builds them itself."""
    rope = get_rope(64, 64, 10000.0)
    positions = torch.arange(3)
    x = torch.randn(3, 2 * 64, dtype=torch.float64)
    rope.prepare(positions)
    got = rope.rotate_heads(positions, x.clone())
    with cpu_kernels.disabled():
        expected = get_rope(64, 64, 10000.0).rotate_heads(positions, x.clone())
    torch.testing.assert_close(got, expected)


# -- argmax (greedy sampling) ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,vocab", [(1, 8192), (33, 1000), (5, 7)])
def test_argmax_rows_matches_torch(kernels, dtype, rows, vocab):
    gen = torch.Generator().manual_seed(rows + vocab)
    x = torch.randn(rows, vocab, generator=gen).to(dtype)
    out = torch.empty(rows, dtype=torch.int64)
    kernels.argmax_rows(out, x)
    assert torch.equal(out, x.argmax(-1))


def test_argmax_rows_ties_nan_and_minus_inf_as_torch(kernels):
    x = torch.full((4, 40), -float("inf"))
    x[0, [3, 17, 35]] = 2.0  # tie: the first index
    x[1, 30] = float("nan")  # a NaN wins, as in torch
    x[1, 2] = 5.0
    x[2, 39] = 1.0  # the max in the tail past the last full vector
    out = torch.empty(4, dtype=torch.int64)  # row 3: all -inf -> index 0
    kernels.argmax_rows(out, x)
    assert out.tolist() == x.argmax(-1).tolist() == [3, 30, 39, 0]


def test_greedy_sampling_takes_the_kernel_on_strided_logits(native_kernels):
    logits = torch.randn(6, 2 * 300)[:, :300]  # rows of a wider buffer
    assert torch.equal(greedy_ids(logits), logits.argmax(-1))
    with cpu_kernels.disabled():
        assert torch.equal(greedy_ids(logits), logits.argmax(-1))


# -- small-M linear -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,k,n",
    # every x-row remainder of the 6-row tile (1-13 rows), an N tail past the 4-row weight
    # blocks (N % 4), a K tail past the 16-lane vectors (K % 16), K below one vector; one
    # row over long K (the bf16 GEMV's 8-row passes) with N and K tails past them
    [(1, 256, 512), (2, 96, 36), (5, 64, 7), (6, 48, 8), (7, 100, 33), (13, 1030, 70), (3, 9, 5),
     (1, 1024, 64), (1, 1030, 75)],
)
def test_linear_small_m_matches_torch(kernels, dtype, rows, k, n):
    x, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype) / k**0.5
    bias = torch.randn(n, dtype=dtype)
    want = F.linear(x.float(), w.float(), bias.float())
    for b in (None, bias):
        out = torch.empty(rows, n, dtype=dtype)
        kernels.linear_small_m(out, x, w, b)
        expected = want if b is not None else want - bias.float()
        torch.testing.assert_close(out.float(), expected, **_tol(dtype))


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,k,n", [(1, 256, 512), (7, 100, 33), (13, 1030, 70)])
def test_linear_small_m_half_weights_under_float32(kernels, w_dtype, rows, k, n):
    """Weights kept in a half checkpoint's dtype: widened exactly, so float32's result."""
    x, w = torch.randn(rows, k), (torch.randn(n, k) / k**0.5).to(w_dtype)
    bias = torch.randn(n)
    out = torch.empty(rows, n)
    kernels.linear_small_m(out, x, w, bias)
    torch.testing.assert_close(out, F.linear(x, w.float(), bias), atol=FP32_TOL, rtol=FP32_TOL)
    torch.testing.assert_close(linear(x, w, bias), out, atol=FP32_TOL, rtol=FP32_TOL)
    wide = torch.randn(100, k)  # past the kernel's rows: F.linear over the widened weight
    torch.testing.assert_close(linear(wide, w), F.linear(wide, w.float()))


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
     (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize("k,n", [(1024, 1027), (1030, 1030), (2047, 600)])
def test_linear_one_row_over_a_streamed_weight(kernels, x_dtype, w_dtype, k, n):
    """One row against a weight of at least 2 MiB with 512 <= K < 2048: the GEMV that reads
    the weight rows one after another (gemv_stream; the bf16 dot product's 8-row passes
    where the CPU has it), with K tails past its 4 vectors and N tails."""
    x, w = torch.randn(1, k).to(x_dtype), (torch.randn(n, k) / k**0.5).to(w_dtype)
    assert w.numel() * w.element_size() >= 2 << 20
    bias = torch.randn(n).to(x_dtype)
    want = F.linear(x.float(), w.float(), bias.float())
    for b in (None, bias):
        out = torch.empty(1, n, dtype=x_dtype)
        kernels.linear_small_m(out, x, w, b)
        expected = want if b is not None else want - bias.float()
        torch.testing.assert_close(out.float(), expected, **_tol(x_dtype))


def test_linear_small_m_strided_rows_and_threads(kernels):
    base = torch.randn(9, 2 * 128)
    x = base[:, 64 : 64 + 128]  # rows of a wider buffer (row stride 256)
    w = torch.randn(300, 128)
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            out = torch.empty(9, 300)
            kernels.linear_small_m(out, x, w)
            torch.testing.assert_close(out, F.linear(x, w), atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(previous)


def test_linear_small_m_refuses_mismatched_arguments(kernels):
    x, w = torch.randn(2, 32), torch.randn(8, 32)
    with pytest.raises(RuntimeError, match="columns"):
        kernels.linear_small_m(torch.empty(2, 8), x, torch.randn(8, 16))
    with pytest.raises(RuntimeError, match="one dtype"):  # a half x over a float32 w
        kernels.linear_small_m(torch.empty(2, 8, dtype=torch.bfloat16), x.bfloat16(), w)
    with pytest.raises(RuntimeError, match="out must be"):
        kernels.linear_small_m(torch.empty(2, 9), x, w)
    with pytest.raises(RuntimeError, match="contiguous 2-D"):
        kernels.linear_small_m(torch.empty(2, 8), x, torch.randn(32, 8).t())


def test_linear_layers_route_decode_rows_to_the_kernel(native_kernels, monkeypatch):
    calls = []
    real = native_kernels.linear_small_m
    monkeypatch.setattr(native_kernels, "linear_small_m", lambda *a: calls.append(a[1].shape) or real(*a))
    layer = ColumnParallelLinear(256, 64, bias=True)
    layer.weight.data, layer.bias.data = torch.randn(64, 256) / 16, torch.randn(64)
    for rows in (1, 16, 17, 300):  # 17 rows of a 256-wide input: F.linear is faster
        x = torch.randn(rows, 256)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-4)
    assert calls == [(1, 256), (16, 256)]
    wide, w = torch.randn(40, LONG_K), torch.randn(8, LONG_K) / 32
    torch.testing.assert_close(linear(wide, w), F.linear(wide, w), atol=1e-4, rtol=1e-4)
    assert calls[-1] == (40, LONG_K)
    with cpu_kernels.disabled():
        layer(torch.randn(2, 256))
    assert len(calls) == 3


def test_half_weights_under_float32_take_the_kernel_up_to_their_row_limit(native_kernels, monkeypatch):
    """A bf16 weight under float32 x would be widened whole for F.linear on every call,
    so the kernel (which widens rows as it loads them) serves it up to
    HALF_WEIGHT_MAX_ROWS rows even on a narrow input; past that F.linear does."""
    calls = []
    real = native_kernels.linear_small_m
    monkeypatch.setattr(native_kernels, "linear_small_m", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    w = (torch.randn(48, 256) / 16).bfloat16()
    for rows in (SMALL_M_MAX_ROWS + 1, HALF_WEIGHT_MAX_ROWS, HALF_WEIGHT_MAX_ROWS + 1):
        x = torch.randn(rows, 256)
        torch.testing.assert_close(linear(x, w), F.linear(x, w.float()), atol=1e-4, rtol=1e-4)
    assert calls == [SMALL_M_MAX_ROWS + 1, HALF_WEIGHT_MAX_ROWS]
    x = torch.randn(SMALL_M_MAX_ROWS + 1, 256)  # the same rows over a float32 weight: F.linear
    linear(x, w.float())
    assert len(calls) == 2


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "rows,k,n",
    # the last two have enough panels (N >= 2048 on AVX2, 4096 on AVX-512) for x packed in
    # tiles: M tails, N tails, two K blocks, several M blocks
    [(65, 256, 40), (13, 96, 7), (300, 64, 33), (1, 8, 1), (1100, 200, 70), (40, 704, 64),
     (301, 264, 4105), (1100, 200, 4096)],
)
def test_linear_packed_matches_torch(kernels, w_dtype, rows, k, n):
    """Panels of 2 vectors of columns (N tails zero-padded), tiles of rows (M tails),
    K blocks (a partial last one, a K tail past the transposed blocks), M blocks (1100
    rows at K = 200 are 4 of them), strided x rows, x packed in tiles past 128 panels,
    with and without bias: F.linear over the widened weight."""
    x = torch.randn(rows, 2 * k)[:, :k]
    w = (torch.randn(n, k) / 8).to(w_dtype)
    for bias in (None, torch.randn(n)):
        out = torch.empty(rows, n)
        kernels.linear_packed(out, x, w, bias)
        torch.testing.assert_close(out, F.linear(x, w.float(), bias), atol=1e-4, rtol=1e-4)


def test_linear_packed_with_no_input_columns_gives_the_bias(kernels):
    """K = 0: every sum is empty, so the output is the bias (zeros without one), as F.linear
    gives; the tile starts its sums from the first K column and must not run at all."""
    x, w, b = torch.randn(5, 0), torch.randn(3, 0).bfloat16(), torch.randn(3)
    for bias in (None, b):
        out = torch.full((5, 3), float("nan"))
        kernels.linear_packed(out, x, w, bias)
        torch.testing.assert_close(out, F.linear(x, w.float(), bias))


@pytest.mark.parametrize(
    "rows,k,n",
    # a 12-row tile and M tails, N tails (n % 32), K tails (odd K: a zero-padded pair; pairs
    # past the 16-pair transposed blocks), several M blocks of x (1100 rows at K = 200)
    [(40, 256, 64), (13, 96, 7), (300, 64, 33), (1, 8, 1), (1100, 200, 70), (25, 71, 40),
     (17, 704, 256)],
)
def test_linear_packed_all_bf16_matches_torch(kernels, rows, k, n):
    """bf16 x over bf16 w: the bf16 dot product (float32 sums rounded once to bf16) where
    the build has it, else at::linear; both within bf16 rounding of float32's result."""
    x = torch.randn(rows, 2 * k)[:, :k].bfloat16()
    w = (torch.randn(n, k) / k**0.5).bfloat16()
    for bias in (None, torch.randn(n).bfloat16()):
        out = torch.empty(rows, n, dtype=torch.bfloat16)
        kernels.linear_packed(out, x, w, bias)
        want = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        torch.testing.assert_close(out.float(), want, **_tol(torch.bfloat16))


def test_all_bf16_linears_past_the_small_m_rows_take_the_packed_kernel(
    native_kernels, monkeypatch, amx_tiles
):
    """With the bf16 dot product (AMX tiles off, as on a CPU without them), bf16 x over
    bf16 weights past the small-M rows take linear_packed (1.1-3x oneDNN's bf16 GEMM at
    16-256 rows on an AVX-512 bf16 EPYC); without it, F.linear."""
    amx_tiles(False)
    calls = []
    real = native_kernels.linear_packed
    monkeypatch.setattr(native_kernels, "linear_packed", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    w, b = (torch.randn(40, 128) / 8).bfloat16(), torch.randn(40).bfloat16()
    for rows in (SMALL_M_MAX_ROWS + 1, 300):
        x = torch.randn(rows, 128).bfloat16()
        want = F.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(linear(x, w, b).float(), want, **_tol(torch.bfloat16))
    assert calls == ([SMALL_M_MAX_ROWS + 1, 300] if native_kernels.bf16_dot else [])


def test_linear_packed_refuses_mismatched_arguments(kernels):
    x, w = torch.randn(4, 16), torch.randn(8, 16).bfloat16()
    with pytest.raises(RuntimeError, match="float32"):
        kernels.linear_packed(torch.empty(4, 8), x.double(), w)
    with pytest.raises(RuntimeError, match="all bfloat16"):  # a bf16 x over a half w
        kernels.linear_packed(torch.empty(4, 8, dtype=torch.bfloat16), x.bfloat16(), w.half())
    with pytest.raises(RuntimeError, match="contiguous"):
        kernels.linear_packed(torch.empty(4, 8), x, torch.randn(8, 32).bfloat16()[:, :16])
    with pytest.raises(RuntimeError, match="bias"):
        kernels.linear_packed(torch.empty(4, 8), x, w, torch.randn(8).bfloat16())


def test_half_weights_past_the_small_m_rows_take_the_packed_kernel(native_kernels, monkeypatch):
    """Past HALF_WEIGHT_MAX_ROWS a half weight under float32 is widened a panel at a time
    by linear_packed, not whole by F.linear; a float32 weight keeps F.linear."""
    calls = []
    real = native_kernels.linear_packed
    monkeypatch.setattr(native_kernels, "linear_packed", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    w, b = (torch.randn(24, 128) / 8).bfloat16(), torch.randn(24)
    x = torch.randn(HALF_WEIGHT_MAX_ROWS + 3, 128)
    torch.testing.assert_close(linear(x, w, b), F.linear(x, w.float(), b), atol=1e-4, rtol=1e-4)
    assert calls == [HALF_WEIGHT_MAX_ROWS + 3]
    linear(x, w.float(), b)
    assert len(calls) == 1
    # prefill-size calls: MKL over the widened weight on AVX-512, linear_packed elsewhere
    big = torch.randn(PACKED_MAX_ROWS_AVX512 + 1, 128)
    torch.testing.assert_close(linear(big, w, b), F.linear(big, w.float(), b), atol=1e-4, rtol=1e-4)
    expected = [] if native_kernels.vector_isa == "avx512" else [PACKED_MAX_ROWS_AVX512 + 1]
    assert calls[1:] == expected


def test_a_build_killed_midway_does_not_hang_the_next_start(native_kernels):
    """A process killed while building leaves torch's baton file, on which torch's own
    loader waits forever; the next load removes it and loads the cached build."""
    build_dir = cpu_kernels.build_directory(cpu_kernels.source_dir(), cpu_kernels.CFLAGS)
    baton = build_dir / cpu_kernels.TORCH_BATON
    baton.touch()
    loaded: list = []
    worker = threading.Thread(
        target=lambda: loaded.append(
            cpu_kernels._compile(cpu_kernels.source_dir(), cpu_kernels.CFLAGS)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=120)
    assert loaded, "loading waited on the stale baton"
    assert not baton.exists()
    assert loaded[0].vector_isa == native_kernels.vector_isa


def test_checkouts_build_apart(tmp_path):
    """Two source directories (a worktree, CI's clone) never share a build directory:
    torch rebuilds a name whose source paths changed."""
    other = tmp_path / "cpu"
    other.mkdir()
    for name in cpu_kernels.SOURCE_FILES + cpu_kernels.HEADER_FILES:
        (other / name).write_bytes((cpu_kernels.source_dir() / name).read_bytes())
    ours = cpu_kernels.build_directory(cpu_kernels.source_dir(), cpu_kernels.CFLAGS)
    theirs = cpu_kernels.build_directory(other, cpu_kernels.CFLAGS)
    assert ours != theirs and ours.parent == theirs.parent


def test_native_build_takes_the_bf16_dot_product_where_the_cpu_has_it(native_kernels):
    """bf16 x bf16 decode linears use vdpbf16ps on CPUs with avx512_bf16 (the dtype auto
    rule keeps bf16 on AMD ones); the portable build and other CPUs widen to float32."""
    flags = set(resolvers.cpuinfo_fields().get("flags", "").split())
    assert native_kernels.bf16_dot == ("avx512f" in flags and "avx512_bf16" in flags)




def test_bf16_stores_round_as_torch_does(kernels):
    """The kernels' vector bf16 store rounds like c10's float -> bf16 cast, bit for bit:
    ties to even, infinities, denormals; NaN stays NaN. fused_add_rmsnorm_ stores the
    residual sum of two bf16 values, exact in float32, so the stored value is its cast."""
    step = 2.0**-8  # half a bf16 ulp at 1.0: 1 + step is a tie, rounded to even
    x = torch.tensor([1.0, 1.0 + 2 * step, -1.0, 3.0, 1e-39, -1e-39, float("inf"), float("nan")])
    r = torch.tensor([step, step, -step, 2 * step, 1e-39, 0.0, 1.0, 0.0])
    x, r = x.repeat(9)[:70].view(1, 70).bfloat16(), r.repeat(9)[:70].view(1, 70).bfloat16()
    want = (x.float() + r.float()).bfloat16()  # vectors and a tail
    residual = r.clone()
    kernels.fused_add_rmsnorm_(x.clone(), residual, torch.ones(70, dtype=torch.bfloat16), 1e-6)
    nan = want.isnan()
    assert torch.equal(residual.isnan(), nan)
    assert torch.equal(residual.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@pytest.mark.parametrize("pool_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("lens,head_dim", [([30, 7, 300], 64), ([90, 5], 128)])
def test_an_fp8_pool_attends_exactly_as_a_float32_pool_of_its_values(
    kernels, pool_dtype, lens, head_dim
):
    """Decode over fp8 K/V reads them widened exactly (on the vector build e4m3's
    re-biasing is folded into the score scale and the output, a power of two): the same
    bits out as a float32 pool holding the widened values. (The portable loops may fuse
    the value accumulation into FMAs differently per pool type: equal within rounding.)"""
    gen = torch.Generator().manual_seed(head_dim + len(lens))
    hq, hkv = 8, 2
    table, rows, num_slots = _page_table(lens, 1, gen)
    fp8 = (torch.randn(num_slots, 2, hkv, head_dim, generator=gen) * 3).to(pool_dtype)
    q = torch.randn(len(lens), hq * head_dim, generator=gen)
    outs = []
    for pool in (fp8, fp8.float()):
        out = q.new_empty(len(lens), hq * head_dim)
        kernels.paged_attention(
            out, q, q, q, pool, torch.zeros(len(lens), dtype=torch.int64), table,
            torch.tensor(rows), torch.tensor(lens), NO_EXT, head_dim**-0.5, 0.0, 0, False,
        )  # fmt: skip
        outs.append(out)
    if kernels.vector_isa == "scalar":
        torch.testing.assert_close(outs[0], outs[1], atol=FP32_TOL, rtol=FP32_TOL)
    else:
        assert torch.equal(outs[0], outs[1])
