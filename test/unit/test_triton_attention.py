"""The triton attention backend against torch_native, in the Triton interpreter on CPU.

Both backends run on the same pools (random page tables, page size 1 and 4) and must
agree to 1e-4 in float32: extend over prefixes of 0..N with mixed lengths in a batch,
the speculative verify shape (k + 1 new tokens per request), decode split over the KV
length, GQA 1:1 / 4:1 / 8:1 (and a group wider than one program's heads), head_dim 48,
64 and 128, sliding windows and logit caps. Then the tiny Llama gives the same greedy
tokens with either backend.

TRITON_INTERPRET must be set before a kernel module is imported (kernels are built at
import): nothing else in the test suite imports `triton_ops`.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402

TOL = 1e-4
CPU = torch.device("cpu")


@dataclass
class _Runner:
    device: torch.device = CPU


@dataclass
class Pools:
    """A batch's pools: request b owns table row rows[b], positions [0, lens[b])."""

    req_to_token: ReqToTokenPool
    kv: MHATokenToKVPool
    rows: list[int]


def make_pools(lens: list[int], hkv: int, d: int, page_size: int, gen) -> Pools:
    """Random pages (never page 0, the padding page) in random table rows; random K/V."""
    pages_per_req = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per_req) + 3  # spare pages stay random garbage, never read
    kv = MHATokenToKVPool(num_pages * page_size, torch.float32, hkv, d, 1, "cpu", page_size)
    kv.kv_buffer[0][page_size:] = torch.randn(kv.kv_buffer[0][page_size:].shape, generator=gen)
    table = ReqToTokenPool(len(lens) + 3, max(lens) + page_size, "cpu")
    rows = torch.randperm(table.size, generator=gen)[: len(lens)].tolist()
    pages = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    for row, n, count in zip(rows, lens, pages_per_req):
        mine, pages = torch.tensor(pages[:count]), pages[count:]
        slots = (mine.repeat_interleave(page_size) * page_size).add_(
            torch.arange(page_size).repeat(count)
        )
        table.req_to_token[row, :n] = slots[:n].to(torch.int32)
    return Pools(table, kv, rows)


def extend_batch(pools: Pools, prefix: list[int], extend: list[int]) -> ForwardBatch:
    """An EXTEND batch adding positions [prefix, prefix + extend) of each request."""
    seq = [p + e for p, e in zip(prefix, extend)]
    table = pools.req_to_token.req_to_token
    out_loc = torch.cat([table[r, p:s] for r, p, s in zip(pools.rows, prefix, seq)])
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)])
    return _batch(pools, ForwardMode.EXTEND, seq, out_loc, positions, prefix, extend)


def decode_batch(pools: Pools, seq: list[int]) -> ForwardBatch:
    """A DECODE batch adding position seq - 1 of each request."""
    table = pools.req_to_token.req_to_token
    out_loc = torch.stack([table[r, s - 1] for r, s in zip(pools.rows, seq)])
    return _batch(pools, ForwardMode.DECODE, seq, out_loc, torch.tensor(seq) - 1)


def _batch(pools, mode, seq, out_loc, positions, prefix=None, extend=None) -> ForwardBatch:
    return ForwardBatch(
        forward_mode=mode,
        batch_size=len(seq),
        input_ids=torch.zeros(len(positions), dtype=torch.int64),
        positions=positions,
        req_pool_indices=torch.tensor(pools.rows, dtype=torch.int64),
        seq_lens=torch.tensor(seq, dtype=torch.int64),
        out_cache_loc=out_loc.to(torch.int64),
        seq_lens_cpu=list(seq),
        extend_seq_lens_cpu=extend,
        extend_prefix_lens_cpu=prefix,
        req_to_token_pool=pools.req_to_token,
        token_to_kv_pool=pools.kv,
    )


def triton_backend(**kw) -> TritonAttnBackend:
    # small splits, so short test contexts still split (and hit the split cap)
    return TritonAttnBackend(_Runner(), **{"max_kv_splits": 4, "min_keys_per_split": 8} | kw)


def run_both(fb: ForwardBatch, layer: RadixAttention, gen, triton=None) -> None:
    """torch_native then triton on the same batch and pools; their outputs must agree."""
    t, hq, hkv, d = len(fb.positions), layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
    q = torch.randn(t, hq * d, generator=gen)
    k, v = torch.randn(t, hkv * d, generator=gen), torch.randn(t, hkv * d, generator=gen)
    outs = []
    for backend in (TorchNativeAttnBackend(_Runner()), triton or triton_backend()):
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k, v, layer, fb))
    torch.testing.assert_close(outs[1], outs[0], atol=TOL, rtol=0)


