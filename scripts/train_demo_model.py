"""Train the bundled demo model pair (a ~7M-parameter Llama target and a ~1.4M draft).

Everything comes from text every install has at hand (`sglang.test.corpus`: Python's
standard-library sources and the `pydoc_data` topics, PSF License). Each model trains until
its step cap or its wall-clock budget (`--target-minutes/--draft-minutes`), whichever
comes first; the learning-rate schedule and the switch to long windows follow that
progress, so a run cut by the budget still anneals and still trains on long windows.
With `--target-minutes 0 --draft-minutes 0` progress is by steps alone and the run is
deterministic given `--seed` and the step caps (the machine this runs on is shared, so
the budget run is the practical one; its log and model card name the steps it took).

    python scripts/train_demo_model.py --seed 0 --target-minutes 35 --draft-minutes 8

writes python/sglang/demo_models/{target,draft}/ (HF format, bf16) and README.md there.
"""

from __future__ import annotations

import argparse
import logging
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from sglang.test import corpus  # noqa: E402

logger = logging.getLogger("train_demo_model")

# Architecture of the pair. The draft shares the tokenizer (and so the vocabulary).
TARGET_ARCH = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=704)
DRAFT_ARCH = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=352)


@dataclass
class TrainResult:
    name: str
    num_params: int
    steps: int
    seconds: float
    heldout_loss: float = float("nan")
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    stopped_by_clock: bool = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=REPO / "python/sglang/demo_models")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--long-seq-len", type=int, default=512,
                   help="the last --long-frac of steps train on windows this long "
                        "(same tokens per step); it is also the checkpoints' context length")
    p.add_argument("--long-frac", type=float, default=0.15)
    p.add_argument("--target-minutes", type=float, default=35.0, help="0: no wall-clock budget")
    p.add_argument("--draft-minutes", type=float, default=8.0, help="0: no wall-clock budget")
    p.add_argument("--target-steps", type=int, default=3000, help="step cap")
    p.add_argument("--draft-steps", type=int, default=3000, help="step cap")
    p.add_argument("--target-lr", type=float, default=1.5e-3)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads; 1 trains faster than 2 on 2 cores other jobs share")
    return p.parse_args(argv)


# ---------------------------------------------------------------- data


