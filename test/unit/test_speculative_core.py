"""Speculative decoding core: n-gram drafting and the verify rules.

The distribution tests are the point: rejection sampling must leave the
target's distribution exactly as plain sampling would, and a wrong rule
(accept every draft, or redraw from p after a rejection) must fail the same
chi-square check.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.ngram import NgramIndex, propose_ngram
from sglang.srt.speculative.verify import (
    _inverse_cdf,
    accepted_logprobs,
    target_probs,
    verify_greedy,
    verify_sampling,
)

# ---------------------------------------------------------------- n-gram


def _ngram_reference(tokens, num_draft, min_window=1, max_window=12):
    """Longest suffix first, then the most recent earlier occurrence (brute force)."""
    if num_draft <= 0:
        return []
    last = len(tokens) - 1
    for n in range(min(max_window, last), max(min_window, 1) - 1, -1):
        suffix = tokens[-n:]
        for end in range(last - 1, n - 2, -1):  # occurrence tokens[end-n+1 .. end]
            if tokens[end - n + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + num_draft]
    return []


def test_ngram_finds_a_repetition():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 2) == [3, 4]
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]


def test_ngram_longest_window_beats_a_more_recent_shorter_match():
    # suffix [7, 8, 9] occurs at the start; [9] alone occurs more recently
    tokens = [7, 8, 9, 1, 2, 9, 5, 7, 8, 9]
    assert propose_ngram(tokens, 2) == [1, 2]
    assert propose_ngram(tokens, 2, max_window=1) == [5, 7]


def test_ngram_most_recent_occurrence_among_equal_lengths():
    tokens = [3, 4, 10, 3, 4, 20, 3, 4]
    assert propose_ngram(tokens, 1) == [20]


def test_ngram_fewer_drafts_at_the_end_of_the_sequence():
    assert propose_ngram([1, 2, 3, 1, 2], 5) == [3, 1, 2]


def test_ngram_no_match_is_empty():
    assert propose_ngram([1, 2, 3, 4], 3) == []
    assert propose_ngram([], 3) == []
    assert propose_ngram([9], 3) == []


def test_ngram_min_window_is_respected():
    tokens = [1, 2, 3, 9, 5, 3]  # only a 1-token suffix repeats
    assert propose_ngram(tokens, 2) == [9, 5]
    assert propose_ngram(tokens, 2, min_window=2) == []


def test_ngram_self_overlap():
    # the longest earlier match [5, 5, 5] ends at index 2: one token follows it
    assert propose_ngram([5, 5, 5, 5], 3) == [5]
    assert propose_ngram([5, 5, 5, 5, 5, 5], 3, max_window=2) == [5]


def test_ngram_num_draft_zero():
    assert propose_ngram([1, 2, 1], 0) == []
    assert NgramIndex([1, 2, 1]).propose(0) == []


@pytest.mark.parametrize("length", [(0, 16), (17, 60)])  # plain-Python and numpy encodings
def test_ngram_matches_brute_force(length):
    # ids with many zero / equal bytes and ids at the top of the range
    alphabet = [0, 1, 127, 128, 256, 257, 65536, 16777216, (1 << 28) - 1]
    rng = random.Random(length[0])
    for _ in range(400):
        ids = alphabet[: rng.randint(2, len(alphabet))]
        tokens = [rng.choice(ids) for _ in range(rng.randint(*length))]
        num_draft, min_w, max_w = rng.randint(0, 5), rng.randint(1, 3), rng.randint(1, 6)
        expected = _ngram_reference(tokens, num_draft, min_w, max_w)
        assert propose_ngram(tokens, num_draft, min_w, max_w) == expected, tokens


@pytest.mark.parametrize("bad_id", [-1, 1 << 28])
@pytest.mark.parametrize("length", [3, 40])
def test_ngram_rejects_ids_out_of_range(bad_id, length):
    with pytest.raises(ValueError, match="token ids"):
        propose_ngram([1] * (length - 1) + [bad_id], 2)


def test_ngram_index_is_incremental_propose_ngram():
    rng = random.Random(1)
    tokens = [rng.randrange(4) for _ in range(10)]
    index = NgramIndex(tokens, max_window=5)
    for _ in range(60):
        new = [rng.randrange(4) for _ in range(rng.choice([1, 2, 3, 20]))]
        tokens += new
        index.append(new)
        assert len(index) == len(tokens)
        assert index.propose(4) == propose_ngram(tokens, 4, max_window=5)


# ---------------------------------------------------------------- greedy


def _plain_greedy(logits_rows: torch.Tensor, draft: list[int]) -> list[int]:
    """What token-by-token greedy decoding emits given the verify rows."""
    out = []
    for j in range(len(draft) + 1):
        token = int(torch.argmax(logits_rows[j]))
        out.append(token)
        if j == len(draft) or token != draft[j]:
            return out
    return out


def _drafts_near_argmax(logits: torch.Tensor, ks: list[int], rng: random.Random):
    """Drafts equal to each row's argmax with probability 0.7, else random."""
    best = logits.argmax(-1).tolist()
    drafts, row = [], 0
    for k in ks:
        vocab = logits.shape[1]
        drafts.append(
            [best[row + j] if rng.random() < 0.7 else rng.randrange(vocab) for j in range(k)]
        )
        row += k + 1
    return drafts