def check_extend_then_decode(shape, prefix, extend, page_size, window=None, cap=None):
    """An extend step, then a decode step on top of it, on one set of pools."""
    hq, hkv, d = shape
    gen = torch.Generator().manual_seed(hq * 1000 + d + page_size)
    seq = [p + e for p, e in zip(prefix, extend)]
    pools = make_pools([s + 1 for s in seq], hkv, d, page_size, gen)
    layer = RadixAttention(hq, d, d**-0.5, hkv, 0, sliding_window_size=window, logit_cap=cap)
    run_both(extend_batch(pools, prefix, extend), layer, gen)
    run_both(decode_batch(pools, [s + 1 for s in seq]), layer, gen)


# (Hq, Hkv, head_dim): GQA 1:1, 4:1 and 8:1, each head_dim twice
SHAPES = [(4, 4, 64), (4, 4, 128), (8, 2, 48), (8, 2, 128), (8, 1, 48), (8, 1, 64)]
# prefixes of 0..N, extends of 1 to past one 32-row query block, mixed in one batch
MIXED_PREFIX, MIXED_EXTEND = [0, 1, 7, 19, 0], [5, 33, 1, 4, 40]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}q{s[1]}kv-d{s[2]}")
def test_extend_and_decode_match_torch_native(shape, page_size):
    check_extend_then_decode(shape, MIXED_PREFIX, MIXED_EXTEND, page_size)


@pytest.mark.parametrize("page_size", [1, 4])
def test_verify_shape_matches(page_size):
    """Speculative verify: k + 1 = 4 new tokens per request on cached prefixes."""
    check_extend_then_decode((8, 2, 64), [3, 17, 30], [4, 4, 4], page_size)


@pytest.mark.parametrize("window, cap", [(6, None), (None, 30.0), (20, 5.0)])
def test_sliding_window_and_logit_cap_match(window, cap):
    """Windows shorter and longer than a query block; prefixes longer than the window."""
    check_extend_then_decode((8, 2, 64), [0, 25, 9], [40, 3, 12], 4, window, cap)


def test_decode_group_wider_than_one_program():
    """24 query heads per KV head: two programs per KV head, the second part-masked."""
    gen = torch.Generator().manual_seed(7)
    seq = [3, 50, 17]
    pools = make_pools(seq, 2, 64, 1, gen)
    layer = RadixAttention(48, 64, 0.125, 2, 0)
    run_both(decode_batch(pools, seq), layer, gen)


def test_decode_without_splitting_matches():
    """The GPU defaults: one split per 256 keys, so every short request has one."""
    gen = torch.Generator().manual_seed(3)
    seq = [1, 30, 9]
    pools = make_pools(seq, 2, 64, 4, gen)
    layer = RadixAttention(8, 64, 0.125, 2, 0)
    run_both(decode_batch(pools, seq), layer, gen, TritonAttnBackend(_Runner()))


# ---- choosing the backend ----------------------------------------------------------


def test_resolver_picks_only_what_can_run():
    """Without flashinfer installed here: torch_native on cpu, triton on cuda (the full
    table, flashinfer included, is in test_attention_support.py)."""
    from sglang.srt.arg_groups.resolvers import resolve_attention_backend

    def resolved(device: str) -> str:
        view = SimpleNamespace(
            attention_backend=None, device=device, dtype="bfloat16", kv_cache_dtype="auto",
            model_path="org/model",
        )  # fmt: skip
        return resolve_attention_backend(view)[1]["attention_backend"]

    assert (resolved("cpu"), resolved("cuda")) == ("torch_native", "triton")
    explicit = SimpleNamespace(attention_backend="torch_native", device="cuda")
    assert resolve_attention_backend(explicit) is None


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    from sglang.srt.server_args import ServerArgs

    monkeypatch.delenv("TRITON_INTERPRET")
    args = {"model_path": "org/model", "device": "cpu", "attention_backend": "triton"}
    with pytest.raises(ValueError, match=r"attention_backend='triton'.*TRITON_INTERPRET=1"):
        ServerArgs(**args).resolve_once()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        TritonAttnBackend(_Runner())
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ServerArgs(**args).resolve_once().attention_backend == "triton"


@pytest.mark.parametrize("field", ["attention_backend", "speculative_draft_attention_backend"])
def test_flashinfer_on_cpu_is_an_error_at_launch(field):
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match=rf"{field}='flashinfer' cannot run on cpu"):
        ServerArgs(model_path="org/model", device="cpu", **{field: "flashinfer"}).resolve_once()


