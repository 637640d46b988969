"""Schedulers as Ray actors (issue #11): RayEngine on a caller's placement group and on
its own, actor death, startup failure, and `launch_server --use-ray`.

One local Ray cluster for the module (4 CPUs, no dashboard); the HTTP server joins it
through RAY_ADDRESS, so only one cluster starts.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from http_server_fixture import start_server

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

LIGHT = {"num_threads": 1, "log_level": "warning", "max_total_tokens": 4096}
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14], [100, 200, 300, 400], [7], [42, 43, 44]]
ANSWER_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def ray_address():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_llama_dir) -> list[list[int]]:
    import sglang as sgl

    with sgl.Engine(model_path=str(tiny_llama_dir), **LIGHT) as llm:
        return [o["output_ids"] for o in llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


def scheduler_actors() -> list[str]:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [n for n in names if n.startswith("sglang-scheduler-")]


def created_groups() -> list[str]:
    table = ray.util.placement_group_table()
    return [pg_id for pg_id, row in table.items() if row["state"] == "CREATED"]


def group_state(group) -> str:
    return ray.util.placement_group_table(group)["state"]


def seen_busy(clock, within_s: float) -> bool:
    """The actor's forward clock, read in this process, showed a forward running."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if clock.busy_for_s() is not None:
            return True
        time.sleep(0.001)
    return False


def wait_all_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_dp2_on_callers_group_equals_engine_and_leaves_the_group(
    ray_address, tiny_llama_dir, reference
):
    from ray.util.placement_group import placement_group, remove_placement_group

    import sglang as sgl

    group = placement_group([{"CPU": 1}] * 2)
    ray.get(group.ready(), timeout=60)
    try:
        llm = sgl.RayEngine(
            model_path=str(tiny_llama_dir), dp_size=2, placement_group=group, **LIGHT
        )
        with llm:
            outs = llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            assert [o["output_ids"] for o in outs] == reference
            states = llm.get_server_info()["internal_states"]
            assert [s["dp_rank"] for s in states] == [0, 1]
            pids = llm.child_pids()
            assert {s["pid"] for s in states} == {
                pids["scheduler (dp rank 0)"],
                pids["scheduler (dp rank 1)"],
            }
            assert len(scheduler_actors()) == 2
        assert scheduler_actors() == []
        assert wait_all_gone(list(pids.values())) == []
        assert group_state(group) == "CREATED"  # the caller's group stays
    finally:
        remove_placement_group(group)


def test_tp2_on_its_own_group_then_a_dead_rank_fails_pending_requests(
    ray_address, tiny_llama_dir, reference
):
    import sglang as sgl

    llm = sgl.RayEngine(model_path=str(tiny_llama_dir), tp_size=2, **LIGHT)
    group = llm._placement_group
    assert group_state(group) == "CREATED" and len(group.bundle_specs) == 2
    outs = llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    errors: list[BaseException] = []

    def run() -> None:
        try:
            llm.generate("x" * 10, {**GREEDY, "max_new_tokens": 3000})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert seen_busy(llm.tokenizer_manager.forward_clock, within_s=5.0)  # the shared clock
    pids = llm.child_pids()
    psutil.Process(pids["scheduler (tp rank 1)"]).kill()
    killed_at = time.monotonic()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the pending generate did not fail"
    assert time.monotonic() - killed_at < ANSWER_WITHIN_S
    assert errors and isinstance(errors[0], RuntimeError) and "scheduler" in str(errors[0])
    with pytest.raises(RuntimeError):
        llm.generate("y", GREEDY)
    llm.shutdown()
    assert group_state(group) == "REMOVED"
    assert scheduler_actors() == []
    assert wait_all_gone(list(pids.values())) == []


def test_a_frozen_actor_is_killed_past_the_watchdog_and_requests_fail(
    ray_address, tiny_llama_dir
):
    """A SIGSTOPped scheduler actor cannot run its own watchdog: the launcher's kills it
    past --watchdog-timeout (it watched spawned schedulers only; the request hung)."""
    import sglang as sgl
    from sglang.srt.entrypoints.engine import hang_limit_s
    from sglang.srt.managers.request_errors import ServerUnavailableError

    llm = sgl.RayEngine(model_path=str(tiny_llama_dir), watchdog_timeout=1, **LIGHT)
    pids = llm.child_pids()
    clock = llm.tokenizer_manager.forward_clock
    deadline = time.monotonic() + 30
    while clock.silent_for_s() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # a scheduler is judged from its first step on (not while loading)
    try:
        psutil.Process(pids["scheduler"]).suspend()
        with pytest.raises(ServerUnavailableError, match="had not stepped"):
            with ThreadPoolExecutor(1) as pool:
                pool.submit(llm.generate, "x", GREEDY).result(timeout=hang_limit_s(1.0) + 20)
    finally:
        llm.shutdown()
    assert scheduler_actors() == []
    assert wait_all_gone(list(pids.values())) == []