def test_greedy_equals_plain_greedy_decoding():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        ks = [rng.randint(0, 5) for _ in range(rng.randint(1, 6))]
        logits = torch.randn(sum(k + 1 for k in ks), 32, generator=gen)
        drafts = _drafts_near_argmax(logits, ks, rng)
        out = verify_greedy(logits, drafts)
        row = 0
        for draft, got in zip(drafts, out):
            assert got == _plain_greedy(logits[row : row + len(draft) + 1], draft)
            assert 1 <= len(got) <= len(draft) + 1
            row += len(draft) + 1


def test_greedy_plain_decode_rows_and_mixed_k():
    logits = torch.full((1 + 3 + 1, 8), -1.0)
    logits[0, 4] = logits[1, 6] = logits[2, 1] = logits[3, 2] = logits[4, 7] = 1.0
    # request 0: k=0; request 1: drafts [6, 5] -> 6 accepted, 5 rejected at row 2 (argmax 1)
    # request 2: k=0
    assert verify_greedy(logits, [[], [6, 5], []]) == [[4], [6, 1], [7]]
    assert verify_greedy(logits[1:4], [[6, 1]]) == [[6, 1, 2]]  # all accepted: bonus row 2


# ---------------------------------------------------------------- target_probs


def _target_probs_reference(logits, temperature, top_k, top_p, min_p):
    """One row at a time, straight from the rules."""
    probs = torch.softmax(logits / temperature, dim=-1)
    weights, ids = probs.sort(descending=True)
    kept = torch.zeros_like(probs)
    mass_before = 0.0
    for rank, (w, t) in enumerate(zip(weights.tolist(), ids.tolist())):
        if rank < top_k and mass_before <= top_p and w >= min_p * weights[0].item():
            kept[t] = w
        mass_before += w
    return kept / kept.sum()


@pytest.mark.parametrize("vocab", [12, 3000])  # 3000: past the sampler's 1024 candidates
def test_target_probs_matches_a_row_by_row_reference(vocab):
    gen = torch.Generator().manual_seed(3)
    settings = [  # temperature, top_k, top_p, min_p
        (1.0, vocab, 1.0, 0.0),
        (0.7, 5, 1.0, 0.0),
        (1.3, vocab + 10, 0.8, 0.0),
        (1.0, vocab, 1.0, 0.2),
        (0.5, 4, 0.9, 0.05),
        (50.0, vocab, 0.95, 0.0),  # flat: top-p reaches past the first candidates
    ]
    logits = torch.randn(len(settings), vocab, generator=gen) * 3
    temps, top_ks, top_ps, min_ps = (torch.tensor(c) for c in zip(*settings))
    got = target_probs(logits, temps.float(), top_ks.long(), top_ps.float(), min_ps.float())
    for row, (t, k, p, m) in enumerate(settings):
        expected = _target_probs_reference(logits[row], t, k, p, m)
        assert torch.allclose(got[row], expected, atol=1e-6), settings[row]


