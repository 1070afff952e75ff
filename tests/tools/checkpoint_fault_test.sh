#!/usr/bin/env bash
# A rank killed in the middle of a save (HP_FAULT's save phases: after writing its data file, after
# writing its files, after every rank agreed but before the commit - rank 1 too, which must stop
# rank 0's commit) must leave the previous checkpoint current and loadable bit-exact, and the job
# must end with the killed rank named.
set -u
HPRUN=$1
TESTS=$2
DIR=$(mktemp -d /tmp/hp_ckpt_fault_XXXXXX)
OUT=$(mktemp)
trap 'rm -rf "$DIR" "$OUT"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$OUT"; exit 1; }
run() {  # run <mode> <seed> [fault]
  HP_TEST_CKPT="$1:$DIR:$2" HP_FAULT="${3:-}" "$HPRUN" --nproc-per-node 2 --grace-s 5 \
    "$TESTS" --gtest_filter=CheckpointFault.SaveOrVerify >"$OUT" 2>&1
}
run save 1 || fail "the first save failed"
run verify 1 || fail "the first checkpoint does not load"
for fault in 1:mid_write 1:mid_save 0:mid_write 0:before_commit 1:before_commit; do
  start=$(date +%s%N)
  run save 2 "$fault"
  rc=$?
  took=$(( ($(date +%s%N) - start) / 1000000 ))
  [ $rc -ne 0 ] || fail "a save with rank ${fault%%:*} killed ($fault) succeeded"
  grep -q "rank ${fault%%:*} (pid [0-9]*) failed first" "$OUT" || fail "the killed rank is not named ($fault)"
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
  HP_TEST_CKPT="$1:$HF:$2" HP_FAULT="${3:-}" "$HPRUN" --nproc-per-node 2 --grace-s 5 \
    "$TESTS" --gtest_filter=CheckpointFault.SaveOrVerify >"$OUT" 2>&1
}
run save 1 || fail "the first HF save failed"
run verify 1 || fail "the first HF checkpoint does not load"
for fault in 1:hf_mid_write 0:hf_mid_write 0:hf_before_swap 1:hf_before_swap; do
  run save 2 "$fault"
  [ $? -ne 0 ] || fail "an HF save with rank ${fault%%:*} killed ($fault) succeeded"
  grep -q "rank ${fault%%:*} (pid [0-9]*) failed first" "$OUT" || fail "the killed rank is not named ($fault)"
  run verify 1 || fail "after a kill at $fault the previous HF checkpoint does not load bit-exact"
  echo "HF fault $fault: previous checkpoint intact ($(ls "$HF" | tr '\n' ' '))"
done
run save 3 || fail "an HF save after the faults failed"
run verify 3 || fail "the new HF checkpoint does not load"
left=$(ls -d "$DIR"/hf.hp-save-* 2>/dev/null | wc -l)
[ "$left" -eq 0 ] || fail "abandoned HF save directories left behind: $(ls "$DIR")"
# A train state saved in the background when a rank fails: rank 1 throws past its handle and
# exits, rank 0 goes on to the next step's collective. No destructor may run a collective (the
# commit would meet rank 0's all_reduce): rank 1 says its save was left uncommitted, the job ends
# by itself naming rank 1, well within HP_TIMEOUT_S=60 (timeout 20 is the bound), LATEST is unchanged, the previous state loads
# bit-exact, and the next save removes the uncommitted generation. On shared memory and on Gloo.
unset HP_TEST_CKPT_FORMAT
ST=$DIR/state
state() {  # state <mode> <seed> [timeout]
  HP_TEST_CKPT="$1:$ST:$2" HP_TIMEOUT_S=60 timeout "${3:-120}" "$HPRUN" --nproc-per-node 2 --grace-s 5 \
    "$TESTS" --gtest_filter=CheckpointFault.SaveOrVerify >"$OUT" 2>&1
}
for transport in auto gloo; do
  export HP_TRANSPORT=$transport
  rm -rf "$ST"
  state state 1 || fail "the first train state did not save ($transport)"
  before=$(cat "$ST/LATEST")
  state async_fail 2 20
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a job whose rank failed with a save in flight did not end by itself in 20 s, or succeeded (rc $rc, $transport)"
  grep -q "rank 1 (pid [0-9]*) failed first, exit code 3" "$OUT" || fail "the job did not end naming rank 1's failure ($transport)"
  grep -q "was not committed" "$OUT" || fail "rank 1 did not say its save was left uncommitted ($transport)"
  echo "async save, rank 1 failing ($transport): $(grep -m1 'failed first' "$OUT")"
  [ "$(cat "$ST/LATEST")" = "$before" ] || fail "LATEST changed after a failed save in flight ($transport)"
  state state_verify 1 || fail "after a failed save in flight the previous train state does not load bit-exact ($transport)"
  state state 3 || fail "a train state save after the failed one failed ($transport)"
  state state_verify 3 || fail "the new train state does not load ($transport)"
  [ "$(ls -d "$ST"/gen_* | wc -l)" -le 2 ] || fail "generations left behind: $(ls "$ST")"
done
unset HP_TRANSPORT
echo "checkpoint fault tests passed"
