#!/usr/bin/env bash
# Every program ends bad input with one line "error: <message>" per rank and exit status 1: no
# abort, no C++ stack dump (unless TORCH_SHOW_CPP_STACKTRACES=1), and only valid UTF-8 in what it
# prints, even when the message quotes bytes of a corrupt file.
#   programs_fail_cleanly.sh HPRUN HP_GENERATE HP_PLAN HF_REF WORKDIR QWEN3_TRAIN HP_TOKENIZE
# A bad flag is refused before any work with exit status 2, a line naming the flag and what it
# accepts, and the usage; --help prints the usage and exits 0.
set -u
hprun=$1 generate=$2 plan=$3 ref=$4 work=$5 train=$6 tokenize=$7
rm -rf "$work" && mkdir -p "$work"
failed=0

# case NAME EXPECTED-SUBSTRING COMMAND...
case_() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  local why=""
  [ "$rc" -eq 1 ] || why="exit status $rc, not 1"
  grep -q "error: .*$want" <<<"$out" || why="$why; no 'error: ...$want' line"
  if grep -qE "terminate called|Exception raised from|Aborted|core dumped|frame #" <<<"$out"; then why="$why; an abort or a stack trace"; fi
  if ! iconv -f UTF-8 -t UTF-8 <<<"$out" >/dev/null 2>&1; then why="$why; invalid UTF-8 in the output"; fi
  if [ -n "$why" ]; then
    echo "FAIL $name: ${why#; }"
    echo "$out" | head -20 | sed 's/^/    /'
    failed=$((failed + 1))
  else
    echo "ok   $name: $(grep -m1 'error: ' <<<"$out")"
  fi
}

# A checkpoint directory holding a good config.json and a bad file.
bad_checkpoint() {
  mkdir -p "$work/$1"
  cp "$ref/fp32_single/config.json" "$work/$1/config.json"
}

case_ "generate: no such directory" "hyper_parallel::" \
  "$hprun" --nproc-per-node 2 "$generate" --model "$work/missing" --prompt-ids 1,2 --max-new-tokens 2

if [ -f "$ref/fp32_single/config.json" ]; then
  bad_checkpoint truncated
  head -c 1000 "$ref/fp32_single/model.safetensors" >"$work/truncated/model.safetensors"
  case_ "generate: truncated safetensors, 2 ranks" "model.safetensors" \
    "$hprun" --nproc-per-node 2 "$generate" --model "$work/truncated" --prompt-ids 1,2 --max-new-tokens 2

  # A header whose tensor name holds bytes that are not UTF-8 (0xff 0xfe).
  bad_checkpoint badname
  python3 - "$work/badname/model.safetensors" <<'PY'
import struct, sys
header = b'{"model.embed_tokens.weight\xff\xfe": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
PY
  case_ "generate: a tensor name that is not UTF-8" "model.safetensors" \
    "$hprun" --nproc-per-node 2 "$generate" --model "$work/badname" --prompt-ids 1,2 --max-new-tokens 2

  bad_checkpoint badconfig
  echo '{"hidden_size": "wide"' >"$work/badconfig/config.json"
  case_ "generate: config.json that is not JSON" "config.json" \
    "$hprun" --nproc-per-node 2 "$generate" --model "$work/badconfig" --prompt-ids 1,2 --max-new-tokens 2
  bad_checkpoint othermodel
  echo '{"model_type": "llama"}' >"$work/othermodel/config.json"
  case_ "generate: a model family it does not run" "model_type is \"llama\"" \
    "$hprun" --nproc-per-node 2 "$generate" --model "$work/othermodel" --prompt-ids 1,2 --max-new-tokens 2
else
  echo "skipped the checkpoint cases: no transformers references in $ref"
fi

case_ "hp_plan: no such config" "hyper_parallel::" "$plan" --config "$work/missing.json" --mesh tp=8
echo '{"hidden_size": 8}' >"$work/tiny.json"
case_ "hp_plan: a config without the model's fields" "config" "$plan" --config "$work/tiny.json" --mesh tp=8

# With TORCH_SHOW_CPP_STACKTRACES=1 the trace is printed too, after the one-line message.
out=$(TORCH_SHOW_CPP_STACKTRACES=1 "$plan" --config "$work/missing.json" --mesh tp=8 2>&1)
if grep -q "^error: " <<<"$out" && [ "$(wc -l <<<"$out")" -gt 1 ]; then
  echo "ok   hp_plan with TORCH_SHOW_CPP_STACKTRACES=1: the message, then the trace"
else
  echo "FAIL hp_plan with TORCH_SHOW_CPP_STACKTRACES=1 printed no trace:"; echo "$out" | head -5
  failed=$((failed + 1))
fi

