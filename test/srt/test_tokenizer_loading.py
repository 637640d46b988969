"""The scheduler loads its tokenizer in a forked child (issue #13, memory).

AutoTokenizer picks the tokenizer class through transformers' config machinery,
which imports torch.distributed.tensor and sympy (~55 MiB of RSS for the life of
the scheduler). `load_tokenizer_in_child` runs it in a fork and unpickles the
result: the same tokenizer, the same errors, without those modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang.srt.managers.tokenizer_manager import load_tokenizer, load_tokenizer_in_child
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import prepare_server_args

CHILD_SCRIPT = """
import json, sys
import torch
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import prepare_server_args
from sglang.srt.managers.tokenizer_manager import load_tokenizer_in_child
publish(prepare_server_args(["--model-path", sys.argv[1]]), role="scheduler")
tokenizer = load_tokenizer_in_child()
print(json.dumps({
    "ids": tokenizer.encode("The quick brown fox"),
    "class": type(tokenizer).__name__,
    "heavy": [m for m in ("sympy", "torch.distributed.tensor") if m in sys.modules],
}))
"""


def test_forked_load_gives_the_same_tokenizer_without_config_modules(tiny_llama_dir):
    out = subprocess.run(
        [sys.executable, "-c", CHILD_SCRIPT, str(tiny_llama_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    forked = json.loads(out.stdout.strip().splitlines()[-1])
    publish(prepare_server_args(["--model-path", str(tiny_llama_dir)]), role="scheduler")
    direct = load_tokenizer()
    assert forked["ids"] == direct.encode("The quick brown fox")
    assert forked["class"] == type(direct).__name__
    assert forked["heavy"] == []


def test_forked_load_raises_the_loading_error(tiny_llama_dir, tmp_path):
    args = ["--model-path", str(tiny_llama_dir), "--tokenizer-path", str(tmp_path)]
    publish(prepare_server_args(args), role="scheduler")
    with pytest.raises(Exception) as direct:
        load_tokenizer()
    with pytest.raises(type(direct.value)):
        load_tokenizer_in_child()
