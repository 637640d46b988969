"""bf16 linears on AMX tiles (sgl-kernel/csrc/cpu/gemm_amx.cpp) over the load-time panels.

On a CPU with AMX (amx_bf16) linear_packed over a weight's panels multiplies on the tiles
when the input width is a multiple of 32; elsewhere the same calls take the AVX-512 bf16
dot product (or at::linear), so every test here holds on any CPU and checks the tiles
where they exist: results within bf16 rounding of float32's, the two paths within bf16
rounding of each other, and linear()'s routing (the panels' GEMV below AMX_MIN_ROWS
rows, the tiles from there; other widths and weights without panels as before), and a
weight kept only as its panels (shape-only, on the meta device).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import AMX_MIN_ROWS, PANELS_ATTR, SMALL_M_MAX_ROWS, linear

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture(scope="module")
def kernels():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels must build here"
    return module


def _weight(n: int, k: int) -> torch.Tensor:
    w = (torch.randn(n, k) / k**0.5).bfloat16()
    setattr(w, PANELS_ATTR, cpu_kernels.load().pack_weight_panels(w))
    return w


def _packed(kernels, x, w, bias) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16)
    kernels.linear_packed(out, x, w, bias, getattr(w, PANELS_ATTR))
    return out


@pytest.mark.parametrize(
    "rows,k,n",
    # a 32-row block and its tails (1-31 rows past it, <= 16 and > 16), N tails (n % 32),
    # several passes of x blocks over the panels (300 rows at K = 1024), K = 32
    [
        (1, 32, 1),
        (7, 64, 7),
        (16, 256, 32),
        (31, 96, 40),
        (32, 256, 64),
        (33, 704, 256),
        (100, 128, 70),
        (300, 1024, 70),
    ],
)
def test_bf16_linear_over_panels_is_float32_within_bf16(kernels, amx_tiles, rows, k, n):
    amx_tiles(True)
    x = torch.randn(rows, 2 * k)[:, :k].bfloat16()  # rows strided, as a view of a wider output
    w = _weight(n, k)
    for bias in (None, torch.randn(n).bfloat16()):
        out = _packed(kernels, x, w, bias)
        want = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        torch.testing.assert_close(out.float(), want, **BF16_TOL)


def test_tiles_and_dot_product_agree_to_bf16_rounding(kernels, amx_tiles):
    """Both sum in float32 and round once; only the association of the sums differs, so
    the outputs are at most a bf16 rounding step apart."""
    x, w, b = torch.randn(77, 512).bfloat16(), _weight(96, 512), torch.randn(96).bfloat16()
    amx_tiles(True)
    tiles = _packed(kernels, x, w, b).float()
    amx_tiles(False)
    dot = _packed(kernels, x, w, b).float()
    step = tiles.abs().clamp(min=2**-20) * 2**-7  # bf16 spacing at each value (8-bit mantissa)
    assert ((tiles - dot).abs() <= step + 1e-6).all()


def test_linear_routes_by_rows_width_and_panels(kernels, amx_tiles, monkeypatch):
    """With the tiles: the panels' GEMV below AMX_MIN_ROWS rows, linear_packed with the
    panels from there. A width that is not a multiple of 32, or the tiles off, takes the
    panels' GEMV for the small-M rows (all of these); a weight without panels the
    small-M kernel. Without the bf16 dot product (no panels for bf16) the small-M kernel."""
    small, packed, gemv = [], [], []
    real_small, real_packed = kernels.linear_small_m, kernels.linear_packed
    real_gemv = kernels.linear_panels_small_m
    monkeypatch.setattr(
        kernels, "linear_small_m", lambda *a: small.append(a[1].shape[0]) or real_small(*a)
    )
    monkeypatch.setattr(
        kernels, "linear_packed", lambda *a: packed.append(a[1].shape[0]) or real_packed(*a)
    )
    monkeypatch.setattr(
        kernels, "linear_panels_small_m", lambda *a: gemv.append(a[1].shape[0]) or real_gemv(*a)
    )
    has_tiles = amx_tiles(True)
    w, ragged = _weight(48, 64), _weight(48, 48)
    bare = w.detach().clone()  # no panels
    for weight, rows in (
        (w, AMX_MIN_ROWS - 1),
        (w, AMX_MIN_ROWS),
        (ragged, AMX_MIN_ROWS),
        (bare, AMX_MIN_ROWS),
    ):
        x = torch.randn(rows, weight.shape[1]).bfloat16()
        torch.testing.assert_close(
            linear(x, weight).float(), F.linear(x.float(), weight.float()), **BF16_TOL
        )
    usual_small = [AMX_MIN_ROWS - 1, AMX_MIN_ROWS, AMX_MIN_ROWS, AMX_MIN_ROWS]  # <= 16 rows
    assert AMX_MIN_ROWS <= SMALL_M_MAX_ROWS
    if has_tiles:
        assert gemv == [AMX_MIN_ROWS - 1, AMX_MIN_ROWS]  # w below the tiles, ragged
        assert small == [AMX_MIN_ROWS] and packed == [AMX_MIN_ROWS]  # bare, w
    elif kernels.bf16_dot:
        assert gemv == usual_small[:3] and small == [AMX_MIN_ROWS] and packed == []
    else:
        assert small == usual_small and packed == [] and gemv == []


# rows: one pass of the GEMV's 7-row blocks and its tails (4 streams up to 3 rows, 2 from
# 4), several passes (15 = 7 + 7 + 1); K: odd (a zero-padded last pair), a multiple of
# 32, pairs the streams split with a rest, fewer pairs than streams; N: panel tails
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 15])
@pytest.mark.parametrize("k,n", [(30, 70), (64, 33), (1024, 96), (33, 32), (5, 9)])
def test_panels_gemv_is_float32_within_bf16(kernels, rows, k, n):
    """The panels' GEMV, over a shape-only weight (its values only in the panels), with
    rows strided as a view of a wider output, with and without a bias."""
    w = _weight(n, k)
    shape_only = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    x = torch.randn(rows, 2 * k)[:, :k].bfloat16()
    for bias in (None, torch.randn(n).bfloat16()):
        out = torch.empty(rows, n, dtype=torch.bfloat16)
        if not kernels.bf16_dot:  # a CPU without the bf16 dot product: a clear refusal
            with pytest.raises(RuntimeError, match="bf16 dot product"):
                kernels.linear_panels_small_m(out, x, shape_only, bias, getattr(w, PANELS_ATTR))
            continue
        kernels.linear_panels_small_m(out, x, shape_only, bias, getattr(w, PANELS_ATTR))
        want = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        torch.testing.assert_close(out.float(), want, **BF16_TOL)


def test_panels_gemv_refuses_panels_of_another_weight(kernels):
    x, w = torch.randn(2, 64).bfloat16(), _weight(96, 64)  # 3 panels, for 40 rows' 2
    out = torch.empty(2, 40, dtype=torch.bfloat16)
    refusal = "pack_weight_panels" if kernels.bf16_dot else "bf16 dot product"
    with pytest.raises(RuntimeError, match=refusal):
        kernels.linear_panels_small_m(out, x, torch.empty(40, 64, dtype=torch.bfloat16, device="meta"),
                                      None, getattr(w, PANELS_ATTR))  # fmt: skip


@pytest.mark.parametrize("rows", [1, AMX_MIN_ROWS - 1, AMX_MIN_ROWS, 40])
def test_linear_over_a_shape_only_weight(kernels, amx_tiles, rows):
    """linear() over a weight kept only as its panels: every row count, with the tiles on
    or off (the dot product reads the same panels), 3-D and non-contiguous inputs; a
    float32 input (float32 compute) gets float32's result from the same panels, a float16
    one is refused with a clear error, not computed from missing values."""
    from sglang.srt.layers.weight_panels import shape_only

    w = _weight(48, 64)
    param = shape_only(w, getattr(w, PANELS_ATTR))
    assert param.is_meta and param.shape == w.shape
    x = torch.randn(2, rows, 128)[..., ::2].bfloat16()  # [2, rows, 64], strided
    if not kernels.bf16_dot:  # never made shape-only there (weight_panels.attach)
        with pytest.raises(RuntimeError, match="kept only as its panels"):
            linear(x, param)
        return
    want = F.linear(x.float(), w.float())
    for on in (True, False):
        amx_tiles(on)
        torch.testing.assert_close(linear(x, param).float(), want, **BF16_TOL)
    torch.testing.assert_close(linear(x.float(), param), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="kept only as its panels"):
        linear(x.half(), param)
