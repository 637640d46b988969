"""The default KV pool size: bounded on CPU, the explicit flags win, GPU unchanged.

The rule (model_runner.cpu_default_pool_size) is tested as a pure function; the
runner's choice between it and the flags on a real ModelRunner over the demo model
(dummy weights, in process) with the available memory pinned.
"""

from __future__ import annotations

import logging

import pytest
import torch

from sglang.demo_models import demo_target_path
from sglang.srt.arg_groups.overrides import resolution_result
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor import model_runner as mr
from sglang.srt.model_executor.model_runner import (
    CPU_KV_BUDGET_BYTES,
    CPU_KV_CONTEXTS,
    ModelRunner,
    RunnerSettings,
    cpu_default_pool_size,
)
from sglang.srt.server_args import ServerArgs

GiB = 2**30
DEMO_BYTES_PER_TOKEN = 2 * 6 * 2 * 64 * 4  # K and V, 6 layers, 2 kv heads, head_dim 64, fp32
LLAMA8B_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 4  # 256 KiB/token in fp32
QWEN3_06B_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * 4


def test_tiny_model_gets_its_contexts_not_the_ram():
    size, rule = cpu_default_pool_size(DEMO_BYTES_PER_TOKEN, 21 * GiB, 512, CPU_KV_CONTEXTS)
    assert size == 512 * CPU_KV_CONTEXTS == 32768  # 0.19 GiB; the old 0.3 of RAM: 1.1M tokens
    assert "64 full contexts of 512 tokens" in rule
    assert "--max-total-tokens" in rule and "--mem-fraction-static" in rule


def test_large_kv_model_is_bounded_by_the_byte_budget():
    size, rule = cpu_default_pool_size(LLAMA8B_BYTES_PER_TOKEN, 200 * GiB, 8192, 64)
    assert size * LLAMA8B_BYTES_PER_TOKEN <= CPU_KV_BUDGET_BYTES == 4 * GiB
    assert size == 4 * GiB // LLAMA8B_BYTES_PER_TOKEN == 16384
    assert "4 GiB CPU KV budget" in rule


def test_at_least_one_full_context_when_ram_allows():
    size, rule = cpu_default_pool_size(QWEN3_06B_BYTES_PER_TOKEN, 64 * GiB, 40960, 64)
    assert size == 40960  # the 4 GiB budget would hold only 18,724 tokens
    assert "one full context" in rule


def test_never_more_than_the_old_ram_fraction():
    size, rule = cpu_default_pool_size(QWEN3_06B_BYTES_PER_TOKEN, 8 * GiB, 40960, 64)
    assert size == int(0.3 * 8 * GiB // QWEN3_06B_BYTES_PER_TOKEN)
    assert "0.3 of available RAM" in rule


def test_max_running_requests_sizes_the_contexts():
    size, rule = cpu_default_pool_size(DEMO_BYTES_PER_TOKEN, 21 * GiB, 512, 8)
    assert size == 8 * 512 and "8 full contexts" in rule


def test_one_context_floor_is_page_aligned():
    size, _ = cpu_default_pool_size(LLAMA8B_BYTES_PER_TOKEN, 200 * GiB, 20001, 1, page_size=16)
    assert size == 20016 and size % 16 == 0


def test_cpu_resolution_leaves_the_fraction_to_the_runner_cuda_keeps_085():
    cpu = ServerArgs(model_path="org/model", device="cpu").resolve_once()
    assert resolution_result(cpu, "mem_fraction_static") is None
    cuda = ServerArgs(model_path="org/model", device="cuda").resolve_once()
    assert resolution_result(cuda, "mem_fraction_static") == 0.85
    typed = ServerArgs(model_path="org/model", device="cpu", mem_fraction_static=0.3)
    assert resolution_result(typed.resolve_once(), "mem_fraction_static") == 0.3


# -- the runner ------------------------------------------------------------------------


@pytest.fixture
def runner_with(monkeypatch):
    monkeypatch.setattr(mr, "available_memory_bytes", lambda device: 20 * GiB)
    config = ModelConfig(str(demo_target_path()), dtype="float32")
    old_threads = torch.get_num_threads()

    def build(**fields) -> ModelRunner:
        settings = RunnerSettings(
            device="cpu", attention_backend="torch_native", load_format="dummy",
            num_threads=1, **fields,
        )  # fmt: skip
        return ModelRunner(config, settings=settings)

    yield build
    torch.set_num_threads(old_threads)


def test_runner_default_on_cpu_is_bounded_and_logged(runner_with, caplog):
    with caplog.at_level(logging.INFO, logger=mr.__name__):
        runner = runner_with()
    assert runner.max_total_num_tokens == 512 * CPU_KV_CONTEXTS
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV pool:")]
    assert len(lines) == 1
    assert "32768 tokens (0.19 GiB, 6144 bytes/token)" in lines[0]
    assert "CPU default, bound by 64 full contexts of 512 tokens" in lines[0]


def test_explicit_max_total_tokens_wins(runner_with):
    runner = runner_with(max_total_tokens=1_000_000, mem_fraction_static=0.1)
    assert runner.max_total_num_tokens == 1_000_000
    assert runner.kv_pool_rule == "set by --max-total-tokens"


def test_explicit_mem_fraction_keeps_the_old_sizing(runner_with):
    runner = runner_with(mem_fraction_static=0.3)
    assert runner.max_total_num_tokens == int(0.3 * 20 * GiB // DEMO_BYTES_PER_TOKEN)
    assert runner.kv_pool_rule.startswith("mem_fraction_static 0.3 of free cpu memory")


def test_pool_size_off_cpu_still_uses_the_fraction(runner_with, monkeypatch):
    runner = runner_with()
    monkeypatch.setattr(runner, "device", torch.device("cuda"))
    size, rule = runner._pool_size(DEMO_BYTES_PER_TOKEN)
    assert size == int(0.85 * 20 * GiB // DEMO_BYTES_PER_TOKEN)
    assert rule == "mem_fraction_static 0.85 of free cuda memory"


def test_max_running_requests_past_the_pool_is_capped_to_its_pages(runner_with, caplog):
    """Each running request holds a page: more rows than pages is memory for nothing
    (10^7 rows of the table asked the allocator for 164 GB and start-up failed)."""
    with caplog.at_level(logging.WARNING, logger=mr.__name__):
        runner = runner_with(max_total_tokens=2048, max_running_requests=10_000_000, page_size=4)
    assert runner.max_running_requests == 512
    assert any("--max-running-requests 10000000" in r.getMessage() for r in caplog.records)
    assert runner_with(max_total_tokens=2048, max_running_requests=100).max_running_requests == 100


def test_max_total_tokens_past_the_memory_is_refused_naming_it(runner_with):
    with pytest.raises(RuntimeError, match="--max-total-tokens 10000000000: a KV pool of"):
        runner_with(max_total_tokens=10_000_000_000)
