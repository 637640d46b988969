"""bench_one_batch runs end to end (ours and HF) and prints latency and the ratio."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_one_batch_prints_figures_and_ratio(tiny_llama_dir):
    cmd = [
        sys.executable,
        "-m",
        "sglang.bench_one_batch",
        "--model-path",
        str(tiny_llama_dir),
        "--batch-size",
        "1",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "3",
        "--num-threads",
        "1",
        "--max-total-tokens",
        "256",
        "--device",
        "cpu",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    output = proc.stdout + proc.stderr
    assert output.count("ratio hf/ours") == 2
    assert "decode" in output and "prefill" in output
