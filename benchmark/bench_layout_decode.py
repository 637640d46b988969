"""Decode step with CPU weights in [in, out] storage vs contiguous [out, in], in one process.

    python benchmark/bench_layout_decode.py [--batch-size 1 8 32] [--input-len 128]
        [--output-len 64] [--rounds 3] [server flags, e.g. --num-threads 1]

One TpModelWorker (default: the bundled demo model). The old layout is the same
weights copied to contiguous [out, in] tensors (what F.linear ran on before);
each runner swaps its set of tensors into the parameters (`param.data = ...`,
no copy) before every step. The two runners' steps alternate, A B A B, so load
from other processes hits both alike; --rounds repeats the whole batch and the
table gives the median over all decode steps and prefills of each layout, and
in brackets its speed-up over old. The layouts are made here from the loaded
weights, so the script measures the same thing whatever layout the loader keeps.
"""

from __future__ import annotations

import argparse
import logging
import statistics

import torch

from sglang.bench_one_batch import OursRunner
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

logger = logging.getLogger(__name__)


class LayoutRunner:
    """An OursRunner that installs its own weight tensors before each step."""

    def __init__(self, inner: OursRunner, weights: dict[torch.nn.Parameter, torch.Tensor]):
        self.inner, self.weights = inner, weights

    def _install(self) -> None:
        for param, tensor in self.weights.items():
            param.data = tensor

    def prefill(self) -> float:
        self._install()
        return self.inner.prefill()

    def decode(self) -> float:
        self._install()
        return self.inner.decode()

    def close(self) -> None:
        self.inner.close()


def layouts(model: torch.nn.Module) -> dict[str, dict]:
    """Weight tensors of each layout, keyed by parameter.

    old: every linear and lm_head weight a contiguous [out, in] (F.linear's GEMV);
    new: those weights in [in, out] storage (the parameter a .t() view of it);
    new+tied: new, and a tied lm_head (the embedding) in [dim, vocab] storage too.
    """
    linears, tied = [], []
    for module in model.modules():
        if isinstance(module, (LinearBase, ParallelLMHead)):
            linears.append(module.weight)
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, VocabParallelEmbedding) and not isinstance(lm_head, ParallelLMHead):
        tied.append(lm_head.weight)
    old = {p: p.data.contiguous() for p in linears + tied}
    new = {p: p.data.t().contiguous().t() for p in linears}
    out = {"old": old, "new": {**old, **new}}
    if tied:
        out["new+tied"] = {**out["new"], **{p: p.data.t().contiguous().t() for p in tied}}
    return out


def run(worker, batch_sizes, input_len, output_len, rounds) -> list[dict]:
    model = worker.model_runner.model
    loaded = {p: p.data for p in model.parameters()}
    weights = layouts(model)
    names = list(weights)
    cols = [f"{k} decode ms" for k in names] + [f"{k} prefill ms" for k in names]
    print("| batch | " + " | ".join(cols) + " |\n" + "|---" * (len(cols) + 1) + "|")
    gen = torch.Generator().manual_seed(0)
    vocab = worker.model_config.vocab_size
    rows = []
    for bs in batch_sizes:
        prompts = torch.randint(3, vocab, (bs, input_len), generator=gen).tolist()
        steps = {name: ([], []) for name in names}
        for r in range(rounds + 1):  # round 0 warms up
            runners = {name: LayoutRunner(OursRunner(worker, prompts), weights[name])
                       for name in names}
            pre = {name: runner.prefill() for name, runner in runners.items()}
            for _ in range(output_len - 1 if r else 2):
                for name, runner in runners.items():
                    t = runner.decode()
                    if r:
                        steps[name][1].append(t)
            for name, runner in runners.items():
                runner.close()
                if r:
                    steps[name][0].append(pre[name])
        med = {k: (statistics.median(p), statistics.median(d)) for k, (p, d) in steps.items()}
        row = {"bs": bs, **{f"{k}_decode_ms": v[1] * 1e3 for k, v in med.items()},
               **{f"{k}_prefill_ms": v[0] * 1e3 for k, v in med.items()}}
        rows.append(row)
        cells = [f"{med[k][1] * 1e3:.2f} ({med['old'][1] / med[k][1]:.2f})" for k in names]
        cells += [f"{med[k][0] * 1e3:.1f} ({med['old'][0] / med[k][0]:.2f})" for k in names]
        print(f"| {bs} | " + " | ".join(cells) + " |", flush=True)
    LayoutRunner(None, loaded)._install()  # leave the model as loaded
    return rows


def main() -> None:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    ns, server_argv = p.parse_known_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    publish(prepare_server_args(server_argv), role="scheduler")
    worker = TpModelWorker()
    logger.info("%s, torch threads %d", worker.model_config, torch.get_num_threads())
    run(worker, ns.batch_size, ns.input_len, ns.output_len, ns.rounds)


if __name__ == "__main__":
    main()