# flag_case NAME EXPECTED-SUBSTRING COMMAND...: exit status 2, the substring, no torch message.
flag_case() {
  local name=$1 want=$2
  shift 2
  local out rc why=""
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || why="exit status $rc, not 2"
  grep -qF -- "$want" <<<"$out" || why="$why; no '$want'"
  if grep -qE "terminate called|Exception raised from|Aborted|core dumped|frame #|stod|stoll|negative dimension|TensorList" <<<"$out"; then
    why="$why; a crash, a stack trace or a library's message"
  fi
  if [ -n "$why" ]; then
    echo "FAIL $name: ${why#; }"; echo "$out" | head -8 | sed 's/^/    /'; failed=$((failed + 1))
  else
    echo "ok   $name: $(grep -F -m1 -- "$want" <<<"$out")"
  fi
}
for bad in "--steps 0" "--steps -5" "--batch 0" "--batch -1" "--hidden -1" "--layers 0" "--seq 1" "--new-tokens x"; do
  flag="${bad%% *}"
  flag_case "qwen3_train $bad" "$flag needs an integer" "$train" $bad
done
flag_case "qwen3_train --lr abc" "--lr needs a number, got 'abc'" "$train" --lr abc
flag_case "qwen3_train --lr 0" "--lr needs a positive number" "$train" --lr 0
flag_case "qwen3_train --heads 3 --kv-heads 2" "--heads (3) must be a multiple of --kv-heads (2)" "$train" --heads 3 --kv-heads 2
flag_case "qwen3_train --sequence-parallel 2" "--sequence-parallel is 0 or 1" "$train" --sequence-parallel 2
flag_case "qwen3_train --pp 3 on 4 ranks" "qwen3_train:" "$hprun" --nproc-per-node 4 "$train" --pp 3
flag_case "qwen3_train --model llama" "--model is qwen3 or qwen3_5" "$train" --model llama
flag_case "qwen3_train --lr-schedule wsd --warmup-steps 9 --steps 5" "9 warmup steps exceed the 5 training steps" "$train" --lr-schedule wsd --warmup-steps 9 --steps 5
flag_case "qwen3_train --decay-type exp" "decay_type is linear, sqrt or cosine" "$train" --lr-schedule wsd --decay-type exp
flag_case "generate --max-new-tokens 0" "--max-new-tokens needs an integer >= 1" "$generate" --model "$work/missing" --prompt-ids 1 --max-new-tokens 0
flag_case "generate --top-p 1.5" "--top-p needs a number in (0, 1]" "$generate" --model "$work/missing" --prompt-ids 1 --top-p 1.5
flag_case "generate --seed -1" "--seed needs a number" "$generate" --model "$work/missing" --prompt-ids 1 --seed -1
flag_case "generate --prompt-ids 1,x" "--prompt-ids takes comma-separated token ids" "$generate" --model "$work/missing" --prompt-ids 1,x
flag_case "hprun --grace-s x" "--grace-s needs a positive number" "$hprun" --grace-s x true
flag_case "hprun --max-restarts -1" "--max-restarts needs an integer >= 0" "$hprun" --max-restarts -1 true
flag_case "qwen3_train --checkpoint-every 2 alone" "--checkpoint-every needs --checkpoint-dir" "$train" --checkpoint-every 2
flag_case "qwen3_train --data missing" "--data: cannot read" "$train" --data "$work/missing.tokens"
printf 'not a token file, but long enough to hold a header of sixty-four bytes ......' >"$work/bad.tokens"
flag_case "qwen3_train --data not tokens" "is not a token file" "$train" --data "$work/bad.tokens"
flag_case "hp_tokenize --threads 0" "--threads takes a whole number from 1 to 1024" "$tokenize" --tokenizer "$ref/tokenizer" --output "$work/x.tokens" --threads 0 "$work/bad.tokens"
flag_case "hp_tokenize no input" "no input files given" "$tokenize" --tokenizer "$ref/tokenizer" --output "$work/x.tokens"
flag_case "hp_tokenize missing input" "is not a file" "$tokenize" --tokenizer "$ref/tokenizer" --output "$work/x.tokens" "$work/nothing.txt"
HP_FAULT="1:sideways:3" case_ "HP_FAULT malformed" "unknown phase 'sideways'" "$hprun" --nproc-per-node 2 "$train" --steps 2 --seq 16 --batch 2 --reference 0 --checkpoint-dir "$work/fault_ck"
for prog in "$train" "$generate" "$plan" "$hprun" "$tokenize"; do
  out=$("$prog" --help 2>/dev/null)
  rc=$?
  if [ "$rc" -eq 0 ] && grep -qE "usage|flags" <<<"$out"; then echo "ok   $(basename "$prog") --help"; else
    echo "FAIL $(basename "$prog") --help: exit status $rc"; echo "$out" | head -3 | sed 's/^/    /'; failed=$((failed + 1)); fi
done

echo "$failed case(s) failed"
[ "$failed" -eq 0 ]