def test_target_probs_only_top_k_and_only_min_p_batches():
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(4))
    ones, zeros = torch.ones(2), torch.zeros(2)
    got = target_probs(logits, ones, torch.tensor([3, 10]), ones, zeros)
    assert torch.allclose(got[0], _target_probs_reference(logits[0], 1.0, 3, 1.0, 0.0))
    assert torch.allclose(got[1], torch.softmax(logits[1], -1))
    got = target_probs(logits, ones, torch.tensor([10, 10]), ones, torch.tensor([0.3, 0.0]))
    assert torch.allclose(got[0], _target_probs_reference(logits[0], 1.0, 10, 1.0, 0.3))


def test_target_probs_matches_what_the_sampler_draws():
    vocab, draws = 8, 20000
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.2, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05)
    info = SamplingBatchInfo.from_requests([params] * draws, [[] for _ in range(draws)], vocab)
    torch.manual_seed(5)
    sampled = Sampler()(logits.expand(draws, vocab), info).next_token_ids
    expected = target_probs(
        logits, torch.tensor([0.8]), torch.tensor([6]), torch.tensor([0.9]), torch.tensor([0.05])
    )[0]
    _assert_follows(torch.bincount(sampled, minlength=vocab), expected)


# ---------------------------------------------------------------- distribution

VOCAB = 6
CHI2_Z_0_001 = 3.0902  # standard normal quantile at 1 - 0.001


def _chi2_critical(df: int) -> float:
    """Wilson-Hilferty: chi-square quantile at p = 0.001 (a little conservative)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + CHI2_Z_0_001 * math.sqrt(a)) ** 3


def _chi2_statistic(counts: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom); inf when a token of probability 0 appears."""
    support = expected_probs > 0
    if int(counts[~support].sum()) > 0:
        return math.inf, int(support.sum()) - 1
    total = counts.sum().item()
    expected = expected_probs[support].double() * total
    stat = ((counts[support].double() - expected) ** 2 / expected).sum().item()
    return stat, int(support.sum()) - 1


def _assert_follows(counts: torch.Tensor, expected_probs: torch.Tensor) -> None:
    stat, df = _chi2_statistic(counts, expected_probs)
    assert stat < _chi2_critical(df), (stat, df, counts.tolist(), expected_probs.tolist())


def _chain() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Markov target and a different draft, over positions 0..3.

    p0 [V]: first row; p_next [3, V, V]: row j >= 1 given the previous token;
    q the same shapes for the draft. p0 gives token 5 probability 0 while the
    draft likes it.
    """
    gen = torch.Generator().manual_seed(11)
    p0 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.0])
    p_next = torch.softmax(torch.randn(3, VOCAB, VOCAB, generator=gen), dim=-1)
    q0 = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.20, 0.20])
    q_next = torch.softmax(torch.randn(3, VOCAB, VOCAB, generator=gen) * 1.5, dim=-1)
    return torch.stack([p0, q0]), p_next, q_next


def _rows_for(drafts: torch.Tensor, first: torch.Tensor, nexts: torch.Tensor) -> torch.Tensor:
    """[trials * (k+1), V]: row 0 = first, row j = nexts[j-1][d_j] (the verify rows)."""
    trials, k = drafts.shape
    rows = [first.expand(trials, VOCAB)] + [nexts[j][drafts[:, j]] for j in range(k)]
    return torch.stack(rows, dim=1).reshape(trials * (k + 1), VOCAB)


def _draw_drafts(trials: int, k: int, q0, q_next, gen) -> torch.Tensor:
    """int64[trials, k]: each d_j from the draft's distribution given d_{j-1}."""
    tokens = [torch.multinomial(q0.expand(trials, VOCAB), 1, generator=gen).squeeze(1)]
    for j in range(1, k):
        tokens.append(torch.multinomial(q_next[j - 1][tokens[-1]], 1, generator=gen).squeeze(1))
    return torch.stack(tokens, dim=1)


