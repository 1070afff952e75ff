#!/usr/bin/env bash
# Qwen3.5 against transformers' own torch code, in one run on this machine, the same threads:
# the Gated DeltaNet's chunked rule (forward and backward, 4096 tokens, Qwen3.5-0.8B's 16 linear
# heads of 128) and greedy decode tokens/s of one random-weight checkpoint (0.8B widths, 8 layers).
#   bench/qwen3_5_vs_hf.sh [BUILD_DIR] [VENV]        (default build, .venv; HP_BENCH_THREADS, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build} VENV=${2:-.venv}
T=${HP_BENCH_THREADS:-2}
DIR=${HP_BENCH_MODEL:-/tmp/hp_bench_qwen3_5}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
[ -f "$DIR/config.json" ] || HF_HUB_OFFLINE=1 "$VENV/bin/python" bench/qwen3_5_hf.py make "$DIR"
echo "== the chunked gated delta rule, forward + backward"
OMP_NUM_THREADS=$T "$BUILD/bench/qwen3_5_bench" rule | tee -a "$OUT"
OMP_NUM_THREADS=$T HF_HUB_OFFLINE=1 "$VENV/bin/python" bench/qwen3_5_hf.py rule 2>/dev/null | tee -a "$OUT"
echo "== greedy decode"
OMP_NUM_THREADS=$T "$BUILD/bench/qwen3_5_bench" decode "$DIR" | tee -a "$OUT"
OMP_NUM_THREADS=$T HF_HUB_OFFLINE=1 "$VENV/bin/python" bench/qwen3_5_hf.py decode "$DIR" 2>/dev/null | tee -a "$OUT"
"$VENV/bin/python" - "$OUT" <<'PY'
import json, sys
rows = {(r["name"], r["impl"]): r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))}
rule = rows[("gdn_chunk_rule", "transformers")]["forward_backward_ms"] / rows[("gdn_chunk_rule", "ours")]["forward_backward_ms"]
dec = rows[("qwen3_5_decode", "ours")]["decode_tokens_per_s"] / rows[("qwen3_5_decode", "transformers")]["decode_tokens_per_s"]
print(f"chunked rule, forward + backward: transformers' time / ours = {rule:.2f}")
print(f"decode tokens/s: ours / transformers' = {dec:.2f}")
PY