def encode_stream(tokenizer, documents: list[str]) -> torch.Tensor:
    """All documents as one 1-D int64 token stream, each followed by <|endoftext|>."""
    eot = tokenizer.token_to_id(corpus.BOS_TOKEN)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(documents):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def sample_batch(stream: torch.Tensor, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """[batch, seq + 1] windows at uniformly random offsets of the train stream."""
    starts = torch.randint(0, stream.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


def heldout_windows(stream: torch.Tensor, seq: int) -> torch.Tensor:
    """[n, seq] non-overlapping windows of the held-out stream (the tail is dropped)."""
    n = stream.numel() // seq
    return stream[: n * seq].view(n, seq)


# ---------------------------------------------------------------- models


def build_model(arch: dict, vocab_size: int, context_len: int, tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=context_len,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id(corpus.BOS_TOKEN),
        eos_token_id=tokenizer.token_to_id(corpus.EOS_TOKEN),
        pad_token_id=tokenizer.token_to_id(corpus.PAD_TOKEN),
        **arch,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def progress(step: int, max_steps: int, elapsed_s: float, budget_s: float) -> float:
    """Share of the run done: by steps, or by wall clock when a budget is set (the further)."""
    by_steps = step / max_steps
    return max(by_steps, elapsed_s / budget_s) if budget_s > 0 else by_steps


def lr_at(step: int, done: float, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to `floor * peak` at done == 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def make_optimizer(model, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def window_shape(done: float, args) -> tuple[int, int]:
    """(batch, seq) of a step: short windows first, long ones for the last `long_frac`."""
    if done >= 1 - args.long_frac - 1e-9:
        return max(1, args.batch_size * args.seq_len // args.long_seq_len), args.long_seq_len
    return args.batch_size, args.seq_len


def train_step(model, opt, batch: torch.Tensor) -> float:
    logits = model(input_ids=batch[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def train(name: str, model, stream: torch.Tensor, max_steps: int, lr: float, minutes: float,
          args) -> TrainResult:
    """AdamW over random windows until `max_steps` or `minutes` of wall clock run out."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    opt = make_optimizer(model, lr)
    result = TrainResult(name, num_params(model), 0, 0.0)
    t0, window, step, done = time.perf_counter(), [], 0, 0.0
    model.train()
    while done < 1.0:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, done, lr, args.warmup_steps)
        batch, seq = window_shape(done, args)
        window.append(train_step(model, opt, sample_batch(stream, gen, batch, seq)))
        step += 1
        elapsed = time.perf_counter() - t0
        done = progress(step, max_steps, elapsed, minutes * 60)
        if step % args.log_every == 0 or done >= 1.0:
            mean = sum(window) / len(window)
            result.loss_curve.append((step, mean))
            logger.info("%s step %5d (%3.0f%%) seq %d lr %.2e loss %.4f (%.0f s)", name, step,
                        100 * min(done, 1.0), seq, opt.param_groups[0]["lr"], mean, elapsed)
            window = []
    result.steps, result.seconds = step, time.perf_counter() - t0
    result.stopped_by_clock = step < max_steps
    model.eval()
    return result


# ---------------------------------------------------------------- evaluation


def bf16_roundtrip(model):
    """Round the weights through bfloat16 in place, so evaluation sees the shipped weights."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


@torch.no_grad()
def heldout_logits(model, windows: torch.Tensor, chunk: int = 16):
    """Yields (logits[:, :-1], targets) per chunk of held-out windows."""
    for i in range(0, windows.size(0), chunk):
        w = windows[i : i + chunk]
        yield model(input_ids=w).logits[:, :-1].float(), w[:, 1:]


def heldout_loss(model, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats) over positions 1.. of each held-out window."""
    total, count = 0.0, 0
    for logits, targets in heldout_logits(model, windows):
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                 reduction="sum").item()
        count += targets.numel()
    return total / count


def unigram_loss(train_stream: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy of an add-one unigram (from the train split) on the same positions."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1.0
    logp = torch.log(counts / counts.sum())
    return -logp[windows[:, 1:].reshape(-1)].mean().item()


def greedy_agreement(target, draft, windows: torch.Tensor) -> float:
    """Share of held-out positions where the draft's argmax equals the target's."""
    agree, count = 0, 0
    pairs = zip(heldout_logits(target, windows), heldout_logits(draft, windows))
    for (t_logits, _), (d_logits, _) in pairs:
        agree += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        count += t_logits.shape[0] * t_logits.shape[1]
    return agree / count


@torch.no_grad()
def greedy_completion(model, hf_tokenizer, prompt: str, max_new_tokens: int = 40) -> str:
    ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return hf_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


# ---------------------------------------------------------------- saving


def save_checkpoint(model, tokenizer, out_dir: Path, context_len: int) -> None:
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    model.float()
    corpus.save_tokenizer_files(tokenizer, out_dir, model_max_length=context_len)
    eot = tokenizer.token_to_id(corpus.BOS_TOKEN)
    GenerationConfig(
        bos_token_id=eot,
        eos_token_id=[tokenizer.token_to_id(corpus.EOS_TOKEN), eot],
        pad_token_id=tokenizer.token_to_id(corpus.PAD_TOKEN),
        do_sample=False,
    ).save_pretrained(out_dir)


def dir_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6


MODEL_CARD = """\
# sglang demo models: a tiny trained target and draft

Two small Llama-architecture causal LMs that ship inside the package, so that
`python -m sglang.launch_server` (no `--model-path`) serves something that writes
text rather than noise, and so that speculative decoding has a draft that agrees
with its target as real pairs do. They are toys: they continue Python code and
pydoc-style prose; they do not follow instructions or chat.

```
python -m sglang.launch_server          # serves demo_models/target (logged at start-up)
```

| | target | draft |
|---|---|---|
| parameters (embeddings tied) | {t_params:,} | {d_params:,} |
| hidden / layers / heads / KV heads / MLP | {t_arch} | {d_arch} |
| training steps / wall time | {t_steps} / {t_min:.1f} min | {d_steps} / {d_min:.1f} min |
| held-out loss (nats/token) | **{t_loss:.3f}** | **{d_loss:.3f}** |
| checkpoint size (bf16) | {t_mb:.1f} MB | {d_mb:.1f} MB |

- Unigram baseline on the same held-out positions (add-one smoothing, estimated on
  the train split): **{uni_loss:.3f}** nats/token. The target is
  {gain:.2f} nats/token better.
- Draft/target greedy next-token agreement on held-out positions: **{agree:.1%}**.
  This is roughly the per-token acceptance rate greedy speculative decoding will see.
- Vocabulary {vocab} (byte-level BPE, trained on the train split), context length
  {ctx} tokens; special tokens `<|endoftext|>` (document separator, pad),
  `<|im_start|>`, `<|im_end|>` (EOS; `generation_config.json` stops on both
  `<|im_end|>` and `<|endoftext|>`). ChatML chat template in `chat_template.jinja`.

## Example

Greedy, {n_new} new tokens, target, prompt `{prompt!r}`:

```python
{prompt}{completion}
```

## Training

```
{command}
```

(`scripts/train_demo_model.py` in the repository), {total_min:.0f} minutes on 2 CPU
cores shared with other work.

{schedule_note}

Both models:
`transformers.LlamaForCausalLM`, fp32 training, AdamW (betas 0.9/0.95, weight decay
0.1 on matrices, gradient clip 1.0), {warmup} warm-up steps then cosine decay to 10%,
peak learning rate {t_lr:g} (target) / {d_lr:g} (draft), {batch} random windows of
{seq} tokens per step, the last {long_pct:.0f}% of the run on windows of {ctx} tokens
(same tokens per step). Weights are saved in bfloat16; the figures above are measured
on the bf16 weights. Training loss (mean over the last {log_every} steps), from the log:

- target: {t_curve}
- draft: {d_curve}

## Corpus and license

Python {py_version}'s own standard library, read from the interpreter that ran the
script (`sglang.test.corpus`): the `pydoc_data` topics and the standard library's
`.py` sources (excluding `test/`, `idlelib/`, `lib2to3/` and site-packages), about
{train_mtokens:.1f}M training tokens. Both are distributed under the
**PSF License Agreement** (Python Software Foundation License Version 2); these
weights are derived from that text. Held out from training (tokenizer included) and used for
every held-out figure: {heldout_files} ({heldout_tokens:,} tokens, measured on
{heldout_positions:,} positions in windows of {seq}).
"""


def write_model_card(out_dir: Path, args, target: TrainResult, draft: TrainResult,
                     figures: dict) -> None:
    def arch(a: dict) -> str:
        return " / ".join(str(a[k]) for k in ("hidden_size", "num_hidden_layers",
                                               "num_attention_heads", "num_key_value_heads",
                                               "intermediate_size"))

    def curve(result: TrainResult) -> str:
        points = result.loss_curve[3::4] or result.loss_curve
        return ", ".join(f"{step}: {loss:.2f}" for step, loss in points)

    command = (f"python scripts/train_demo_model.py --seed {args.seed} --threads {args.threads} "
               f"--target-minutes {args.target_minutes:g} --draft-minutes {args.draft_minutes:g}")
    if args.target_minutes or args.draft_minutes:
        schedule_note = (
            "Each model trained until its wall-clock budget (or step cap), the schedule "
            "following that progress, so the step counts depend on the machine's speed; "
            f"`--seed {args.seed} --target-steps {target.steps} --draft-steps {draft.steps} "
            "--target-minutes 0 --draft-minutes 0` is the deterministic, step-scheduled run "
            "of the same length (close to, not bit-identical with, this one).")
    else:
        command += f" --target-steps {target.steps} --draft-steps {draft.steps}"
        schedule_note = "Step-scheduled: deterministic given the seed and step counts."
    text = MODEL_CARD.format(
        t_params=target.num_params, d_params=draft.num_params,
        t_arch=arch(TARGET_ARCH), d_arch=arch(DRAFT_ARCH),
        t_steps=target.steps, d_steps=draft.steps,
        t_min=target.seconds / 60, d_min=draft.seconds / 60,
        total_min=(target.seconds + draft.seconds) / 60,
        t_loss=target.heldout_loss, d_loss=draft.heldout_loss,
        t_lr=args.target_lr, d_lr=args.draft_lr, warmup=args.warmup_steps,
        batch=args.batch_size, seq=args.seq_len, ctx=args.long_seq_len,
        long_pct=100 * args.long_frac, vocab=args.vocab_size, command=command,
        schedule_note=schedule_note, log_every=args.log_every,
        t_curve=curve(target), d_curve=curve(draft),
        py_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        heldout_files=", ".join(f"`{f}`" for f in corpus.HELDOUT_STDLIB_FILES),
        **figures,
    )
    (out_dir / "README.md").write_text(text)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    logger.info("command: %s", shlex.join([sys.argv[0], *(argv or sys.argv[1:])]))

    train_docs = list(corpus.iter_train_documents())
    tokenizer = corpus.train_tokenizer_on(train_docs, args.vocab_size)
    train_stream = encode_stream(tokenizer, train_docs)
    heldout_stream = encode_stream(tokenizer, corpus.heldout_documents())
    windows = heldout_windows(heldout_stream, args.seq_len)
    logger.info("tokens: train %d, held-out %d (%d windows of %d)", train_stream.numel(),
                heldout_stream.numel(), windows.size(0), args.seq_len)
    uni = unigram_loss(train_stream, windows, args.vocab_size)
    logger.info("unigram baseline held-out loss: %.4f", uni)

    results, models = {}, {}
    for name, arch, lr, minutes, steps, seed in (
        ("target", TARGET_ARCH, args.target_lr, args.target_minutes, args.target_steps, args.seed),
        ("draft", DRAFT_ARCH, args.draft_lr, args.draft_minutes, args.draft_steps, args.seed + 100),
    ):
        def make(arch=arch, seed=seed):
            return build_model(arch, args.vocab_size, args.long_seq_len, tokenizer, seed)

        model = make()
        logger.info("%s: %d parameters, at most %d steps / %g min", name, num_params(model),
                    steps, minutes)
        result = train(name, model, train_stream, steps, lr, minutes, args)
        result.heldout_loss = heldout_loss(bf16_roundtrip(model), windows)
        logger.info("%s: held-out loss %.4f (bf16 weights), trained %.1f min", name,
                    result.heldout_loss, result.seconds / 60)
        save_checkpoint(model, tokenizer, args.out_dir / name, args.long_seq_len)
        results[name], models[name] = result, model

    agree = greedy_agreement(models["target"], models["draft"], windows)
    logger.info("draft/target greedy agreement on held-out positions: %.4f", agree)

    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(args.out_dir / "target")
    prompt, n_new = "def fibonacci(n):", 40
    completion = greedy_completion(models["target"], hf_tok, prompt, n_new)
    logger.info("completion for %r: %r", prompt, completion)
    figures = dict(
        uni_loss=uni, gain=uni - results["target"].heldout_loss, agree=agree,
        t_mb=dir_megabytes(args.out_dir / "target"), d_mb=dir_megabytes(args.out_dir / "draft"),
        prompt=prompt, completion=completion, n_new=n_new,
        train_mtokens=train_stream.numel() / 1e6, heldout_tokens=heldout_stream.numel(),
        heldout_positions=windows.size(0) * (args.seq_len - 1),
    )
    write_model_card(args.out_dir, args, results["target"], results["draft"], figures)
    logger.info("wrote %s", args.out_dir / "README.md")


if __name__ == "__main__":
    main()
