"""Multi-node data parallelism on loopback (issue 11): two launchers, `--dp-size 2
--nnodes 2 --node-rank 0/1`, form one server with one DP group per node. Node 0 serves
HTTP and runs the DP controller, the detokenizer and DP rank 0; node 1 runs DP rank 1
and relays its queues over the node link (ports --dist-init-addr + 100/101). Greedy
outputs equal single-node dp 2 and dp 1; control messages reach the remote rank;
losing node 1 fails node 0's pending requests within seconds and node 0 exits
non-zero; losing node 0 makes node 1 exit 1.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
from http_server_fixture import ServerProcess, free_dist_port, start_server
from test_multinode import assert_all_gone, scheduler_children, start_worker_node, stop_group

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "Once upon a time",
    "A tiny model says",
    "import numpy as np",
    "Hello",
    "The quick brown fox jumps over the lazy dog and then",
]
GREEDY = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
DP2 = ("--dp-size", "2")
ANSWER_WITHIN_S = 10.0
LIGHT = {"num_threads": 1, "log_level": "warning", "max_total_tokens": 32768}


class DpNodes:
    """Node 1's launcher and node 0's server; both stopped (groups killed) on close."""

    def __init__(self, model_dir: Path, log_dir: Path, extra: tuple[str, ...] = ()) -> None:
        self.dist_addr = f"127.0.0.1:{free_dist_port()}"
        self.node1_log = log_dir / "node1.log"
        self.node1 = start_worker_node(model_dir, self.node1_log, self.dist_addr, (*DP2, *extra))
        self.node0: ServerProcess | None = None
        try:
            self.node0 = start_server(model_dir, log_dir / "node0.log", *DP2, "--nnodes", "2",
                                      "--node-rank", "0", "--dist-init-addr", self.dist_addr,
                                      "--log-level", "info", *extra)  # fmt: skip
        except BaseException:
            stop_group(self.node1)
            raise

    def node1_log_text(self) -> str:
        return self.node1_log.read_text(errors="replace")

    def trees(self) -> list[psutil.Process]:
        roots = [psutil.Process(self.node0.proc.pid), psutil.Process(self.node1.pid)]
        return [p for root in roots for p in (root, *root.children(recursive=True))]

    def close(self) -> None:
        if self.node0 is not None:
            self.node0.stop(signal.SIGKILL)
        stop_group(self.node1)


@pytest.fixture(scope="module")
def references(tiny_llama_dir) -> dict[int, list[list[int]]]:
    """Greedy output ids of PROMPTS from one-node Engines with dp 1 and dp 2."""
    import sglang as sgl

    outs = {}
    for dp_size in (1, 2):
        with sgl.Engine(model_path=str(tiny_llama_dir), dp_size=dp_size, **LIGHT) as llm:
            outs[dp_size] = [o["output_ids"] for o in llm.generate(PROMPTS, GREEDY)]
    return outs


@pytest.fixture(scope="module")
def nodes(tiny_llama_dir, tmp_path_factory, references):
    """One pair for the module (the node-1 loss test, last but one, ends it)."""
    pair = DpNodes(tiny_llama_dir, tmp_path_factory.mktemp("dp-nodes"))
    try:
        yield pair
    finally:
        pair.close()


def _generate(base_url: str) -> list[list[int]]:
    body = {"text": PROMPTS, "sampling_params": GREEDY}
    r = requests.post(base_url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return [out["output_ids"] for out in r.json()]


def _internal_states(base_url: str) -> list[dict]:
    return requests.get(base_url + "/server_info", timeout=30).json()["internal_states"]


def test_dp2_across_two_nodes_matches_one_node_and_both_ranks_serve(nodes, references):
    assert references[2] == references[1]
    log1 = nodes.node1_log_text()
    assert "scheduler ranks only, no HTTP server" in log1 and "Uvicorn" not in log1
    assert _generate(nodes.node0.base_url) == references[1]
    states = _internal_states(nodes.node0.base_url)
    assert [(s["dp_rank"], s["node_rank"]) for s in states] == [(0, 0), (1, 1)]
    assert all(s["cached_kv_tokens"] > 0 for s in states), states  # each served some
    node1_pids = {p.pid for p in psutil.Process(nodes.node1.pid).children(recursive=True)}
    assert states[1]["pid"] in node1_pids and states[0]["pid"] not in node1_pids
    # node 0 spawned its one scheduler, the DP controller and the detokenizer
    node0_children = psutil.Process(nodes.node0.proc.pid).children()
    assert len([p for p in node0_children if "spawn_main" in " ".join(p.cmdline())]) == 3


def _long_request(base_url: str, rid: str) -> requests.Response:
    body = {"input_ids": [5, 6, 7], "rid": rid,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
    return requests.post(base_url + "/generate", json=body, timeout=120)


def _wait_both_running(base_url: str, per_rank: int = 1) -> list[dict]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = _internal_states(base_url)
        if all(s["num_running_reqs"] == per_rank for s in states):
            return states
        time.sleep(0.1)
    raise AssertionError(f"not {per_rank} request(s) per rank: {states}")


def test_abort_and_flush_cache_reach_the_remote_rank(nodes):
    url = nodes.node0.base_url
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_long_request, url, f"long-{k}") for k in range(2)]
        _wait_both_running(url)  # round robin: one on each node
        assert requests.post(url + "/flush_cache", timeout=30).status_code == 400  # busy
        for k in range(2):
            r = requests.post(url + "/abort_request", json={"rid": f"long-{k}"}, timeout=30)
            assert r.json()["success"]
        outs = [run.result(timeout=30).json() for run in runs]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    assert requests.post(url + "/flush_cache", timeout=30).status_code == 200
    assert all(s["cached_kv_tokens"] == 0 for s in _internal_states(url))


def test_losing_node1_fails_requests_fast_and_node0_exits(nodes):
    url, tree = nodes.node0.base_url, nodes.trees()
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(_long_request, url, f"doomed-{k}") for k in range(4)]
        _wait_both_running(url, per_rank=2)  # two requests decoding on each node
        assert not any(f.done() for f in pending)
        killed_at = time.monotonic()
        os.killpg(nodes.node1.pid, signal.SIGKILL)  # the whole node: launcher and rank
        statuses = [f.result(timeout=ANSWER_WITHIN_S).status_code for f in pending]
        answered_s = time.monotonic() - killed_at
    assert statuses == [503] * 4 and answered_s < ANSWER_WITHIN_S, (statuses, answered_s)
    assert nodes.node0.proc.wait(timeout=30) != 0
    log0 = nodes.node0.log()
    assert "node 1: connection dropped" in log0 and "exited unexpectedly" in log0
    assert_all_gone(tree)


def test_node1_exits_nonzero_when_node0_goes(tiny_llama_dir, tmp_path):
    pair = DpNodes(tiny_llama_dir, tmp_path)
    try:
        tree1 = [psutil.Process(pair.node1.pid), *psutil.Process(pair.node1.pid).children(True)]
        os.killpg(pair.node0.proc.pid, signal.SIGKILL)
        assert pair.node1.wait(timeout=30) == 1
        assert "this node stops: node 0: connection dropped" in pair.node1_log_text()
        assert_all_gone(tree1)
    finally:
        pair.close()


def test_a_frozen_scheduler_on_node1_is_killed_and_both_nodes_exit(tiny_llama_dir, tmp_path):
    """Node 1 watches its DP group's steps: a frozen (SIGSTOP) scheduler there is killed
    past --watchdog-timeout, node 1 exits and node 0 fails that rank's requests (they
    used to hang forever while both nodes kept running)."""
    pair = DpNodes(tiny_llama_dir, tmp_path, ("--watchdog-timeout", "2"))
    try:
        for rank in scheduler_children(pair.node1.pid):
            rank.send_signal(signal.SIGSTOP)
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}

        def ask(_: int) -> int:
            return requests.post(pair.node0.base_url + "/generate", json=body, timeout=60).status_code

        with ThreadPoolExecutor(2) as pool:  # round robin: one on each rank
            statuses = sorted(pool.map(ask, range(2)))
        assert statuses[-1] == 503, statuses
        assert pair.node1.wait(timeout=60) == 1
        assert pair.node0.proc.wait(timeout=60) != 0
        assert "has not stepped" in pair.node1_log_text()
    finally:
        pair.close()
