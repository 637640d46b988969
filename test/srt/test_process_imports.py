"""Only the processes that run the model import torch (issue #13, memory).

One server with --dp-size 2: the launcher (HTTP + TokenizerManager), the DP
controller and the detokenizer must not map libtorch; the two schedulers must.
Read from /proc/<pid>/maps, which needs no cooperation from the process.
"""

from __future__ import annotations

import psutil
import pytest
import requests
from http_server_fixture import start_server

from sglang.test.soak import maps_libtorch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("imports") / "server.log"
    server = start_server(tiny_llama_dir, log, "--dp-size", "2")
    yield server
    server.stop()


def spawned_children(pid: int) -> list[psutil.Process]:
    """The server's children (schedulers, DP controller, detokenizer), not
    multiprocessing's resource tracker."""
    children = psutil.Process(pid).children()
    return [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]


def test_launcher_does_not_import_torch(server):
    assert not maps_libtorch(server.proc.pid)


def test_only_the_schedulers_import_torch(server):
    children = spawned_children(server.proc.pid)
    assert len(children) == 4  # 2 schedulers, the DP controller, the detokenizer
    with_torch = [c.pid for c in children if maps_libtorch(c.pid)]
    assert len(with_torch) == 2, [(c.pid, c.cmdline()) for c in children]


def test_server_still_generates_text(server):
    """The detokenizer and the launcher use the scheduler's tokenizer (handed over)."""
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    out = requests.post(server.base_url + "/generate", json=body, timeout=60).json()
    assert out["meta_info"]["completion_tokens"] == 4 and out["text"]
    assert not maps_libtorch(server.proc.pid)


def maps_xgrammar(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libxgrammar" in maps.read()


def test_xgrammar_loads_with_the_first_constrained_request(server):
    """The grammar backend (~30 MiB resident) is built by the first constraint, in the
    scheduler that compiles it, not at start-up."""
    pids = [server.proc.pid] + [c.pid for c in spawned_children(server.proc.pid)]
    assert not any(maps_xgrammar(pid) for pid in pids)
    body = {"text": "Hello", "sampling_params": {"regex": "(yes|no)", "temperature": 0.0}}
    out = requests.post(server.base_url + "/generate", json=body, timeout=60).json()
    assert out["text"] in ("yes", "no")
    assert [maps_xgrammar(pid) for pid in pids].count(True) == 1