def _draft_rows(drafts: torch.Tensor, q0, q_next) -> torch.Tensor:
    """[trials * k, V]: the q each draft token was drawn from."""
    trials, k = drafts.shape
    rows = [q0.expand(trials, VOCAB)] + [q_next[j - 1][drafts[:, j - 1]] for j in range(1, k)]
    return torch.stack(rows, dim=1).reshape(trials * k, VOCAB)


def _position_stats(outputs: list[list[int]], p0, p_next) -> list[tuple[float, float]]:
    """(chi-square statistic, critical value at p = 0.001) per output position.

    Token 0 against p0; token j (where present) against p_next[j-1][token j-1],
    pooled over the previous token.
    """
    first = torch.bincount(torch.tensor([o[0] for o in outputs]), minlength=VOCAB)
    stat, df = _chi2_statistic(first, p0)
    stats = [(stat, _chi2_critical(df))]
    for j in range(1, max(len(o) for o in outputs)):
        stat, df = 0.0, 0
        for prev in range(VOCAB):
            nxt = [o[j] for o in outputs if len(o) > j and o[j - 1] == prev]
            if len(nxt) < 200:  # too few for an expected count of >= 5 per cell
                continue
            counts = torch.bincount(torch.tensor(nxt), minlength=VOCAB)
            s, d = _chi2_statistic(counts, p_next[j - 1][prev])
            stat, df = stat + s, df + d
        assert df > 0, f"no position-{j} data"
        stats.append((stat, _chi2_critical(df)))
    return stats


def _check_target_distribution(outputs: list[list[int]], p0, p_next) -> None:
    stats = _position_stats(outputs, p0, p_next)
    assert all(stat < critical for stat, critical in stats), stats


def _sampled_case(k: int, trials: int = 30000):
    (p0, q0), p_next, q_next = _chain()
    gen = torch.Generator().manual_seed(100 + k)
    drafts = _draw_drafts(trials, k, q0, q_next, gen)
    probs = _rows_for(drafts, p0, p_next)
    return drafts, probs, _draft_rows(drafts, q0, q_next), (p0, p_next), gen


@pytest.mark.parametrize("k", [2, 3])
def test_rejection_sampling_keeps_the_target_distribution(k):
    drafts, probs, q_rows, (p0, p_next), gen = _sampled_case(k)
    outputs = verify_sampling(probs, drafts.tolist(), q_rows, generator=gen)
    assert all(1 <= len(o) <= k + 1 for o in outputs)
    assert any(len(o) == k + 1 for o in outputs) and any(len(o) == 1 for o in outputs)
    _check_target_distribution(outputs, p0, p_next)


def test_ngram_drafts_keep_the_target_distribution():
    (p0, _), p_next, _ = _chain()
    trials = 30000
    fixed = torch.tensor([[0, 1, 2], [5, 3, 3], [2, 2, 0]])  # likely, impossible, middling
    drafts = fixed[torch.arange(trials) % len(fixed)]
    probs = _rows_for(drafts, p0, p_next)
    gen = torch.Generator().manual_seed(7)
    outputs = verify_sampling(probs, drafts.tolist(), None, generator=gen)
    assert all(o[0] != 5 for o in outputs)  # p0[5] = 0: that draft is always rejected
    _check_target_distribution(outputs, p0, p_next)


def test_equal_target_and_draft_accept_everything():
    p = torch.tensor([[0.2, 0.3, 0.5, 0.0, 0.0, 0.0]]).repeat(3, 1)
    outputs = verify_sampling(p, [[1, 2]], p[:2].clone(), torch.Generator().manual_seed(0))
    assert outputs[0][:2] == [1, 2] and len(outputs[0]) == 3


