"""Process lifecycle: child death, startup failure, role namespaces, two Engines at once."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
import warnings

import psutil
import pytest

pytestmark = pytest.mark.slow

LIGHT = dict(num_threads=1, log_level="warning", max_total_tokens=2048, max_running_requests=8)
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 4}


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_killing_the_scheduler_fails_pending_requests(tiny_llama_dir):
    import sglang as sgl

    llm = sgl.Engine(model_path=str(tiny_llama_dir), **LIGHT)
    pids = llm.child_pids()
    errors: list[BaseException] = []

    def run():
        try:
            llm.generate("x" * 10, {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 1500})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    os.kill(pids["scheduler"], signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout=15)
    assert not thread.is_alive(), "pending generate did not fail"
    assert time.monotonic() - killed_at < 10
    assert errors and isinstance(errors[0], RuntimeError)
    assert "scheduler" in str(errors[0])
    with pytest.raises(RuntimeError):
        llm.generate("y", GREEDY)
    t0 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t0 < 15
    assert _alive(list(pids.values())) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="shut down"):
            llm.generate("y", GREEDY)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]  # a clean refusal


def test_startup_failure_surfaces_child_message(tiny_llama_dir, tmp_path):
    import shutil

    import sglang as sgl
    from sglang.srt.entrypoints.engine import ChildStartupError

    bad = tmp_path / "bad-ckpt"
    shutil.copytree(tiny_llama_dir, bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ChildStartupError) as info:
        sgl.Engine(model_path=str(bad), **LIGHT)
    assert "scheduler" in str(info.value) and "Traceback" in str(info.value)
    time.sleep(0.5)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    leftover = [
        p
        for p in _alive(list(after - before))
        if "resource_tracker" not in " ".join(psutil.Process(p).cmdline())
    ]
    assert leftover == []


@pytest.mark.parametrize("mode", ["enforce", "record"])
def test_role_namespaces(tiny_llama_dir, tmp_path, mode):
    import sglang as sgl

    out_file = tmp_path / "roles.txt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_ROLE_NAMESPACES", mode)
        mp.setenv("SGLANG_ROLE_NAMESPACES_OUT", str(out_file))
        # every role, the detokenizer process's too (CPU detokenizes inline by default)
        with sgl.Engine(model_path=str(tiny_llama_dir), detokenizer_mode="process", **LIGHT) as llm:
            out = llm.generate("def f():", GREEDY)
            assert len(out["output_ids"]) == 4
    if mode == "record":
        roles = {line.split()[0] for line in out_file.read_text().splitlines() if line.strip()}
        assert {"scheduler", "detokenizer", "tokenizer"} <= roles


def test_two_engines_in_one_process(tiny_llama_dir, tiny_qwen2_dir):
    import sglang as sgl

    with (
        sgl.Engine(model_path=str(tiny_llama_dir), **LIGHT) as a,
        sgl.Engine(model_path=str(tiny_qwen2_dir), **LIGHT) as b,
    ):
        ids = [[100, 200, 300, 400]]
        out_a = a.generate(input_ids=ids, sampling_params=GREEDY)[0]["output_ids"]
        out_b = b.generate(input_ids=ids, sampling_params=GREEDY)[0]["output_ids"]
        assert a.get_server_info()["model_path"] == str(tiny_llama_dir)
        assert b.get_server_info()["model_path"] == str(tiny_qwen2_dir)
        assert a.generate(input_ids=ids, sampling_params=GREEDY)[0]["output_ids"] == out_a
        assert b.generate(input_ids=ids, sampling_params=GREEDY)[0]["output_ids"] == out_b
        assert out_a != out_b
        # log_level holds in this process too, for sglang's loggers (LIGHT: warning)
        assert logging.getLogger("sglang").getEffectiveLevel() == logging.WARNING
    # shut down, the children are reaped by multiprocessing itself: none is left in its
    # table, where its exit handler would later SIGTERM the pid (reused by then)
    children = {p.pid for p in multiprocessing.active_children()}
    assert not children & {*a.child_pids().values(), *b.child_pids().values()}


def _environ_of(pid: int) -> dict[str, str]:
    """The environment process `pid` started with (Linux)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_cpu_scheduler_starts_with_a_short_openmp_spin(tiny_llama_dir, monkeypatch):
    """libgomp reads its spin count at load: the scheduler must start with it, and the
    caller's environment must come back as it was."""
    import sglang as sgl

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with sgl.Engine(model_path=str(tiny_llama_dir), device="cpu", **LIGHT) as llm:
        scheduler_env = _environ_of(llm.child_pids()["scheduler"])
        assert scheduler_env.get("GOMP_SPINCOUNT") == "30000"
        assert "GOMP_SPINCOUNT" not in os.environ
        out = llm.generate(input_ids=[[1, 2, 3]], sampling_params=GREEDY)[0]
        assert len(out["output_ids"]) == 4