def test_a_group_the_cluster_never_grants_is_named_in_the_error(
    ray_address, tiny_llama_dir, monkeypatch
):
    from ray.util.placement_group import placement_group, remove_placement_group

    import sglang as sgl
    from sglang.srt.entrypoints import ray_engine

    monkeypatch.setattr(ray_engine, "PLACEMENT_TIMEOUT_S", 1.0)
    group = placement_group([{"CPU": 1000}])  # more than the cluster's 4
    try:
        with pytest.raises(RuntimeError, match="did not grant the placement group"):
            sgl.RayEngine(model_path=str(tiny_llama_dir), placement_group=group, **LIGHT)
        assert scheduler_actors() == []
    finally:
        remove_placement_group(group)


def test_startup_failure_surfaces_the_traceback_and_leaves_nothing(
    ray_address, tiny_llama_dir, tmp_path
):
    import shutil

    import sglang as sgl
    from sglang.srt.entrypoints.engine import ChildStartupError

    bad = tmp_path / "bad-ckpt"
    shutil.copytree(tiny_llama_dir, bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ChildStartupError) as info:
        sgl.RayEngine(model_path=str(bad), **LIGHT)
    assert "scheduler" in str(info.value) and "Traceback" in str(info.value)
    assert scheduler_actors() == [] and created_groups() == []


def test_use_ray_http_server_answers_generate_and_stops_clean(
    ray_address, tiny_llama_dir, tmp_path
):
    env = {"RAY_ADDRESS": ray_address}
    srv = start_server(tiny_llama_dir, tmp_path / "server.log", "--use-ray", env=env)
    try:
        body = {"input_ids": PROMPTS[0], "sampling_params": GREEDY}
        r = requests.post(srv.base_url + "/generate", json=body, timeout=60)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 8, r.text
        assert len(scheduler_actors()) == 1
    finally:
        code = srv.stop(signal.SIGTERM)
    assert code == 0, srv.log()[-3000:]
    assert scheduler_actors() == [] and created_groups() == []


def test_use_ray_without_ray_exits_2_naming_the_extra(tiny_llama_dir):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from sglang.launch_server import main\n"
        f"main(['--model-path', {str(tiny_llama_dir)!r}, '--use-ray'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert 'pip install -e ".[ray]"' in proc.stderr


@pytest.mark.parametrize("node_rank", ["0", "1"])
def test_use_ray_across_nodes_is_refused_on_every_node(tiny_llama_dir, node_rank):
    # node 1 took a placement group and then ran a plain worker, ignoring --use-ray
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_llama_dir),
           "--use-ray", "--tp-size", "2", "--nnodes", "2", "--node-rank", node_rank,
           "--dist-init-addr", "127.0.0.1:29999"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "nnodes > 1" in proc.stderr and "use nnodes 1" in proc.stderr


def test_use_ray_dead_actor_answers_503_and_the_server_exits_1(
    ray_address, tiny_llama_dir, tmp_path
):
    srv = start_server(
        tiny_llama_dir, tmp_path / "server.log", "--use-ray", env={"RAY_ADDRESS": ray_address}
    )
    try:
        states = requests.get(srv.base_url + "/server_info", timeout=30).json()["internal_states"]
        body = {"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, "max_new_tokens": 3000}}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(requests.post, srv.base_url + "/generate", json=body, timeout=120)
            time.sleep(1.5)  # decoding
            killed_at = time.monotonic()
            psutil.Process(states[0]["pid"]).kill()
            status = pending.result(timeout=30).status_code
            answered_s = time.monotonic() - killed_at
        assert status == 503 and answered_s < ANSWER_WITHIN_S, (status, answered_s)
        assert srv.proc.wait(timeout=30) == 1
        assert "exited unexpectedly" in srv.log()
    finally:
        srv.stop(signal.SIGKILL)
    assert scheduler_actors() == [] and created_groups() == []
