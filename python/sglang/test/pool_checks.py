"""What an idle scheduler's state must show when nothing leaked (tests and soak)."""

from __future__ import annotations

from typing import Any


def idle_pool_problems(state: dict[str, Any]) -> list[str]:
    """The leak checks an `internal_states` entry fails, in words (empty: all pass):
    idle, integrity ok, free + cached KV == the pool, every request slot free."""
    problems = []
    if state.get("num_running_reqs") != 0 or state.get("num_queued_reqs") != 0:
        problems.append(f"not idle: running {state.get('num_running_reqs')}, "
                        f"queued {state.get('num_queued_reqs')}")  # fmt: skip
    if state.get("memory_integrity") != "ok":
        problems.append(f"memory integrity: {state.get('memory_integrity')}")
    kv = state.get("available_kv_tokens", 0) + state.get("cached_kv_tokens", 0)
    if kv != state.get("max_total_num_tokens"):
        problems.append(f"KV leak: free + cached = {kv} of {state.get('max_total_num_tokens')}")
    if state.get("free_req_slots") != state.get("total_req_slots"):
        problems.append(f"request slots: {state.get('free_req_slots')} free of "
                        f"{state.get('total_req_slots')}")  # fmt: skip
    if "draft_max_total_num_tokens" in state:  # speculative decoding's draft pool
        free, total = state["draft_available_kv_tokens"], state["draft_max_total_num_tokens"]
        if free != total:
            problems.append(f"draft KV leak: {total - free} of {total} slots held")
        if state["draft_free_req_slots"] != state["draft_total_req_slots"]:
            problems.append(f"draft request slots: {state['draft_free_req_slots']} free of "
                            f"{state['draft_total_req_slots']}")  # fmt: skip
    return problems


def stop_id_never_generated(outputs: list[list[int]], vocab_size: int) -> int:
    """A token id that none of `outputs` holds. As a stop token id it changes no output,
    but the request is then no longer one that only its length can end, so admission
    reserves its output by the decaying ratio (and a small pool can force retraction)."""
    seen = {token for out in outputs for token in out}
    return next(t for t in range(vocab_size - 1, -1, -1) if t not in seen)
