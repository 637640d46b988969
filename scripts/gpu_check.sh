#!/usr/bin/env bash
# The GPU checks of the CUDA path, in one run (< 8 minutes on one recent GPU):
#   1. test/gpu: triton / flashinfer attention vs torch_native (fp32, bf16), greedy
#      tokens with and without CUDA graphs, bf16 logprobs vs HF (test_gpu_engine.py)
#   2. the bf16 HF-parity test on its own line of the table
#   3. bench_one_batch on a Qwen3-0.6B-shaped model with dummy weights (batch 1, 32, 128;
#      input 512, output 128) next to HF transformers in the same process
# then prints one table. Exits 2 at once when torch sees no CUDA device.
#
#   scripts/gpu_check.sh            (from anywhere; PYTHON=... picks the interpreter;
#                                    GPU_CHECK_LOGS=DIR keeps each step's whole log there)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device (torch.cuda.is_available() is False in $PY);" \
        "run this on a machine with a GPU" >&2
    exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOGS="${GPU_CHECK_LOGS:-$WORK}"  # written as each step runs, so a killed run keeps them
mkdir -p "$LOGS"
unset TRITON_INTERPRET  # the kernels must compile for the GPU
declare -a ROWS=()

run_tests() {  # name, pytest args...: one PASS/FAIL row from pytest's summary line
    local name="$1" log="$LOGS/${1// /_}.log"
    shift
    local status=PASS
    timeout 330 "$PY" -m pytest "$@" -q -p no:cacheprovider >"$log" 2>&1 || status=FAIL
    ROWS+=("$(printf '%-28s %s  %s' "$name" "$status" "$(tail -n 1 "$log")")")
    [[ $status == PASS ]] || { echo "---- $name failed:"; tail -n 40 "$log"; }
}

"$PY" -c 'import torch; print("gpu_check on", torch.cuda.get_device_name(0), "| torch", torch.__version__)'
run_tests "gpu tests" test/gpu -k "not match_hf"
run_tests "hf parity bf16" test/gpu/test_gpu_engine.py -k "match_hf"

MODEL="$WORK/qwen3-0.6b-dummy"
"$PY" - "$MODEL" <<'PY'
"""A Qwen3-0.6B-shaped checkpoint dir: its config.json and the tiny test tokenizer (no weights:
the bench loads --load-format dummy)."""
import json, pathlib, sys

from sglang.test.corpus import save_tokenizer_files
from sglang.test.make_tiny_model import cached_tokenizer

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True)
config = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu",
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True, "attention_bias": False, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645,
}
(out / "config.json").write_text(json.dumps(config, indent=1))
save_tokenizer_files(cached_tokenizer(), out, model_max_length=40960)
PY

BENCH_STATUS=PASS
timeout 300 "$PY" - "$MODEL" "$WORK/bench.json" >"$LOGS/bench.log" 2>&1 <<'PY' || BENCH_STATUS=FAIL
import json, sys

from sglang.bench_one_batch import main

rows = main(["--model-path", sys.argv[1], "--load-format", "dummy", "--dtype", "bfloat16",
             "--batch-size", "1", "32", "128", "--input-len", "512", "--output-len", "128",
             "--mem-fraction-static", "0.5"])
out = [{"bs": r["bs"], **{f"{name}_{k}": getattr(r[name], k) for name in ("ours", "hf")
        for k in ("prefill_s", "decode_s")}} for r in rows]
json.dump(out, open(sys.argv[2], "w"))
PY
ROWS+=("$(printf '%-28s %s' "bench_one_batch (dummy)" "$BENCH_STATUS")")
[[ $BENCH_STATUS == PASS ]] || { echo "---- bench failed:"; tail -n 40 "$LOGS/bench.log"; }
BACKEND="$(grep -o "with [a-z_]* attention" "$LOGS/bench.log" | head -n 1 || true)"

echo
echo "================ gpu_check ================"
printf '%s\n' "${ROWS[@]}"
if [[ -s "$WORK/bench.json" ]]; then
    echo "Qwen3-0.6B shape, bf16, dummy weights, input 512, output 128 (graphs: ${BACKEND:-see log})"
    "$PY" - "$WORK/bench.json" <<'PY'
import json, sys

print(f"{'bs':>4} | {'ours prefill ms':>15} {'hf prefill ms':>14} | {'ours decode ms':>14} "
      f"{'hf decode ms':>12} {'ours tok/s':>10} | {'hf/ours decode':>14}")
for r in json.load(open(sys.argv[1])):
    print(f"{r['bs']:>4} | {r['ours_prefill_s'] * 1e3:15.1f} {r['hf_prefill_s'] * 1e3:14.1f} | "
          f"{r['ours_decode_s'] * 1e3:14.2f} {r['hf_decode_s'] * 1e3:12.2f} "
          f"{r['bs'] / r['ours_decode_s']:10.0f} | {r['hf_decode_s'] / r['ours_decode_s']:13.2f}x")
PY
fi
for row in "${ROWS[@]}"; do
    [[ $row == *" FAIL"* ]] && exit 1
done
exit 0
