"""Data parallelism: dp_size 2 behind the DP controller, every balance method.

The DP Engines run under SGLANG_ROLE_NAMESPACES=enforce, so a config read by the
controller outside its role's namespace set fails the test (and CI).
"""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from http_server_fixture import start_server

pytestmark = pytest.mark.slow

LIGHT = {"num_threads": 1, "log_level": "warning", "max_total_tokens": 4096}
NUM_PROMPTS = 64


def mixed_workload(seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    """64 prompts of 2..80 tokens, each with its own max_new_tokens (1..12), greedy."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 4000) for _ in range(rng.randint(2, 80))] for _ in range(64)]
    params = [
        {"max_new_tokens": rng.randint(1, 12), "temperature": 0.0, "ignore_eos": True}
        for _ in prompts
    ]
    return prompts, params


def shared_prefix_workload(seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """8 prefixes of 64 tokens, 8 prompts each (prefix + 8 own tokens): a first wave
    with one prompt per prefix, then the other 56 shuffled."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 4000) for _ in range(64)] for _ in range(8)]
    prompts = [[p + [rng.randrange(3, 4000) for _ in range(8)] for _ in range(8)] for p in prefixes]
    first = [group[0] for group in prompts]
    rest = [prompt for group in prompts for prompt in group[1:]]
    rng.shuffle(rest)
    return first, rest


def cache_hit_rate(llm, waves: list[list[list[int]]]) -> float:
    """Prompt tokens served from the prefix cache over all the waves' prompts."""
    params = {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}
    cached = total = 0
    for wave in waves:
        for out in llm.generate(input_ids=wave, sampling_params=params):
            cached += out["meta_info"]["cached_tokens"]
            total += out["meta_info"]["prompt_tokens"]
    return cached / total


@pytest.fixture(scope="module")
def reference(tiny_llama_dir) -> list[list[int]]:
    import sglang as sgl

    prompts, params = mixed_workload()
    with sgl.Engine(model_path=str(tiny_llama_dir), **LIGHT) as llm:
        return [o["output_ids"] for o in llm.generate(input_ids=prompts, sampling_params=params)]


@pytest.fixture
def enforce_roles(monkeypatch):
    monkeypatch.setenv("SGLANG_ROLE_NAMESPACES", "enforce")


def dp_engine(model_dir, method: str):
    import sglang as sgl

    return sgl.Engine(model_path=str(model_dir), dp_size=2, load_balance_method=method, **LIGHT)


def assert_every_rank_served(llm) -> list[dict]:
    states = llm.get_server_info()["internal_states"]
    assert [s["dp_rank"] for s in states] == [0, 1]
    assert all(s["cached_kv_tokens"] > 0 for s in states), states  # finished KV stays cached
    assert all(s["memory_integrity"] == "ok" for s in states)
    return states


@pytest.mark.usefixtures("enforce_roles")
@pytest.mark.parametrize("method", ["round_robin", "shortest_queue", "prefix_aware"])
def test_dp2_greedy_equals_dp1_and_every_rank_serves(tiny_llama_dir, reference, method):
    prompts, params = mixed_workload()
    with dp_engine(tiny_llama_dir, method) as llm:
        outs = llm.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in outs] == reference
        states = assert_every_rank_served(llm)
        assert {s["dp_size"] for s in states} == {2} and states[0]["pid"] != states[1]["pid"]
        assert llm.flush_cache()
        assert all(s["cached_kv_tokens"] == 0 for s in llm.get_internal_state())
        first, rest = shared_prefix_workload()
        hit_rate = cache_hit_rate(llm, [first, rest])
        print(f"{method}: shared-prefix cache hit rate {hit_rate:.3f}")
        HIT_RATES[method] = hit_rate


HIT_RATES: dict[str, float] = {}  # filled by the test above, else by the one below


def test_prefix_aware_hits_the_cache_more_than_round_robin(tiny_llama_dir):
    for method in ("round_robin", "prefix_aware"):
        if method not in HIT_RATES:  # run alone (-k): measure it here
            with dp_engine(tiny_llama_dir, method) as llm:
                HIT_RATES[method] = cache_hit_rate(llm, list(shared_prefix_workload()))
    # 56 of the 64 prompts find their 64-token prefix cached on the rank they go to
    assert HIT_RATES["prefix_aware"] > 0.75, HIT_RATES
    assert HIT_RATES["prefix_aware"] > HIT_RATES["round_robin"] + 0.2, HIT_RATES


