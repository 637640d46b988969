"""Tensor-parallel linear layers.

Each parameter carries a `weight_loader(param, loaded_weight, shard_id=None)`
that copies this rank's shard of a checkpoint tensor into it; stacked layers
(qkv, gate_up) take a `shard_id` naming the sub-matrix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import cpu_kernels

# Row counts that take the small-M kernel on CPU (see `linear`): at most this many rows,
# or up to LONG_K_MAX_ROWS when the input is at least LONG_K wide. Measured against
# F.linear at 2 threads with the weights coming from memory, as in a forward
# (benchmark/RESULTS.md): [1024-3072]-wide float32 weights 1.5-2.1x faster at 4-32 rows,
# 1.0-1.9x at 128; 256-wide ones only up to 16 rows (slower past 32). Over bf16 weights
# the kernel reads half the bytes and F.linear must widen them first (a copy of the
# whole weight per call), so a half weight under float32 takes the kernel up to
# HALF_WEIGHT_MAX_ROWS rows whatever its width, and linear_packed past them (a panel
# widened at a time): on demo-model shapes at 2 threads linear_packed is 1.0-1.4x faster
# than linear_small_m from 32 rows and 2-4x faster than widen + F.linear at 32-64
# (AVX-512 Xeon, benchmark/RESULTS.md).
SMALL_M_MAX_ROWS = 16
LONG_K = 1024
LONG_K_MAX_ROWS = 128
HALF_WEIGHT_MAX_ROWS = 24
# Past this many rows (prefill chunks) on AVX-512, MKL over a float32 copy of a half weight
# beats linear_packed: 1.3-1.7x at 2048 rows, even at 128-512, on the demo shapes (Xeon,
# 2 threads); on the AVX2 EPYC linear_packed was the faster at every size.
PACKED_MAX_ROWS_AVX512 = 256
HALF_WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
# bf16 x over a bf16 weight where the kernels multiply on AMX tiles (`amx_rows`): the
# panels' GEMV (linear_panels_small_m) below this many rows, linear_packed (the tiles)
# from there, both over the load-time panels, so such a weight needs no row-major copy
# (weight_panels.py keeps it shape-only). On a 2-core Sapphire Rapids-class Xeon
# (Qwen3-0.6B shapes, 2 threads) one-row calls on the tiles took 1.3-1.7x the small-M
# kernel's time, even at 4 rows, the tiles were 1.6-2.0x faster at 8 and 4-6.6x at 32,
# and the GEMV over the panels runs one row in 0.79-0.97x and four in 0.9-1.1x the
# small-M kernel's time over the row-major weight (benchmark/RESULTS.md).
AMX_MIN_ROWS = 8
AMX_K_MULTIPLE = 32  # a tile step's K: narrower or ragged inputs take the dot product
# A weight's panels packed at load for linear_packed hang off it under this attribute
# (layers/weight_panels.py builds them).
PANELS_ATTR = "cpu_panels"


def tensor_parallel_all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Sum `x` over the TP group; a no-op at tp_size 1 (no process group needed)."""
    if tp_size == 1:
        return x
    from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; on CPU a decode-size batch takes our kernel, which reads each weight row
    once for all rows (MKL re-reads the [out, in] weight per row at small M). A weight
    kept in a half checkpoint's dtype under float32 compute (see
    `model_loader.loader.half_weight_dtype`) is widened by our kernels as they load it
    (see `_kernel_for`), or here when neither serves the call."""
    if weight.is_meta:  # shape-only: its values are in its panels (weight_panels.py)
        return _linear_from_panels(x, weight, bias)
    kernel, reads_panels = _kernel_for(x, weight, bias)
    if kernel is not None:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        if reads_panels:
            kernel(out, x, weight, bias, getattr(weight, PANELS_ATTR, None))
        else:
            kernel(out, x, weight, bias)
        return out
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return F.linear(x, weight, bias)


def embedding_rows(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.embedding(ids, weight), also for a shape-only weight (an embedding tied to an
    lm_head that keeps only its panels, weight_panels.py): the rows are gathered from the
    panels, where row n's pair p is the word [n // width, p, n % width] (its low half is
    element 2p, its high half 2p + 1), bitwise the rows' values."""
    if not weight.is_meta:
        return F.embedding(ids, weight)
    panels = getattr(weight, PANELS_ATTR)  # [ceil(N / width), ceil(K / 2), width] int32
    width = panels.shape[2]
    words = panels[ids // width, :, ids % width]  # [*ids.shape, ceil(K / 2)]
    return words.contiguous().view(torch.bfloat16)[..., : weight.shape[1]]


def _linear_from_panels(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """linear() over a shape-only weight, whose values only its panels hold: x made a
    contiguous [rows, K] if it is not, then `panels_kernel`."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    kernels = cpu_kernels.load()
    served = kernels is not None and (
        (x.dtype == torch.bfloat16 and kernels.bf16_dot)
        or (x.dtype == torch.float32 and kernels.weight_panel_width > 0)
    )
    if not served:
        raise RuntimeError(
            f"a {tuple(weight.shape)} weight kept only as its panels serves bfloat16 inputs "
            f"on the kernels' bf16 dot product and float32 inputs on their vector build, "
            f"not this {x.dtype} input"
        )
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype)
    # (None: a float32 call F.linear would serve from the rows, which are not kept)
    kernel = panels_kernel(kernels, rows.shape[0], rows.shape[1], x.dtype) or kernels.linear_packed
    kernel(out, rows, weight, bias, getattr(weight, PANELS_ATTR))
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _kernel_for(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """(our kernel for this call or None, whether it is linear_packed, which reads the
    weight's load-time panels where it has them): linear_small_m for the rows `small_m_rows`
    gives it; past them, linear_packed for bf16 x over bf16 weights where the kernels have
    the AVX-512 bf16 dot product, and for a half weight under float32 (it widens a panel
    at a time instead of F.linear's whole-weight copy per call), except past
    PACKED_MAX_ROWS_AVX512 rows on AVX-512, where MKL over the widened weight is faster.
    Where the kernels have AMX tiles, `amx_rows` routes all-bf16 calls over panels."""
    if x.dim() != 2 or x.stride(1) != 1 or not weight.is_contiguous():
        return None, False
    half_under_float = x.dtype == torch.float32 and weight.dtype in HALF_WEIGHT_DTYPES
    dtypes_ok = weight.dtype == x.dtype or half_under_float
    if not dtypes_ok or (bias is not None and bias.dtype != x.dtype) or not cpu_kernels.usable(x):
        return None, False
    kernels = cpu_kernels.load()
    has_panels = getattr(weight, PANELS_ATTR, None) is not None
    all_bf16 = x.dtype == weight.dtype == torch.bfloat16
    # bf16 inputs read panels only through the bf16 dot product (AVX-512 bf16)
    if has_panels and ((all_bf16 and kernels.bf16_dot) or half_under_float):
        kernel = panels_kernel(kernels, x.shape[0], x.shape[1], x.dtype)
        if kernel is not None:
            return kernel, True
    if small_m_rows(x.shape[0], x.shape[1], half_under_float):
        return kernels.linear_small_m, False
    if kernels.bf16_dot and x.dtype == weight.dtype == torch.bfloat16:
        # bf16 dot products: 1.1-3x oneDNN's bf16 at 16-256 rows; reads load-time panels
        return kernels.linear_packed, True
    if not half_under_float:
        return None, False
    if widened_weight_serves(kernels, x.shape[0]):
        return None, False  # widened, then F.linear
    return kernels.linear_packed, True


def panels_kernel(kernels, rows: int, width: int, dtype: torch.dtype = torch.bfloat16):
    """The kernel for a call of `rows` x `width` inputs in `dtype` over a bf16 weight with
    load-time panels, reading only the panels (the rule decoder_layer.cpp applies too).

    bf16 inputs (the panels exist for bf16 compute only where the kernels have the bf16
    dot product): where the tiles serve (`amx_rows`) the panels' GEMV below AMX_MIN_ROWS
    rows and the tiles from there; elsewhere the GEMV for the rows `small_m_rows` gives
    (0.64-0.8x the small-M kernel's time over the row-major weight at 1-8 rows, 0.9-1.0x
    at 32-128, Qwen3-0.6B's projections, cold, AMX off on the Xeon) and linear_packed's
    dot product past them.

    float32 inputs (a bf16 checkpoint under float32 compute): the GEMV for the rows
    `small_m_rows` gives a half weight, linear_packed's tiles past them; None past
    PACKED_MAX_ROWS_AVX512 rows on AVX-512, where MKL over the widened row-major weight
    is faster (a weight kept only as its panels takes linear_packed there too)."""
    if dtype == torch.float32:
        if small_m_rows(rows, width, True):
            return kernels.linear_panels_small_m
        return None if widened_weight_serves(kernels, rows) else kernels.linear_packed
    if kernels.amx_tiles() and width % AMX_K_MULTIPLE == 0:
        small = rows < AMX_MIN_ROWS
    else:
        small = small_m_rows(rows, width, False)
    return kernels.linear_panels_small_m if small else kernels.linear_packed


def widened_weight_serves(kernels, rows: int | None = None) -> bool:
    """Whether F.linear over the widened row-major weight serves a float32 call of `rows`
    rows over a half weight (MKL beats linear_packed past PACKED_MAX_ROWS_AVX512 rows on
    AVX-512; linear_packed is the faster at every size on AVX2); `rows` None: some call's
    row count would, so such a weight's rows are read."""
    if kernels.vector_isa != "avx512":
        return False
    return rows is None or rows > PACKED_MAX_ROWS_AVX512


def amx_rows(kernels, width: int, weight: torch.Tensor) -> bool:
    """Whether all-bf16 calls over `weight` with inputs `width` wide take the AMX routing
    (the panels' GEMV below AMX_MIN_ROWS, the tiles from there): the kernels have the tiles, the
    weight has its load-time panels, the width is a multiple of AMX_K_MULTIPLE (the rule
    decoder_layer.cpp applies too)."""
    return (
        width % AMX_K_MULTIPLE == 0
        and getattr(weight, PANELS_ATTR, None) is not None
        and kernels.amx_tiles()
    )


def small_m_rows(rows: int, width: int, half_under_float: bool) -> bool:
    """Whether a call of `rows` x `width` inputs takes the small-M kernel (the rule
    decoder_layer.cpp applies too, with these constants)."""
    if half_under_float and rows <= HALF_WEIGHT_MAX_ROWS:
        return True
    return rows <= SMALL_M_MAX_ROWS or (width >= LONG_K and rows <= LONG_K_MAX_ROWS)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch for {what}: model {tuple(param.shape)}, "
            f"checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    def __init__(self, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        self.tp_rank = tp_rank
        self.tp_size = tp_size

    def _attach(self, param: nn.Parameter, loader) -> nn.Parameter:
        param.weight_loader = loader
        return param


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp) -> None:
        super().__init__(**tp)
        self.weight = self._attach(_param(output_size, input_size), self.weight_loader)
        self.bias = self._attach(_param(output_size), self.weight_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        _copy_checked(param, loaded, "replicated linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """y = x W^T with W split along the output dim; each rank holds output_size/tp rows."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp) -> None:
        super().__init__(**tp)
        assert output_size % self.tp_size == 0, (output_size, self.tp_size)
        self.output_size_per_partition = output_size // self.tp_size
        rows = self.output_size_per_partition
        self.weight = self._attach(_param(rows, input_size), self.weight_loader)
        self.bias = self._attach(_param(rows), self.weight_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        rows = param.shape[0]
        _copy_checked(param, loaded.narrow(0, self.tp_rank * rows, rows), "column linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stacked on the output dim (e.g. gate_up)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, **tp):
        super().__init__(input_size, sum(output_sizes), bias, **tp)
        self.output_sizes = output_sizes

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        assert shard_id is not None, "merged linear needs a shard id"
        tp = self.tp_size
        size = self.output_sizes[shard_id] // tp
        offset = sum(self.output_sizes[:shard_id]) // tp
        shard = loaded.narrow(0, self.tp_rank * size, size)
        _copy_checked(param.data.narrow(0, offset, size), shard, f"merged shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections stacked; KV heads are replicated when fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        **tp,
    ) -> None:
        tp_size = tp.get("tp_size", 1)
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, out, bias, **tp)

    def _shard_layout(self, shard_id: str) -> tuple[int, int, int]:
        """(offset in the param, rows, first row in the checkpoint tensor) of a shard."""
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            return 0, q_rows, self.tp_rank * q_rows
        kv_start = (self.tp_rank // self.kv_replicas) * kv_rows
        offset = q_rows if shard_id == "k" else q_rows + kv_rows
        return offset, kv_rows, kv_start

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        assert shard_id in ("q", "k", "v"), shard_id
        offset, rows, start = self._shard_layout(shard_id)
        shard = loaded.narrow(0, start, rows)
        _copy_checked(param.data.narrow(0, offset, rows), shard, f"qkv shard {shard_id}")


class RowParallelLinear(LinearBase):
    """y = x W^T with W split along the input dim; partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp) -> None:
        super().__init__(**tp)
        assert input_size % self.tp_size == 0, (input_size, self.tp_size)
        cols = input_size // self.tp_size
        self.weight = self._attach(_param(output_size, cols), self.weight_loader)
        self.bias = self._attach(_param(output_size), self._bias_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        cols = param.shape[1]
        _copy_checked(param, loaded.narrow(1, self.tp_rank * cols, cols), "row linear")

    def _bias_loader(self, param, loaded, shard_id=None) -> None:
        _copy_checked(param, loaded, "row linear bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = tensor_parallel_all_reduce(linear(x, self.weight), self.tp_size)
        return out if self.bias is None else out + self.bias
