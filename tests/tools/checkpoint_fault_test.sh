#!/usr/bin/env bash
# A rank killed in the middle of a save (after writing its shard file; rank 0 just before the
# commit) must leave the previous checkpoint current and loadable bit-exact, and the job must end
# with the killed rank named.
set -u
HPRUN=$1
TESTS=$2
DIR=$(mktemp -d /tmp/hp_ckpt_fault_XXXXXX)
OUT=$(mktemp)
trap 'rm -rf "$DIR" "$OUT"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$OUT"; exit 1; }
run() {  # run <mode> <seed> [fault]
  HP_TEST_CKPT="$1:$DIR:$2" HP_CHECKPOINT_FAULT="${3:-}" "$HPRUN" --nproc-per-node 2 --grace-s 5 \
    "$TESTS" --gtest_filter=CheckpointFault.SaveOrVerify >"$OUT" 2>&1
}
run save 1 || fail "the first save failed"
run verify 1 || fail "the first checkpoint does not load"
for fault in after_pt:1 before_agree:1 after_pt:0 before_commit:0; do
  start=$(date +%s%N)
  run save 2 "$fault"
  rc=$?
  took=$(( ($(date +%s%N) - start) / 1000000 ))
  [ $rc -ne 0 ] || fail "a save with rank ${fault#*:} killed ($fault) succeeded"
  grep -q "rank ${fault#*:} (pid [0-9]*) failed first" "$OUT" || fail "the killed rank is not named ($fault)"
  echo "fault $fault: job ended in ${took} ms: $(grep -m1 'failed first' "$OUT")"
  run verify 1 || fail "after a kill at $fault the previous checkpoint does not load bit-exact"
done
run save 3 || fail "a save after the faults failed"
run verify 3 || fail "the new checkpoint does not load"
[ "$(ls -d "$DIR"/gen_* | wc -l)" -eq 1 ] || fail "generations left behind: $(ls "$DIR")"

# The same for the consolidated HF checkpoint: ranks killed after writing their boxes, and rank 0
# just before it swaps the new directory in. The previous checkpoint must load bit-exact, and the
# next save clears the abandoned directory.
HF=$DIR/hf
export HP_TEST_CKPT_FORMAT=hf
run() {  # run <mode> <seed> [fault]
  HP_TEST_CKPT="$1:$HF:$2" HP_CHECKPOINT_FAULT="${3:-}" "$HPRUN" --nproc-per-node 2 --grace-s 5 \
    "$TESTS" --gtest_filter=CheckpointFault.SaveOrVerify >"$OUT" 2>&1
}
run save 1 || fail "the first HF save failed"
run verify 1 || fail "the first HF checkpoint does not load"
for fault in hf_after_write:1 hf_after_write:0 hf_before_swap:0; do
  run save 2 "$fault"
  [ $? -ne 0 ] || fail "an HF save with rank ${fault#*:} killed ($fault) succeeded"
  grep -q "rank ${fault#*:} (pid [0-9]*) failed first" "$OUT" || fail "the killed rank is not named ($fault)"
  run verify 1 || fail "after a kill at $fault the previous HF checkpoint does not load bit-exact"
  echo "HF fault $fault: previous checkpoint intact ($(ls "$HF" | tr '\n' ' '))"
done
run save 3 || fail "an HF save after the faults failed"
run verify 3 || fail "the new HF checkpoint does not load"
left=$(ls -d "$DIR"/hf.hp-save-* 2>/dev/null | wc -l)
[ "$left" -eq 0 ] || fail "abandoned HF save directories left behind: $(ls "$DIR")"
echo "checkpoint fault tests passed"