@pytest.mark.usefixtures("enforce_roles")
def test_abort_and_control_reach_every_rank(tiny_llama_dir):
    long = {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    with dp_engine(tiny_llama_dir, "round_robin") as llm:
        with ThreadPoolExecutor(2) as pool:
            runs = [
                pool.submit(llm.generate, input_ids=[k, 5, 6], sampling_params=long, rid=f"r{k}")
                for k in (10, 11)
            ]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                states = llm.get_internal_state()
                if all(s["num_running_reqs"] == 1 for s in states):
                    break
                time.sleep(0.05)
            assert all(s["num_running_reqs"] == 1 for s in states), states  # one per rank
            assert not llm.flush_cache()  # every rank is busy
            assert llm.abort_request("r10")
            first = runs[0].result(timeout=30)
            # one rank idle, one busy: the idle one flushes, and the answer says which
            flushed, busy = llm._run(llm.tokenizer_manager.flush_cache_ranks())
            assert len(flushed) == 1 and len(busy) == 1 and flushed != busy
            assert llm.abort_request("r11")
            outs = [first, runs[1].result(timeout=30)]
        assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
        assert all(len(o["output_ids"]) < 400 for o in outs)
        assert llm.flush_cache()
        ok, message = llm.update_weights_from_disk(str(tiny_llama_dir))
        assert ok, message


def test_a_refused_weight_update_changes_no_rank(tiny_llama_dir):
    """One rank busy, one idle: the update is refused and neither rank loads it (the
    idle rank used to load it while the busy one refused: two models behind one name)."""
    long = {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    greedy = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    with dp_engine(tiny_llama_dir, "round_robin") as llm, ThreadPoolExecutor(1) as pool:
        run = pool.submit(llm.generate, input_ids=[10, 5, 6], sampling_params=long, rid="busy")
        deadline = time.monotonic() + 60
        while sum(s["num_running_reqs"] for s in llm.get_internal_state()) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ok, message = llm.update_weights_from_disk(str(tiny_llama_dir), load_format="dummy")
        assert not ok and "in flight" in message
        assert llm.abort_request("busy")
        run.result(timeout=30)
        outs = [llm.generate(input_ids=[7, 8, 9], sampling_params=greedy) for _ in range(2)]
        assert outs[0]["output_ids"] == outs[1]["output_ids"]  # round robin: both ranks
        assert {s["load_format"] for s in llm.get_server_info()["internal_states"]} == {"auto"}


def test_dead_scheduler_of_one_rank_fails_requests_and_exits(tiny_llama_dir, tmp_path):
    """A server with dp 2: a frozen DP rank 1 makes /health 503 while rank 0 keeps
    sending output (it read 200 until the watchdog); killing rank 1's scheduler answers
    the requests in flight within seconds, the server exits non-zero, and no process is
    left behind."""
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--dp-size", "2",
                       env={"SGLANG_HEALTH_TIMEOUT": "1"})  # fmt: skip
    try:
        tree = [psutil.Process(srv.proc.pid), *psutil.Process(srv.proc.pid).children(True)]
        states = requests.get(srv.base_url + "/server_info", timeout=30).json()["internal_states"]
        assert [s["dp_rank"] for s in states] == [0, 1]
        assert_health_follows_a_frozen_rank(srv, psutil.Process(states[1]["pid"]))
        body = {
            "input_ids": [5, 6, 7],
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        }
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(requests.post, srv.base_url + "/generate", json=body, timeout=120)
                for _ in range(4)
            ]
            time.sleep(2.0)  # both ranks are decoding
            killed_at = time.monotonic()
            psutil.Process(states[1]["pid"]).kill()
            statuses = [f.result(timeout=15).status_code for f in futures]
            answered_s = time.monotonic() - killed_at
        assert statuses == [503] * 4 and answered_s < 10, (statuses, answered_s)
        assert srv.proc.wait(timeout=30) != 0
        assert "scheduler (dp rank 1)" in srv.log() and "exited unexpectedly" in srv.log()
        assert_all_gone(tree)
    finally:
        srv.stop(signal.SIGKILL)


def assert_health_follows_a_frozen_rank(srv, rank: psutil.Process) -> None:
    """Two long requests (one a rank): rank 0 keeps streaming while rank 1 is stopped."""
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with ThreadPoolExecutor(2) as pool:
        busy = [pool.submit(requests.post, srv.base_url + "/generate", json=body, timeout=120)
                for _ in range(2)]  # fmt: skip
        rank.suspend()
        try:
            codes, deadline = [], time.monotonic() + 15
            while 503 not in codes and time.monotonic() < deadline:
                codes.append(requests.get(srv.base_url + "/health", timeout=30).status_code)
                time.sleep(0.2)
            requests.post(srv.base_url + "/abort_request", json={"abort_all": True}, timeout=30)
        finally:
            rank.resume()
        for future in busy:
            future.result(timeout=60)
    assert codes[-1] == 503, codes
    assert requests.get(srv.base_url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize("role", ["dp_controller", "detokenizer"])
def test_a_frozen_relay_process_is_killed_and_requests_fail(tiny_llama_dir, tmp_path, role):
    """SIGSTOP freezes a process between the ranks and the HTTP side: the controller that
    routes requests to the ranks, or the detokenizer (its own process under dp > 1) that
    relays their outputs; every request waited forever. The launcher sees it stop
    stepping and kills it past --watchdog-timeout; the request gets a 503 and the server
    exits."""
    from sglang.srt.entrypoints.engine import hang_limit_s
    from sglang.test.soak import server_processes

    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--dp-size", "2",
                       "--watchdog-timeout", "1")  # fmt: skip
    try:
        roles = server_processes(srv.proc.pid)
        tree = [p for _, p in roles]
        frozen = dict(roles)[role]
        frozen.suspend()
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
        status = requests.post(srv.base_url + "/generate", json=body,
                               timeout=hang_limit_s(1.0) + 15).status_code  # fmt: skip
        assert status == 503
        assert srv.proc.wait(timeout=30) != 0
        assert f"The {role} process (pid {frozen.pid}) was killed after" in srv.log()
        assert_all_gone(tree)
    finally:
        srv.stop(signal.SIGKILL)


def assert_all_gone(tree: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in tree if _alive(p)]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"orphans left: {alive}")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
