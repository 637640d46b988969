"""Issue 9 (part 4) regressions: paged admission, multi-token stop strings,
--skip-tokenizer-init, n samples with seeds, batch failure and abort replies."""

from __future__ import annotations

import pytest
from test_scheduler import make_scheduler, request, run_until_idle

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- 1. page_size > 1


def _six_prompts() -> list[list[int]]:
    return [[100 + 7 * i + k for k in range(5)] for i in range(6)]


@pytest.mark.parametrize("max_new", [0, 6])
def test_paged_pool_queues_instead_of_over_committing(tiny_llama_dir, max_new):
    """8 pages of 4 slots; six 5-token prompts need 12 pages: admit 4, queue 2."""
    outputs = {}
    for fields in ({"page_size": 4, "max_total_tokens": 32}, {}):
        sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
        try:
            for i, ids in enumerate(_six_prompts()):
                sched.recv_from_tokenizer.send(request(str(i), ids, max_new=max_new))
            got = run_until_idle(sched)  # asserts pool integrity once idle
        finally:
            ctx.restore()
        assert sorted(got) == [str(i) for i in range(6)]
        for msgs in got.values():
            assert msgs[-1][1]["type"] == "length"
        outputs[len(fields)] = {r: sum((ids for ids, _ in m), []) for r, m in got.items()}
    assert outputs[2] == outputs[0]  # the small paged pool changes nothing but timing
    assert all(len(ids) == max_new for ids in outputs[2].values())
