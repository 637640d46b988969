"""The bounded CPU KV pool default, seen where an operator sees it: /server_info.

One Engine on the demo model with no pool flags (the rule itself is tested in
test/unit/test_kv_pool_default.py).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_server_info_reports_the_bounded_cpu_pool():
    import sglang as sgl
    from sglang.srt.model_executor.model_runner import CPU_KV_CONTEXTS

    with sgl.Engine(num_threads=1, log_level="warning", device="cpu") as llm:
        info = llm.get_server_info()
        out = llm.generate("Once upon a time", {"temperature": 0.0, "max_new_tokens": 4})
    state = info["internal_states"][0]
    assert info["mem_fraction_static"] is None and info["max_total_tokens"] is None
    # demo model: context 512, 6 layers x 2 kv heads x 64 x fp32 = 6 KiB/token -> 0.19 GiB
    assert state["max_total_num_tokens"] == 512 * CPU_KV_CONTEXTS
    assert len(out["output_ids"]) == 4
