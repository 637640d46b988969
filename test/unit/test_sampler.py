"""Sampler and sampling params: greedy fast path, filters, penalties, seeds, logprobs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang.srt.layers.sampler import NO_ALLOWED_TOKEN, Sampler
from sglang.srt.sampling.penalties import RunningTokenCounts, output_token_counts
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 16


def _info(params, outputs=None, eos=None, prompts=None) -> SamplingBatchInfo:
    outputs = outputs or [[] for _ in params]
    return SamplingBatchInfo.from_requests(params, outputs, VOCAB, "cpu", eos_token_ids=eos,
                                           prompt_ids=prompts)  # fmt: skip


def _logits(bs: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(bs, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_greedy_fast_path_is_argmax():
    logits = _logits(3)
    info = _info([SamplingParams(temperature=0.0)] * 3)
    assert info.is_all_greedy and not info.has_logit_adjustments
    out = Sampler()(logits, info)
    assert out.next_token_ids.tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
    ],
)
def test_filters_that_leave_one_token_pick_the_argmax(params):
    logits = _logits(4)
    for _ in range(5):
        out = Sampler()(logits, _info([params] * 4))
        assert out.next_token_ids.tolist() == logits.argmax(-1).tolist()


def test_top_k_only_draws_from_the_k_best():
    logits = torch.zeros(1, VOCAB)
    logits[0, [3, 7]] = 5.0
    info = _info([SamplingParams(top_k=2, temperature=10.0)])
    draws = {Sampler()(logits, info).next_token_ids.item() for _ in range(50)}
    assert draws <= {3, 7} and len(draws) == 2


def test_same_seed_same_tokens_and_mixed_batch():
    logits = torch.zeros(3, VOCAB)  # uniform: any unseeded draw is random
    params = [SamplingParams(seed=42), SamplingParams(temperature=0.0), SamplingParams(seed=7)]
    first = [Sampler()(logits, _info(params)).next_token_ids.tolist() for _ in range(4)]
    assert all(f[0] == first[0][0] and f[2] == first[0][2] for f in first)
    assert all(f[1] == 0 for f in first)  # greedy row in a sampled batch: argmax
    steps = {
        Sampler()(logits[:1], _info([params[0]], [[1] * n])).next_token_ids.item()
        for n in range(12)
    }
    assert len(steps) > 1  # the step mixes into the seed


@pytest.mark.parametrize(
    "neighbour",
    [SamplingParams(top_k=5), SamplingParams(top_p=0.5), SamplingParams(min_p=0.2),
     SamplingParams(temperature=0.0)],
)  # fmt: skip
def test_a_seeded_row_draws_the_same_token_whatever_its_batch(neighbour):
    # the filters other rows use must not change which token a seed's uniform picks
    logits = _logits(2, seed=3)
    seeded = SamplingParams(seed=1234)
    for step in range(8):
        alone = Sampler()(logits[:1], _info([seeded], [[1] * step])).next_token_ids.item()
        info = _info([seeded, neighbour], [[1] * step, []])
        assert Sampler()(logits, info).next_token_ids[0].item() == alone


def test_seeds_a_half_range_apart_differ():
    # the seed range is [-2**63, 2**64): seed and seed + 2**63 are different seeds
    logits = torch.zeros(1, VOCAB)  # uniform: the draw is the seed's uniform alone
    draws = {
        tuple(
            Sampler()(logits, _info([SamplingParams(seed=seed)], [[1] * n])).next_token_ids.item()
            for n in range(6)
        )
        for seed in (5, 5 + 2**63)
    }
    assert len(draws) == 2


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(top_k=3),
                                    SamplingParams(seed=9), SamplingParams()])  # fmt: skip
def test_a_row_with_every_token_banned_samples_no_allowed_token(params):
    logits = _logits(2)
    info = _info([params, SamplingParams(temperature=0.0)])
    info.vocab_bias = torch.zeros(2, VOCAB)
    info.vocab_bias[0] = float("-inf")  # as a finished grammar's mask with min_new_tokens
    out = Sampler()(logits, info, return_logprob=True)
    assert out.next_token_ids.tolist() == [NO_ALLOWED_TOKEN, logits[1].argmax().item()]


def test_penalties():
    logits = torch.full((1, VOCAB), 2.0)
    info = _info(
        [
            SamplingParams(
                temperature=0.0,
                repetition_penalty=2.0,
                frequency_penalty=0.5,
                presence_penalty=0.25,
            )
        ],
        [[5, 5, 9]],
    )
    from sglang.srt.layers.sampler import adjust_logits

    out = adjust_logits(logits.clone(), info)[0]
    assert out[5].item() == pytest.approx(2.0 / 2.0 - 0.5 * 2 - 0.25)
    assert out[9].item() == pytest.approx(2.0 / 2.0 - 0.5 - 0.25)
    assert out[0].item() == pytest.approx(2.0)


def test_repetition_penalty_covers_the_prompt_the_others_only_outputs():
    # HF's RepetitionPenaltyLogitsProcessor (and vLLM, SGLang) scale every token of the
    # prompt and the output; OpenAI's frequency/presence penalties count outputs only.
    from sglang.srt.layers.sampler import adjust_logits

    logits = torch.tensor([[2.0, -2.0, 2.0, 2.0] + [0.0] * (VOCAB - 4)])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5)
    out = adjust_logits(logits.clone(), _info([params], [[2]], prompts=[[0, 1]]))[0]
    assert out[:4].tolist() == pytest.approx([1.0, -4.0, 1.0 - 0.5, 2.0])


@pytest.mark.parametrize("penalty", [1e-38, 1e-45, 1e-300])  # denormal or 0 in float32
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.5, 1e-5])
def test_a_tiny_repetition_penalty_keeps_a_distribution(penalty, temperature):
    """Any penalty > 0 is accepted: a tiny one strongly favours seen tokens, never turns
    the row into inf/NaN (which sampled the vocabulary's last id with logprob -inf), also
    once a temperature below 1 divides the boosted logits."""
    logits = torch.tensor([[3.0, -1.0, 2.0, float("-inf")] + [1.0] * (VOCAB - 4)])
    params = SamplingParams(temperature=temperature, repetition_penalty=penalty)
    info = _info([params], [[1, 2]], prompts=[[0, 3]])
    for _ in range(5):
        out = Sampler()(logits.clone(), info, return_logprob=True)
        assert out.next_token_ids.item() in (0, 2)  # the seen tokens with positive logits
        assert math.isfinite(out.logprobs.item()) and out.logprobs.item() > -1.0


def test_min_new_tokens_bans_eos_and_stop_ids_then_releases():
    logits = torch.zeros(1, VOCAB)
    logits[0, 2] = 10.0  # eos is the best token
    logits[0, 4] = 5.0
    params = [SamplingParams(temperature=0.0, min_new_tokens=2, stop_token_ids=[4])]
    assert Sampler()(logits, _info(params, [[1]], eos={2})).next_token_ids.item() not in (2, 4)
    assert Sampler()(logits, _info(params, [[1, 1]], eos={2})).next_token_ids.item() == 2


def test_logit_bias_forces_a_token():
    logits = _logits(1)
    info = _info([SamplingParams(temperature=0.0, logit_bias={"11": 100.0})])
    assert Sampler()(logits, info).next_token_ids.item() == 11


def test_logprobs_and_top_logprobs():
    logits = _logits(2)
    out = Sampler()(logits, _info([SamplingParams(temperature=0.0)] * 2), True, [3, 0])
    ref = torch.log_softmax(logits, -1)
    ids = out.next_token_ids
    torch.testing.assert_close(out.logprobs, ref.gather(1, ids[:, None])[:, 0])
    assert len(out.top_logprobs[0]) == 3 and out.top_logprobs[1] == []
    values = [v for v, _ in out.top_logprobs[0]]
    assert values == sorted(values, reverse=True)
    assert out.top_logprobs[0][0][1] == ids[0].item()


def test_a_rows_top_logprobs_do_not_depend_on_its_neighbours_k():
    # a grammar leaves 2 tokens, the request asks for 3: its third entry is one of many
    # tied -inf tokens; which one must not change with a batch neighbour asking for 60
    # (one topk over the batch at the largest k picked other tied ids)
    logits = torch.randn(2, 4096, generator=torch.Generator().manual_seed(0))
    logits[0, :] = float("-inf")
    logits[0, 5], logits[0, 9] = 1.0, 0.5
    info = _info([SamplingParams(temperature=0.0)] * 2)
    alone = Sampler()(logits[:1], _info([SamplingParams(temperature=0.0)]), True, [3])
    together = Sampler()(logits, info, True, [3, 60])
    assert together.top_logprobs[0] == alone.top_logprobs[0]
    assert [t for _, t in alone.top_logprobs[0][:2]] == [5, 9] and len(together.top_logprobs[1]) == 60


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1.0),
        ("temperature", 1e39),  # inf in the float32 logits
        ("top_p", 0.0),
        ("top_k", -5),
        ("min_p", 2.0),
        ("repetition_penalty", 0.0),
        ("max_new_tokens", -1),
        ("n", 0),
    ],
)
def test_verify_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value}).verify(VOCAB)


def test_verify_logit_bias_and_unknown_keys():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"99": 1.0}).verify(VOCAB)
    with pytest.raises(ValueError, match="bogus"):
        SamplingParams.from_dict({"bogus": 1})


def test_normalize():
    p = SamplingParams(stop="END", stop_token_ids=[3, 3])
    p.normalize(None)
    assert p.stop_strs == ["END"] and p.stop_token_ids == {3}


def test_draws_follow_the_distribution():
    rows = 4000
    logits = torch.full((rows, VOCAB), float("-inf"))
    logits[:, 3] = torch.log(torch.tensor(0.75))
    logits[:, 5] = torch.log(torch.tensor(0.25))
    ids = Sampler()(logits, _info([SamplingParams()] * rows)).next_token_ids
    assert set(ids.tolist()) == {3, 5}
    assert abs((ids == 3).float().mean().item() - 0.75) < 0.04


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.2] + [0.0] * (VOCAB - 3))
    logits = torch.log(probs).expand(500, VOCAB).clone()
    ids = Sampler()(logits, _info([SamplingParams(top_p=0.7)] * 500)).next_token_ids
    assert set(ids.tolist()) == {0, 1}


def test_top_p_on_a_flat_distribution_falls_back_to_a_full_sort(monkeypatch):
    from sglang.srt.layers import sampler

    monkeypatch.setattr(sampler, "_TOP_CANDIDATES", 4)  # fewer than top-p needs
    logits = torch.zeros(200, VOCAB)
    logits[:, 0] = 1.0
    ids = Sampler()(logits, _info([SamplingParams(top_p=0.5)] * 200)).next_token_ids
    assert len(set(ids.tolist())) > 4  # more tokens than the candidate set


def test_running_token_counts_follow_the_batch_step_by_step():
    # The counts a running batch keeps across steps must equal a fresh count of every
    # request's outputs at each step, through joins, finishes, reorders and several
    # tokens in one step (an accepted draft).
    rng = random.Random(0)
    counts = RunningTokenCounts(VOCAB, "cpu")
    batch: list[tuple[object, list[int]]] = []
    for step in range(60):
        if step % 7 == 0 or not batch:  # a request joins, sometimes with outputs already
            batch.append((object(), [rng.randrange(VOCAB) for _ in range(rng.randrange(3))]))
        if step % 11 == 5:  # one finishes
            batch.pop(rng.randrange(len(batch)))
        if step % 13 == 3:
            rng.shuffle(batch)
        for _, ids in batch:
            ids.extend(rng.randrange(VOCAB) for _ in range(rng.choice([1, 1, 1, 3])))
        owners, outputs = [o for o, _ in batch], [ids for _, ids in batch]
        got = counts.update(owners, outputs, [[] for _ in owners])
        assert torch.equal(got, output_token_counts(outputs, VOCAB, "cpu")), step


def test_running_token_counts_match_owners_not_contents():
    counts = RunningTokenCounts(VOCAB, "cpu")
    first, second = object(), object()
    counts.update([first], [[3, 3]], [[1]])
    # a different request in the same row, with the same outputs, is counted afresh
    assert counts.update([second], [[3, 3, 4]], [[2]])[0, 3].item() == 2
    assert counts.prompt_seen[0].nonzero().flatten().tolist() == [2]
    # outputs only grow (Req.output_ids is append-only); fewer than counted: recounted
    assert counts.update([second], [[4]], [[2]])[0].tolist() == [0] * 4 + [1] + [0] * (VOCAB - 5)


def test_running_token_counts_keep_each_prompt_mask_with_its_row():
    counts = RunningTokenCounts(VOCAB, "cpu")
    a, b, c = object(), object(), object()
    counts.update([a, b], [[], []], [[1, 2], [3]])
    counts.update([b, c], [[5], []], [[9, 9, 9], [4]])  # b keeps its mask; c's is made
    assert [row.nonzero().flatten().tolist() for row in counts.prompt_seen] == [[3], [4]]


def test_running_token_counts_keep_no_prompt_mask_until_a_repetition_penalty_joins():
    # Frequency/presence-only batches keep no bool[bs, vocab] mask; when a request with a
    # repetition penalty joins, every row's mask is made, survivors' included.
    counts = RunningTokenCounts(VOCAB, "cpu")
    a, b = object(), object()
    counts.update([a], [[5]], None)
    assert counts.prompt_seen is None
    counts.update([a, b], [[5, 6], []], [[1, 2], [3]])
    assert [row.nonzero().flatten().tolist() for row in counts.prompt_seen] == [[1, 2], [3]]
    counts.update([b], [[7]], None)  # the penalized request left
    assert counts.prompt_seen is None
