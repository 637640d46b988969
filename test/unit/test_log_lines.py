"""What the server writes to its logs: probes quiet, ranks told apart, outcomes named."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sglang.srt.constrained.grammar_manager import GrammarManager
from sglang.srt.entrypoints.http_server import _QuietProbes
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.scheduler_entry import scheduler_role
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager


def _access_record(path: str) -> logging.LogRecord:
    # uvicorn's access line: '%s - "%s %s HTTP/%s" %d'
    args = ("127.0.0.1:5000", "GET", path, "1.1", 200)
    return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                             args, None)  # fmt: skip


@pytest.mark.parametrize(
    "path, kept",
    [("/health", False), ("/health/", False), ("/health_generate", False),
     ("/metrics?x=1", False), ("/v1/completions", True), ("/generate", True)],
)  # fmt: skip
def test_log_requests_keeps_probes_out_of_the_access_log(path, kept):
    # a load balancer's /health every 0.1 s wrote 10 access lines a second
    assert _QuietProbes().filter(_access_record(path)) is kept


def test_the_servers_own_health_probe_is_no_request_line(caplog):
    tm = TokenizerManager.__new__(TokenizerManager)
    probe = ReqState(obj=GenerateReqInput(text="The capital of France is",
                                          rid="HEALTH_CHECK_ab12"), prompt_tokens=5)  # fmt: skip
    real = ReqState(obj=GenerateReqInput(text="hi", rid="r1"), prompt_tokens=1)
    with caplog.at_level(logging.INFO, logger="sglang"):
        tm._log_finished(probe)
        tm._log_finished(real)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["request r1"]


def test_each_scheduler_rank_names_itself():
    # --dp-size 2: both ranks logged under one "scheduler" prefix
    assert scheduler_role(1, 1, 0, 0) == "scheduler"
    assert scheduler_role(2, 1, 1, 0) == "scheduler (dp rank 1)"
    assert scheduler_role(2, 2, 1, 1) == "scheduler (dp rank 1, tp rank 1)"


def test_a_failed_compile_is_not_logged_as_compiled(caplog):
    class Refusing:
        def compile(self, key):
            raise ValueError("Unclosed '['")

    manager = GrammarManager(lambda: Refusing(), timeout_s=5)
    with caplog.at_level(logging.DEBUG, logger="sglang.srt.constrained.grammar_manager"):
        with pytest.raises(ValueError):
            manager._compile(SimpleNamespace(kind="regex"))
    lines = [r.getMessage().split(" in ")[0] for r in caplog.records if "constraint" in r.getMessage()]
    assert lines == ["failed to compile a regex constraint"]
