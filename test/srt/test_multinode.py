"""Multi-node tensor parallelism on loopback (issue 11): two launchers, `--nnodes 2
--node-rank 0/1 --tp-size 2`, form one server. Node 0 serves HTTP with TP rank 0;
node 1 runs TP rank 1 only. Greedy outputs equal a single-node tp 2 server's;
losing node 1 fails node 0's pending requests within seconds and both exit non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
from http_server_fixture import (
    SMALL_SERVER_FLAGS,
    ServerProcess,
    free_dist_port,
    start_server,
)

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time"]
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
ANSWER_WITHIN_S = 10.0


def _generate(base_url: str, sampling_params: dict) -> list[list[int]]:
    body = {"text": PROMPTS, "sampling_params": sampling_params}
    r = requests.post(base_url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return [out["output_ids"] for out in r.json()]


def start_worker_node(
    model_dir: Path, log_path: Path, dist_addr: str, parallel: tuple[str, ...] = ("--tp-size", "2")
) -> subprocess.Popen:
    """Node 1: its own launcher (its own process group), no HTTP port."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
           *SMALL_SERVER_FLAGS, "--log-level", "info", *parallel, "--nnodes", "2",
           "--node-rank", "1", "--dist-init-addr", dist_addr]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher, then SIGKILL its whole process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)


class TwoNodes:
    """Node 1's launcher and node 0's server; both stopped (groups killed) on exit."""

    def __init__(self, model_dir: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
        dist_addr = f"127.0.0.1:{free_dist_port()}"
        self.node1_log = tmp_path / "node1.log"
        self.node1 = start_worker_node(model_dir, self.node1_log, dist_addr,
                                       ("--tp-size", "2", *extra))  # fmt: skip
        self.node0: ServerProcess | None = None
        try:
            self.node0 = start_server(model_dir, tmp_path / "node0.log", "--tp-size", "2",
                                      "--nnodes", "2", "--node-rank", "0",
                                      "--dist-init-addr", dist_addr, *extra)  # fmt: skip
        except BaseException:
            stop_group(self.node1)
            raise

    def close(self) -> None:
        if self.node0 is not None:
            self.node0.stop(signal.SIGKILL)
        stop_group(self.node1)


@pytest.fixture
def two_nodes(tiny_llama_dir, tmp_path):
    nodes = TwoNodes(tiny_llama_dir, tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


def test_tp2_across_two_nodes_matches_one_node(tiny_llama_dir, tmp_path, two_nodes):
    node1_log = two_nodes.node1_log.read_text(errors="replace")
    assert "scheduler ranks only, no HTTP server" in node1_log
    assert "Uvicorn" not in node1_log and "Application startup" not in node1_log
    across = _generate(two_nodes.node0.base_url, GREEDY)
    # node 0 runs TP rank 0 only (and the detokenizer): two spawned children
    node0_children = psutil.Process(two_nodes.node0.proc.pid).children()
    assert len([p for p in node0_children if "spawn_main" in " ".join(p.cmdline())]) == 2
    two_nodes.close()
    single = start_server(tiny_llama_dir, tmp_path / "single.log", "--tp-size", "2")
    try:
        assert _generate(single.base_url, GREEDY) == across
    finally:
        single.stop()


def _long_request(base_url: str) -> int:
    body = {"text": "Once", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    return requests.post(base_url + "/generate", json=body, timeout=120).status_code


def test_losing_node1_fails_requests_fast_and_both_exit(two_nodes):
    node0, node1 = two_nodes.node0, two_nodes.node1
    tree0 = [psutil.Process(node0.proc.pid), *psutil.Process(node0.proc.pid).children(True)]
    tree1 = [psutil.Process(node1.pid), *psutil.Process(node1.pid).children(True)]
    with ThreadPoolExecutor(2) as pool:
        pending = [pool.submit(_long_request, node0.base_url) for _ in range(2)]
        time.sleep(2.0)  # both are decoding
        assert not any(f.done() for f in pending)
        killed_at = time.monotonic()
        os.killpg(node1.pid, signal.SIGKILL)  # the whole node: launcher and its rank
        for future in pending:
            assert future.result(timeout=ANSWER_WITHIN_S) == 503
        answered_s = time.monotonic() - killed_at
    assert node0.proc.wait(timeout=30) != 0
    assert "scheduler (tp rank 0)" in node0.log() and "exited unexpectedly" in node0.log()
    assert answered_s < ANSWER_WITHIN_S
    assert_all_gone(tree0 + tree1)


def test_node1_exits_nonzero_when_node0_goes(two_nodes):
    node0, node1 = two_nodes.node0, two_nodes.node1
    tree1 = [psutil.Process(node1.pid), *psutil.Process(node1.pid).children(True)]
    os.killpg(node0.proc.pid, signal.SIGKILL)
    assert node1.wait(timeout=30) == 1
    assert "exited unexpectedly" in two_nodes.node1_log.read_text(errors="replace")
    assert_all_gone(tree1)


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


def scheduler_children(launcher_pid: int) -> list[psutil.Process]:
    """The scheduler ranks a launcher spawned (multiprocessing spawn children)."""
    children = psutil.Process(launcher_pid).children(recursive=True)
    return [p for p in children if "spawn_main" in " ".join(p.cmdline())]


def test_a_frozen_rank_on_node1_ends_both_nodes(tiny_llama_dir, tmp_path):
    """Node 1 watches its rank's steps too: a frozen (SIGSTOP) rank there is killed past
    --watchdog-timeout, so node 1 exits as node 0 does (it used to stay forever)."""
    pair = TwoNodes(tiny_llama_dir, tmp_path, ("--watchdog-timeout", "2"))
    try:
        for rank in scheduler_children(pair.node1.pid):
            rank.send_signal(signal.SIGSTOP)
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}
        reply = requests.post(pair.node0.base_url + "/generate", json=body, timeout=60)
        assert reply.status_code == 503
        assert pair.node0.proc.wait(timeout=60) == 1
        assert pair.node1.wait(timeout=60) == 1
        assert "has not stepped" in pair.node1_log.read_text(errors="replace")
    finally:
        pair.close()
