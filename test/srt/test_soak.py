"""A soak of one live server (issue 9): about a minute of the mixed, hostile workload
of `sglang.test.soak` at concurrency 64 against a server with a small queue and KV pool.

Every request is answered with a status its kind allows (2xx, 400, 429; never a
5xx nor an unasked-for abort), the server settles idle with its KV pool and
request slots whole, /health says 200, and no server process grew its RSS by more
than 10% between the end of the warm-up and the end of the run.

The server runs with glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_): by
default glibc raises the threshold each time a large block is freed, so the large
transient tensors of the biggest batches end up in the heap, which keeps their
pages; the scheduler's idle RSS then climbs in steps for the first ~100 s of this
load (457 -> 489 MiB, +7%, measured) before it levels off, which no warm-up that
fits in a CI minute reaches. Pinned, the same load holds it within 1% (404 -> 408
MiB over 150 s), so the 10% bound detects leaks, not the allocator's high-water mark.
"""

from __future__ import annotations

import pytest
from http_server_fixture import start_server

from sglang.test.soak import KINDS, SoakConfig, run_soak

pytestmark = pytest.mark.slow

MAX_QUEUED = 16  # small: the bursts and the 64 workers overflow it (with the running
MAX_RUNNING = 32  # slots: the queue counts the requests beyond the free ones)
MAX_TOTAL_TOKENS = 8192  # small: the warm-up touches the whole KV pool and the radix cache fills
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("soak-server")
    srv = start_server(tiny_llama_dir, workdir / "server.log",
                       "--max-queued-requests", str(MAX_QUEUED),
                       "--max-running-requests", str(MAX_RUNNING),
                       "--max-total-tokens", str(MAX_TOTAL_TOKENS), env=MALLOC_ENV)  # fmt: skip
    yield srv
    srv.stop()


def test_soak(server):
    config = SoakConfig(base_url=server.base_url, server_pid=server.proc.pid, warmup_s=20.0,
                        warmup_bursts=2, duration_s=35.0, concurrency=64, burst_size=300,
                        tolerated_resets=2)  # fmt: skip
    # tolerated_resets: client-side connection resets (ReadError) with no server-side RST
    # (tcpdump) and no server log line: 2 in ~55,000 requests earlier (issue 9 note),
    # then 2 in one 5,190-request CI run (fourteenth session, 1 of 4 runs;
    # benchmark/RESULTS.md). Not explained yet; a systematic transport fault (more
    # resets, or any other error) still fails here.
    result = run_soak(config)
    print(result.table())
    assert result.ok, result.table()
    assert set(result.requests) == set(KINDS)  # every kind ran
    # the queue did fill (and its overflow got 429s while the rest were served): from the
    # bursts mostly, but on a fast machine a burst can drain as it arrives (0 of 900
    # burst requests refused in one CI run, 20 of the other kinds'), so any kind counts
    refused = sum(n for (_, status), n in result.kind_status.items() if status == "429")
    assert refused > 0
    assert result.aborted_by_client > 0  # the aborts did land on running requests
    assert result.final_state["max_total_num_tokens"] == MAX_TOTAL_TOKENS
    roles = {name.split("[")[0] for name in result.rss_start}
    assert roles >= {"launcher", "scheduler"}  # the CPU default detokenizes in the launcher
    assert "detokenizer" not in roles