def test_cuda_graph_decode_metadata_matches_eager():
    """The static-buffer path a CUDA graph replays (here run eagerly, in the interpreter):
    a batch padded to a captured size gives the real rows the eager outputs."""
    gen = torch.Generator().manual_seed(11)
    seq = [5, 40, 17]
    pools = make_pools(seq + [1], 2, 64, 4, gen)  # a spare row 3 for the padding row
    layer = RadixAttention(8, 64, 0.125, 2, 0, sliding_window_size=9)
    runner = _Runner()
    runner.model = torch.nn.ModuleList([layer])
    eager, graphed = triton_backend(), TritonAttnBackend(runner, 4, 8)
    graphed.init_cuda_graph_state(max_bs=8)
    fb = decode_batch(pools, seq)
    q, k, v = (torch.randn(3, n * 64, generator=gen) for n in (8, 2, 2))
    eager.init_forward_metadata(fb)
    want = eager.forward(q, k, v, layer, fb)
    padded = _batch(pools, ForwardMode.DECODE, seq + [1], torch.cat([fb.out_cache_loc, torch.zeros(1, dtype=torch.int64)]), torch.tensor(seq + [1]) - 1)  # fmt: skip
    graphed.init_forward_metadata_capture_cuda_graph(padded)
    graphed.init_forward_metadata_replay_cuda_graph(padded)
    pad = lambda x: torch.cat([x, torch.zeros(1, x.shape[1])])  # noqa: E731
    got = graphed.forward(pad(q), pad(k), pad(v), layer, padded)
    torch.testing.assert_close(got[:3], want, atol=TOL, rtol=0)
    assert (
        graphed.metadata.num_kv_splits[9].data_ptr() == graphed._graph.num_kv_splits[9].data_ptr()
    )


# ---- a whole model -----------------------------------------------------------------


def test_tiny_llama_greedy_matches_torch_native(tiny_llama_dir):
    """Greedy tokens (prefill + decode) and a two-chunk prefill's logits agree."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context
    from sglang.test.runner_utils import MiniReq, MiniScheduler

    model_dir = str(tiny_llama_dir)
    prompts = [list(range(10, 47)), [7, 8, 9], list(range(100, 120))]
    tokens, logits = {}, {}
    for backend in ("torch_native", "triton"):
        with get_context().override_server_args(
            model_path=model_dir, device="cpu", max_total_tokens=1024, attention_backend=backend
        ):
            worker = TpModelWorker(ModelConfig(model_dir))
        is_triton = isinstance(worker.model_runner.attn_backend, TritonAttnBackend)
        assert is_triton == (backend == "triton")
        sched = MiniScheduler(worker)
        tokens[backend] = sched.generate([MiniReq(p) for p in prompts], 6)
        reqs = [MiniReq(p) for p in prompts]
        worker.forward_batch_logits(sched.build_extend(reqs, [len(p) // 2 for p in prompts]))
        logits[backend] = worker.forward_batch_logits(sched.build_extend(reqs)).next_token_logits
        sched.release(reqs)
        worker.token_to_kv_pool_allocator.check_integrity()
    assert tokens["triton"] == tokens["torch_native"]
    torch.testing.assert_close(logits["triton"], logits["torch_native"], atol=TOL, rtol=0)


class _EagerReplay:
    """A stand-in for a captured CUDA graph (none on cpu): replay re-runs the forward that
    was captured, on the same static buffers and the backend metadata of capture time."""

    def __init__(self, graphs, fb: ForwardBatch) -> None:
        self.graphs, self.fb = graphs, fb
        self.metadata = graphs.runner.attn_backend.metadata

    def replay(self) -> None:
        self.graphs.runner.attn_backend.metadata = self.metadata
        self.graphs.logits[self.fb.batch_size].copy_(self.graphs._forward(self.fb))


def _eager_graph_runner(runner, max_bs: int):
    """CudaGraphRunner with its capture (the only cuda-only step) replaced by _EagerReplay."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    class EagerGraphs(CudaGraphRunner):
        def _capture_all(self) -> None:
            for bs in self.batch_sizes:
                fb = self.static_batches[bs] = self._static_batch(bs, [1] * bs)
                self.runner.attn_backend.init_forward_metadata_capture_cuda_graph(fb)
                self.graphs[bs], self.logits[bs] = _EagerReplay(self, fb), self._forward(fb)

    return EagerGraphs(runner, max_bs)


def test_tiny_llama_graph_replay_path_keeps_greedy_tokens(tiny_llama_dir):
    """The CUDA-graph decode path (static inputs, padding 3 -> 4, the triton
    backend's static metadata, ForwardBatch.init_new leaving the metadata to the replay),
    with the capture itself replaced by an eager re-run: greedy tokens are unchanged."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context
    from sglang.test.runner_utils import MiniReq, MiniScheduler

    model_dir = str(tiny_llama_dir)
    prompts = [list(range(10 + i, 20 + 5 * i)) for i in range(3)]
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=1024, attention_backend="triton"
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    sched = MiniScheduler(worker)
    eager = sched.generate([MiniReq(p) for p in prompts], 3)
    runner = worker.model_runner
    runner.graph_runner = _eager_graph_runner(runner, max_bs=4)
    replays = []
    runner.graph_runner.replay = _recording(runner.graph_runner.replay, replays)
    assert sched.generate([MiniReq(p) for p in prompts], 3) == eager
    assert replays == [3, 3]  # every decode step replayed
    worker.token_to_kv_pool_allocator.check_integrity()


def _recording(fn, calls: list):
    def wrapper(fb):
        calls.append(fb.batch_size)
        return fn(fb)

    return wrapper