def test_certain_target_rejects_the_other_ngram_draft():
    p = torch.zeros(2, VOCAB)
    p[:, 3] = 1.0
    for seed in range(20):
        out = verify_sampling(p, [[1]], None, torch.Generator().manual_seed(seed))
        assert out == [[3]]


def test_mixed_k_batch_with_plain_decode_rows():
    p = torch.softmax(torch.randn(1 + 3 + 1, VOCAB, generator=torch.Generator().manual_seed(2)), -1)
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3)), -1)
    outputs = verify_sampling(p, [[], [1, 4], []], q, torch.Generator().manual_seed(0))
    assert [len(o) for o in outputs][0::2] == [1, 1] and 1 <= len(outputs[1]) <= 3


def test_last_token_draw_never_lands_on_a_zero_weight_column():
    # the largest uniform below 1 and zero both stay on the support
    weights = torch.tensor([[0.3, 0.0, 0.0], [0.0, 0.7, 0.0], [0.0, 0.5, 0.0]])
    largest_uniform = torch.tensor([1.0 - 2.0**-24] * 3)
    assert _inverse_cdf(weights, largest_uniform).tolist() == [0, 1, 1]
    assert _inverse_cdf(weights, torch.zeros(3)).tolist() == [0, 1, 1]


def _always_accept(probs: torch.Tensor, drafts: list[list[int]], gen) -> list[list[int]]:
    """Deliberately wrong: every draft kept, the last token drawn from the last row."""
    out, row = [], 0
    for draft in drafts:
        row += len(draft)
        last = int(torch.multinomial(probs[row], 1, generator=gen))
        out.append(draft + [last])
        row += 1
    return out


def _redraw_from_p(probs, drafts, draft_probs, gen) -> list[list[int]]:
    """Deliberately wrong: after a rejection, draw from p instead of max(0, p - q)."""
    flat_d = [d for draft in drafts for d in draft]
    u = torch.rand(len(flat_d), generator=gen).tolist()
    out, row, drow = [], 0, 0
    for draft in drafts:
        tokens = []
        for d in draft:
            if u[drow] * draft_probs[drow, d] >= probs[row, d]:
                break
            tokens.append(d)
            row, drow = row + 1, drow + 1
        out.append(tokens + [int(torch.multinomial(probs[row], 1, generator=gen))])
        row += len(draft) + 1 - len(tokens)
        drow += len(draft) - len(tokens)
    return out


def test_negative_controls_fail_the_same_check():
    drafts, probs, q_rows, (p0, p_next), gen = _sampled_case(2, trials=20000)
    wrong_outputs = [
        _always_accept(probs, drafts.tolist(), gen),
        _redraw_from_p(probs, drafts.tolist()[:8000], q_rows, gen),
    ]
    for outputs in wrong_outputs:
        stats = _position_stats(outputs, p0, p_next)
        # a finite statistic over the critical value: the chi-square itself catches it
        assert any(critical < stat < math.inf for stat, critical in stats), stats
        with pytest.raises(AssertionError):
            _check_target_distribution(outputs, p0, p_next)


# ---------------------------------------------------------------- logprobs


def test_accepted_logprobs_are_raw_log_softmax_at_accepted_tokens():
    logits = torch.randn(1 + 3 + 2, 10, generator=torch.Generator().manual_seed(9))
    drafts = [[], [4, 2], [7]]
    accepted = [[3], [4, 2, 9], [1]]
    got = accepted_logprobs(logits, drafts, accepted)
    ls = torch.log_softmax(logits, -1)
    expected = [[ls[0, 3]], [ls[1, 4], ls[2, 2], ls[3, 9]], [ls[4, 1]]]
    assert [len(g) for g in got] == [1, 3, 1]
    for g, e in zip(got, expected):
        assert g == pytest.approx([x.item() for x in e], abs=1e-6)
