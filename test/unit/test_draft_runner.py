"""The draft runner's facts are constructor arguments, not a published variant.

Built the way the scheduler builds it (SchedulerSpeculativeMixin._build_draft_worker)
beside a target on the demo pair: the draft gets the target's context length,
its own load format and attention backend, a KV pool as large as the target's,
and building it leaves every published bag as it was.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang.demo_models import demo_draft_path, demo_target_path
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.scheduler_parts.speculative import SchedulerSpeculativeMixin
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context, get_spec, publish, reset_context
from sglang.srt.server_args import ServerArgs


@pytest.fixture
def published():
    reset_context()
    sa = ServerArgs(
        model_path=str(demo_target_path()),
        device="cpu",
        max_total_tokens=2048,
        speculative_algorithm="STANDALONE",
        speculative_draft_load_format="dummy",
        speculative_draft_attention_backend="torch_native",
        context_length=256,
    ).resolve_once()
    publish(sa, role="scheduler")
    yield sa
    reset_context()


def test_draft_runner_gets_its_own_facts_and_the_bags_stay(published):
    before = dict(get_context().resolved_server_args_dict())
    target = TpModelWorker(ModelConfig.from_server_args())
    builder = SimpleNamespace(tp_worker=target)
    draft = SchedulerSpeculativeMixin._build_draft_worker(builder, get_spec(), target.model_config)
    t_runner, d_runner = target.model_runner, draft.model_runner
    assert d_runner.is_draft_worker and not t_runner.is_draft_worker
    assert d_runner.model_config.model_path == str(demo_draft_path())
    assert d_runner.context_len == t_runner.context_len == 256  # the target's, not the draft's 512
    assert d_runner.load_format == "dummy" and t_runner.load_format == "auto"
    # the draft flag reaches the draft only: a target runner resolves no draft backend
    assert d_runner.resolve_draft_attention_backend() == "torch_native"
    assert t_runner.resolve_draft_attention_backend() is None
    assert d_runner.attention_backend_name == "torch_native"
    assert d_runner.max_total_num_tokens == t_runner.max_total_num_tokens == 2048
    assert d_runner.token_to_kv_pool is not t_runner.token_to_kv_pool
    assert get_context().resolved_server_args_dict() == before  # no publish, no override
