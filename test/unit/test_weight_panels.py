"""bf16 linear weights packed once at load for linear_packed (layers/weight_panels.py):
the same results as the per-call panels, built where they are read, refused when wrong;
the GEMV over them for float32 inputs; weights kept only as their panels under float32
compute where every call reads them (the AVX2 build)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sglang.demo_models import demo_target_path
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels, weight_panels
from sglang.srt.layers.linear import HALF_WEIGHT_MAX_ROWS, LinearBase, embedding_rows, linear
from sglang.srt.layers.weight_panels import panels_of, shape_only
from sglang.srt.model_loader.loader import get_model


@pytest.fixture(scope="module")
def kernels():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels did not build (see the log)"
    if module.weight_panel_width == 0:
        pytest.fail("this machine's build has no vector path (weight panels need AVX2)")
    return module


def _cpu_runs_avx2() -> bool:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {"avx2", "fma", "f16c"} <= flags


# The kernels this machine builds, and on an AVX-512 machine the AVX2 build too (what
# laptops and Zen 2/3 run): its GEMV is another code path (16 ymm registers, 2 KiB word
# rows per stream step), not run here otherwise.
GEMV_BUILDS = ["native"] + (["x86-64-v3"] if _cpu_runs_avx2() else [])


@pytest.fixture(scope="module", params=GEMV_BUILDS)
def gemv_kernels(request, kernels):
    if request.param == "native":
        return kernels
    module = cpu_kernels.build_for_march(request.param)
    assert module.vector_isa == "avx2" and module.weight_panel_width == 16
    return module


@pytest.mark.parametrize(
    "rows,k,n",
    # every row count of a pass and past it (2 passes, a tail), N tails (one column, a
    # partial second vector), odd K (the last word's zero pad), K too short for 4 streams,
    # parts that leave a rest, a long K
    [(r, 256, 512) for r in (1, 2, 3, 4, 5, 6, 7, 12, 13, 24)]
    + [(1, 1, 1), (3, 3, 5), (2, 7, 9), (4, 95, 40), (1, 257, 100), (5, 704, 256),
       (1, 3072, 64), (8, 1030, 33)],
)  # fmt: skip
def test_panels_gemv_for_float32_inputs(gemv_kernels, rows, k, n):
    """linear_panels_small_m with float32 x over a bf16 weight's panels (float32 compute):
    F.linear over the widened weight within float32 rounding, strided x, with and without
    bias; a shape-only weight gives bitwise the same (its values are not read)."""
    x = torch.randn(rows, 2 * k)[:, :k]
    w = (torch.randn(n, k) / 8).bfloat16()
    panels = gemv_kernels.pack_weight_panels(w)
    meta = torch.empty(w.shape, dtype=w.dtype, device="meta")
    for bias in (None, torch.randn(n)):
        out, from_meta = torch.empty(rows, n), torch.empty(rows, n)
        gemv_kernels.linear_panels_small_m(out, x, w, bias, panels)
        gemv_kernels.linear_panels_small_m(from_meta, x, meta, bias, panels)
        assert torch.equal(out, from_meta)
        want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        torch.testing.assert_close(out, want.float(), atol=1e-4, rtol=1e-4)


def test_panels_gemv_refuses_mixed_dtypes(kernels):
    w = torch.randn(8, 16).bfloat16()
    panels = kernels.pack_weight_panels(w)
    with pytest.raises(RuntimeError, match="both bfloat16 or both float32"):
        kernels.linear_panels_small_m(torch.empty(2, 8).bfloat16(), torch.randn(2, 16), w, None,
                                      panels)  # fmt: skip
    with pytest.raises(RuntimeError, match="pack_weight_panels"):
        other = kernels.pack_weight_panels(torch.randn(40, 16).bfloat16())
        kernels.linear_panels_small_m(torch.empty(2, 8), torch.randn(2, 16), w, None, other)


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
    memory is not made: the calls pack per call, with the same results. (Where every
    call reads the panels, AVX2, they replace the rows instead: no second copy exists.)"""
    config = ModelConfig(str(demo_target_path()), dtype=torch.float32)
    monkeypatch.setattr(weight_panels, "MAX_AVAILABLE_FRACTION", 1e-9)
    with caplog.at_level(logging.INFO, logger=weight_panels.__name__):
        model = get_model(config, "cpu")
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    with_rows = [m.weight for m in linears if not m.weight.is_meta]
    assert all(panels_of(w) is None for w in with_rows)  # no copy beside the rows
    if weight_panels.widened_weight_serves(kernels):  # AVX-512: the copies were refused
        assert with_rows and "not packed" in caplog.text
    else:  # AVX2: every linear weight kept only as its panels, none beside rows
        assert not with_rows


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


def _float32_model(kernels, monkeypatch, vector_isa: str):
    """The bf16 demo checkpoint loaded for float32 compute as on a build of `vector_isa`
    (the routing rule reads kernels.vector_isa; the kernels themselves are this build's)."""
    monkeypatch.setattr(kernels, "vector_isa", vector_isa)
    try:
        return get_model(ModelConfig(str(demo_target_path()), dtype=torch.float32), "cpu")
    finally:
        monkeypatch.undo()


def test_float32_compute_keeps_only_panels_on_avx2(kernels, monkeypatch):
    """float32 compute over the bf16 demo checkpoint: on the AVX2 build every linear weight
    and the lm_head tied to the embedding keep only their panels (every call reads them:
    the GEMV, then linear_packed at every row count): linear() gives the row-major
    weight's float32 results at every row count, the embedding's lookups are bitwise its
    rows. On AVX-512 (MKL over the rows serves prefill-size calls) both are kept."""
    config = ModelConfig(str(demo_target_path()), dtype=torch.float32)
    with envs.SGLANG_CPU_WEIGHT_PANELS.override(False):
        rows_model = get_model(config, "cpu")
    model = _float32_model(kernels, monkeypatch, "avx2")
    pairs = [(m, r) for m, r in zip(model.modules(), rows_model.modules(), strict=True)
             if isinstance(m, LinearBase)]  # fmt: skip
    assert pairs and all(m.weight.is_meta and panels_of(m.weight) is not None for m, _ in pairs)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.is_meta
    ids = torch.tensor([[0, 1, 31, 32, 33], [4000, 8191, 7, 7, 100]])
    embedded = model.model.embed_tokens(ids)
    assert embedded.dtype == torch.float32
    assert torch.equal(embedded, rows_model.model.embed_tokens(ids))
    for m, r in pairs + [(model.lm_head, rows_model.lm_head)]:
        for rows in (1, 3, HALF_WEIGHT_MAX_ROWS, 40, 300):  # the GEMV, linear_packed
            x = torch.randn(rows, m.weight.shape[1])
            want = F.linear(x.double(), r.weight.double()).float()
            torch.testing.assert_close(linear(x, m.weight), want, atol=1e-4, rtol=1e-4)
    avx512 = _float32_model(kernels, monkeypatch, "avx512")
    linears = [m.weight for m in avx512.modules() if isinstance(m, LinearBase)]
    assert all(not w.is_meta and panels_of(w) is not None for w in linears)


def test_a_shape_only_weights_rows_come_back_from_its_panels(kernels):
    """embedding_rows over every id rebuilds a shape-only weight's rows bitwise (odd K,
    an N tail): what a reader needing the values (a weight update check) can use."""
    w = torch.randn(37, 21).bfloat16()
    param = shape_only(w, kernels.pack_weight_panels(w))
    assert torch.equal(embedding_rows(torch.arange(37), param), w)
