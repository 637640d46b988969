"""The benchmark CLIs refuse counts, lengths and flags they cannot run with: argparse's
exit 2 and a one-line error naming the flag (and the script), before any model loads."""

from __future__ import annotations

import json

import pytest

from sglang import bench_offline_throughput, bench_one_batch, bench_serving
from sglang.srt.server_args import resolution_result


def _refused(parse, argv: list[str], capsys) -> str:
    """The last stderr line of `parse(argv)`, which must exit 2."""
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


# --- bench_serving ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value",
    [("--random-range-ratio", "2"), ("--random-range-ratio", "-0.5"),
     ("--random-range-ratio", "nan"), ("--random-input-len", "0"),
     ("--random-output-len", "0"), ("--max-concurrency", "-1"), ("--max-concurrency", "0"),
     ("--num-prompts", "0")],
)  # fmt: skip
def test_bench_serving_refuses_out_of_range_values(flag, value, capsys):
    err = _refused(bench_serving.parse_args, [flag, value], capsys)
    assert err.startswith("python -m sglang.bench_serving: error: ")
    assert f"argument {flag}: '{value}'" in err


def test_bench_serving_keeps_its_bounds_and_unset_concurrency():
    args = bench_serving.parse_args(["--random-range-ratio", "0", "--random-input-len", "1"])
    assert (args.random_range_ratio, args.random_input_len) == (0.0, 1)
    assert args.max_concurrency is None  # unset: no limit
    assert bench_serving.parse_args(["--max-concurrency", "1"]).max_concurrency == 1


def test_bench_serving_lengths_stay_within_the_asked_range():
    argv = ["--num-prompts", "50", "--random-input-len", "20", "--random-output-len", "10",
            "--random-range-ratio", "0.5"]  # fmt: skip
    requests = bench_serving.random_requests(bench_serving.parse_args(argv), None)
    assert all(10 <= r.prompt_len <= 20 and 5 <= r.output_len <= 10 for r in requests)


# --- bench_one_batch -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, values",
    [("--batch-size", ["0"]), ("--batch-size", ["1", "-2"]), ("--input-len", ["0"]),
     ("--output-len", ["0"])],
)  # fmt: skip
def test_bench_one_batch_refuses_counts_below_one(flag, values, capsys):
    err = _refused(bench_one_batch.parse_args, [flag, *values], capsys)
    assert err.startswith("python -m sglang.bench_one_batch: error: ")
    assert f"argument {flag}: '{values[-1]}'" in err


def test_bench_one_batch_names_itself_for_an_unknown_flag(capsys):
    bench, server_argv = bench_one_batch.parse_args(["--bach-size", "4", "--input-len", "8"])
    assert bench.input_len == [8]
    err = _refused(bench_one_batch.main, ["--bach-size", "4", "--input-len", "8"], capsys)
    assert err == "python -m sglang.bench_one_batch: error: unrecognized arguments: --bach-size 4"


class _FakeRunner:
    def prefill(self) -> float:
        return 0.5

    def decode(self) -> float:
        return 0.25

    def close(self) -> None:
        pass


def test_bench_one_batch_output_len_one_reports_no_decode():
    ours, hf = bench_one_batch.measure([_FakeRunner(), _FakeRunner()], output_len=1)
    assert ours.decode_s is None
    line = ours.line("ours", 2, 8)
    assert "decode n/a" in line and "nan" not in line and "32 tok/s" in line
    assert bench_one_batch.ratio_line(ours, hf).endswith("prefill 1.00x, decode n/a")
    ours, hf = bench_one_batch.measure([_FakeRunner(), _FakeRunner()], output_len=2)
    assert "ms/step        8 tok/s" in ours.line("ours", 2, 8)
    assert bench_one_batch.ratio_line(ours, hf).endswith("decode 1.00x")


# --- bench_offline_throughput ------------------------------------------------------------------


def _offline(argv: list[str]):
    parser = bench_offline_throughput.build_bench_parser()
    return bench_offline_throughput.checked_server_args(parser, parser.parse_args(argv))


@pytest.fixture
def model_dir(tmp_path):
    """A checkpoint directory whose config.json gives a context of 64 tokens."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
              "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "max_position_embeddings": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "flag, value",
    [("--num-prompts", "0"), ("--num-prompts", "-1"), ("--random-input-len", "0"),
     ("--random-output-len", "0"), ("--warmup-prompts", "-1")],
)  # fmt: skip
def test_offline_throughput_refuses_counts_before_any_engine(flag, value, capsys):
    err = _refused(_offline, [flag, value], capsys)
    assert err == f"python -m sglang.bench_offline_throughput: error: {flag} {value}: must be " + (
        ">= 0" if flag == "--warmup-prompts" else ">= 1"
    )


def test_offline_throughput_refuses_lengths_past_the_context(model_dir, capsys):
    base = ["--model-path", model_dir, "--device", "cpu"]
    server_args = _offline([*base, "--random-input-len", "60", "--random-output-len", "4"])
    assert resolution_result(server_args, "context_length") == 64  # fits exactly
    err = _refused(_offline, [*base, "--random-input-len", "60", "--random-output-len", "5"],
                   capsys)  # fmt: skip
    assert "--random-input-len 60 + --random-output-len 5 is longer than the model's " \
           "context length (64)" in err  # fmt: skip
    err = _refused(_offline, [*base, "--context-length", "32", "--random-input-len", "30",
                              "--random-output-len", "4"], capsys)  # fmt: skip
    assert "context length (32)" in err
