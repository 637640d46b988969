"""bf16 linear weights packed once at load for linear_packed (layers/weight_panels.py):
the same results as the per-call panels, built where they are read, refused when wrong."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from sglang.demo_models import demo_target_path
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels, weight_panels
from sglang.srt.layers.linear import HALF_WEIGHT_MAX_ROWS, LinearBase, linear
from sglang.srt.layers.weight_panels import panels_of
from sglang.srt.model_loader.loader import get_model


@pytest.fixture(scope="module")
def kernels():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels did not build (see the log)"
    if module.weight_panel_width == 0:
        pytest.fail("this machine's build has no vector path (weight panels need AVX2)")
    return module


@pytest.mark.parametrize(
    "rows,k,n",
    # M tails, N tails, odd K (a zero-padded pair), two K blocks (K 704), several M blocks
    # (1100 rows at K 200), x packed in tiles (N >= 2048 on AVX2), one column, one row
    [
        (32, 256, 512),
        (13, 95, 7),
        (300, 64, 33),
        (1, 1, 1),
        (1100, 200, 70),
        (40, 704, 64),
        (65, 257, 4105),
        (7, 514, 2048),
    ],
)
def test_panels_packed_at_load_give_the_per_call_results(kernels, rows, k, n):
    """Same multiply-adds in the same order: bitwise the per-call panels' output, and
    within float32 rounding of F.linear over the widened weight; x rows strided."""
    x = torch.randn(rows, 2 * k)[:, :k]
    w = (torch.randn(n, k) / 8).bfloat16()
    panels = kernels.pack_weight_panels(w)
    width = kernels.weight_panel_width
    assert panels.shape == ((n + width - 1) // width, (k + 1) // 2, width)
    assert weight_panels._panel_bytes(w, width) == panels.numel() * panels.element_size()
    for bias in (None, torch.randn(n)):
        per_call, at_load = torch.empty(rows, n), torch.empty(rows, n)
        kernels.linear_packed(per_call, x, w, bias)
        kernels.linear_packed(at_load, x, w, bias, panels)
        assert torch.equal(at_load, per_call)
        torch.testing.assert_close(at_load, F.linear(x, w.float(), bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows,k,n", [(32, 256, 512), (13, 95, 7), (300, 64, 33), (40, 704, 70)])
def test_all_bf16_calls_read_the_same_panels(kernels, amx_tiles, rows, k, n):
    """bf16 x over bf16 W (the bf16 dot product where the build has it, else at::linear):
    the panels packed at load give bitwise the per-call result (AMX tiles off: they read
    the panels only, test_amx_tiles.py)."""
    amx_tiles(False)
    x = torch.randn(rows, 2 * k)[:, :k].bfloat16()
    w = (torch.randn(n, k) / 8).bfloat16()
    panels = kernels.pack_weight_panels(w)
    for bias in (None, torch.randn(n).bfloat16()):
        per_call, at_load = torch.empty(rows, n).bfloat16(), torch.empty(rows, n).bfloat16()
        kernels.linear_packed(per_call, x, w, bias)
        kernels.linear_packed(at_load, x, w, bias, panels)
        assert torch.equal(at_load, per_call)
        want = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        torch.testing.assert_close(at_load.float(), want, atol=2e-2, rtol=2e-2)


def test_wrong_panels_are_refused(kernels):
    x, w = torch.randn(40, 64), torch.randn(48, 64).bfloat16()
    other = kernels.pack_weight_panels(torch.randn(80, 64).bfloat16())
    with pytest.raises(RuntimeError, match="pack_weight_panels"):
        kernels.linear_packed(torch.empty(40, 48), x, w, None, other)
    with pytest.raises(RuntimeError, match="bfloat16 w under float32 or bfloat16 x"):
        half = torch.randn(48, 64).half()
        kernels.linear_packed(torch.empty(40, 48), x, half, None, kernels.pack_weight_panels(w))
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.pack_weight_panels(torch.randn(48, 64))


def test_the_scalar_build_has_no_panels():
    scalar = cpu_kernels.build_scalar()
    assert scalar.weight_panel_width == 0
    with pytest.raises(RuntimeError, match="AVX2"):
        scalar.pack_weight_panels(torch.randn(8, 8).bfloat16())


def test_linear_reads_a_weights_panels(kernels, monkeypatch):
    """linear() hands linear_packed the panels hanging off the weight."""
    seen = []
    real = kernels.linear_packed
    monkeypatch.setattr(kernels, "linear_packed", lambda *a: seen.append(len(a)) or real(*a))
    w = (torch.randn(24, 128) / 8).bfloat16()
    w.cpu_panels = kernels.pack_weight_panels(w)
    x = torch.randn(HALF_WEIGHT_MAX_ROWS + 5, 128)
    torch.testing.assert_close(linear(x, w), F.linear(x, w.float()), atol=1e-4, rtol=1e-4)
    assert seen == [5]


def test_loader_packs_the_demo_models_linears_and_lm_head(kernels, monkeypatch):
    """The bf16 demo checkpoint run in float32: every linear weight and the (tied) lm_head
    get panels at load; SGLANG_CPU_WEIGHT_PANELS=0 builds none."""
    config = ModelConfig(str(demo_target_path()), dtype=torch.float32)  # the CPU default
    model = get_model(config, "cpu")
    linears = [m.weight for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(panels_of(w) is not None for w in linears)
    assert panels_of(model.lm_head.weight) is not None
    monkeypatch.setenv("SGLANG_CPU_WEIGHT_PANELS", "0")
    bare = get_model(config, "cpu")
    assert all(panels_of(m.weight) is None for m in bare.modules() if isinstance(m, LinearBase))


def test_bf16_compute_packs_panels_where_the_dot_product_reads_them(
    kernels, monkeypatch, amx_tiles
):
    """The bf16 demo checkpoint run in bf16: panels on every linear weight where the build
    has the bf16 dot product (linear_packed reads them past the small-M rows, on the
    dot product or on AMX tiles), none elsewhere; linear() hands them over, with the
    per-call result (the dot product: AMX tiles off here, test_amx_tiles.py has them)."""
    amx_tiles(False)
    config = ModelConfig(str(demo_target_path()), dtype=torch.bfloat16)
    model = get_model(config, "cpu")
    linears = [m.weight for m in model.modules() if isinstance(m, LinearBase)]
    assert all((panels_of(w) is not None) == kernels.bf16_dot for w in linears)
    if not kernels.bf16_dot:
        return
    monkeypatch.setenv("SGLANG_CPU_WEIGHT_PANELS", "0")
    rows_model = get_model(config, "cpu")  # the row-major weights, no panels
    seen = []
    real = kernels.linear_packed
    monkeypatch.setattr(kernels, "linear_packed", lambda *a: seen.append(len(a)) or real(*a))
    w = linears[0]
    w_rows = next(m.weight for m in rows_model.modules() if isinstance(m, LinearBase))
    x = torch.randn(64, w.shape[1]).bfloat16()
    out = linear(x, w)
    assert seen == [5]
    per_call = torch.empty_like(out)
    real(per_call, x, w_rows, None)
    assert torch.equal(out, per_call)


def test_panels_over_the_memory_budget_are_not_packed(kernels, monkeypatch, caplog):
    """A second copy of the weights that would take more than a quarter of the available
    memory is not made: the calls pack per call, with the same results."""
    config = ModelConfig(str(demo_target_path()), dtype=torch.float32)
    monkeypatch.setattr(weight_panels, "MAX_AVAILABLE_FRACTION", 1e-9)
    with caplog.at_level(logging.INFO, logger=weight_panels.__name__):
        model = get_model(config, "cpu")
    assert all(panels_of(m.weight) is None for m in model.modules() if isinstance(m, LinearBase))
    assert "not packed" in caplog.text


def test_amx_bf16_linears_keep_only_their_panels(kernels, amx_tiles):
    """bf16 compute where the kernels have the bf16 dot product (panels for every linear):
    every linear weight, and the lm_head tied to the embedding, becomes shape-only (meta,
    no bytes), carrying its panels: linear() gives the row-major weight's results with
    the tiles on and off, the embedding's lookups bitwise its rows. Elsewhere every weight
    keeps its rows."""
    config = ModelConfig(str(demo_target_path()), dtype=torch.bfloat16)
    with envs.SGLANG_CPU_WEIGHT_PANELS.override(False):
        rows_model = get_model(config, "cpu")
    amx_tiles(True)
    model = get_model(config, "cpu")
    has_tiles = kernels.bf16_dot  # weights kept only as panels
    pairs = [
        (m, r)
        for m, r in zip(model.modules(), rows_model.modules(), strict=True)
        if isinstance(m, LinearBase)
    ]
    assert all(m.weight.is_meta == has_tiles for m, _ in pairs)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert model.lm_head.weight.is_meta == has_tiles and not rows_model.lm_head.weight.is_meta
    ids = torch.tensor([[0, 1, 31, 32, 33], [4000, 8191, 7, 7, 100]])
    want_rows = rows_model.model.embed_tokens(ids)
    assert torch.equal(model.model.embed_tokens(ids), want_rows)
    hidden = want_rows[0]
    torch.testing.assert_close(
        linear(hidden, model.lm_head.weight).float(),
        F.linear(hidden.float(), rows_model.lm_head.weight.float()),
        atol=2e-2, rtol=2e-2,
    )  # fmt: skip
    for on in (True, False):
        amx_tiles(on)
        for m, r in pairs:
            for rows in (3, 40):  # the GEMV; the tiles or the dot product
                x = torch.randn(rows, m.weight.shape[1]).bfloat16()
                want = F.linear(x.float(), r.weight.float())
                got = linear(x, m.weight).float()
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_attaching_twice_keeps_the_panels(kernels, amx_tiles):
    """A second attach (a model loaded once, packed again) leaves weights already kept
    only as their panels as they are, instead of packing a shape-only tensor."""
    config = ModelConfig(str(demo_target_path()), dtype=torch.bfloat16)
    model = get_model(config, "cpu")
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    before = {id(m): (m.weight, panels_of(m.weight)) for m in linears if m.weight.is_meta}
    assert bool(before) == kernels.bf16_dot
    weight_panels.attach(model, torch.bfloat16)
    for m in linears:
        if id(m) in before:
            weight, panels = before[id(m)]
            assert m.weight is weight and panels_of(m.weight) is panels
