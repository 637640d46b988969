"""An Engine used from several threads: shutdown while others wait in a call (each gets
an error, none hangs); Engines started from two threads at once."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from types import SimpleNamespace

import pytest

from sglang.srt.entrypoints.engine import Engine, _main_module_hidden
from sglang.srt.managers.request_errors import ServerUnavailableError


def _engine_shell() -> Engine:
    """An Engine's loop and call plumbing, without children or a tokenizer manager."""
    engine = Engine.__new__(Engine)
    engine._closed = False
    engine._submit_lock = threading.Lock()
    engine._inflight = set()
    engine._loop = asyncio.new_event_loop()
    engine._thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    engine._thread.start()

    async def aclose() -> None:
        return None

    engine._children = SimpleNamespace(shutdown=lambda: None)
    engine.tokenizer_manager = SimpleNamespace(on_child_death=lambda message: None, aclose=aclose)
    return engine


def test_a_call_the_stopped_loop_never_finishes_fails_at_shutdown():
    # a prompt tokenized off the loop when shutdown came: its call waited for ever
    engine = _engine_shell()
    started, outcome = threading.Event(), []

    async def unfinished() -> None:
        started.set()
        await asyncio.Event().wait()  # what the stopped loop never finishes

    def call() -> None:
        try:
            engine._run(unfinished())
        except Exception as exc:  # noqa: BLE001 - the outcome is the assertion
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert started.wait(10)
    engine.shutdown()
    caller.join(10)
    assert not caller.is_alive(), "the caller still waits after shutdown"
    assert len(outcome) == 1 and isinstance(outcome[0], ServerUnavailableError)
    with pytest.raises(RuntimeError, match="shut down"):
        engine._run(unfinished())


def test_an_async_call_the_stopped_loop_never_finishes_fails_at_shutdown():
    engine = _engine_shell()
    started = threading.Event()

    async def unfinished() -> None:
        started.set()
        await asyncio.Event().wait()

    async def caller() -> None:
        waiting = asyncio.ensure_future(engine._arun(unfinished()))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        with pytest.raises(ServerUnavailableError):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(caller())


def test_spawns_from_two_threads_both_hide_the_callers_script(monkeypatch):
    # the second thread read __main__ while the first had it hidden: its child re-ran the
    # caller's script (no __main__ guard), and __main__.__spec__ stayed None after
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = "/app/script.py", "the script's spec"
    monkeypatch.setitem(sys.modules, "__main__", main)
    first_inside, first_may_leave, seen = threading.Event(), threading.Event(), {}

    def first() -> None:
        with _main_module_hidden():
            first_inside.set()
            first_may_leave.wait(10)

    def second() -> None:
        with _main_module_hidden():
            seen.update(file=getattr(main, "__file__", None), spec=main.__spec__)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_inside.wait(10)
    threads[1].start()
    first_may_leave.set()
    for thread in threads:
        thread.join(10)
    assert seen == {"file": None, "spec": None}  # hidden for the second spawn too
    assert (main.__file__, main.__spec__) == ("/app/script.py", "the script's spec")


def test_engine_request_lines_show_without_the_applications_logging(monkeypatch):
    # Engine(log_requests=True) in a script with no logging set up logged nothing: the
    # request lines come from the caller's process, where INFO had no handler
    import logging

    from sglang.srt.entrypoints.engine import _show_request_lines_here

    sglang_logger = logging.getLogger("sglang")
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(sglang_logger, "handlers", [])
    monkeypatch.setattr(sglang_logger, "level", logging.NOTSET)
    _show_request_lines_here(SimpleNamespace(log_requests=False, log_level="info"))
    assert not sglang_logger.handlers  # not asked for: the application's logging alone
    _show_request_lines_here(SimpleNamespace(log_requests=True, log_level="info"))
    assert len(sglang_logger.handlers) == 1 and sglang_logger.level == logging.INFO
    _show_request_lines_here(SimpleNamespace(log_requests=True, log_level="info"))
    assert len(sglang_logger.handlers) == 1  # once
