#!/usr/bin/env bash
# hprun's own contract: environment, rank-prefixed output, first failure named and propagated,
# and a rank that never joins turning into a timeout error on the others (never a hang).
set -u
HPRUN=$1
PROBE=$2
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$OUT"; exit 1; }
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# Shared-memory segments of other jobs (not ours to judge) present before this test.
BEFORE=$(ls /dev/shm 2>/dev/null | grep '^hp_' | sort)
new_segments() { comm -13 <(echo "$BEFORE") <(ls /dev/shm 2>/dev/null | grep '^hp_' | sort) | grep -c .; }

"$HPRUN" --nproc-per-node 3 "$PROBE" env >"$OUT" 2>&1 || fail "env run exited $?"
for r in 0 1 2; do
  grep -q "^\[rank$r\]: rank $r local_rank $r world 3 omp 1$" "$OUT" || fail "rank $r line missing"
done

"$HPRUN" --nproc-per-node 3 --grace-s 2 "$PROBE" exit-on-rank 1 3 >"$OUT" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "expected exit status 3 from the failing rank, got $rc"
grep -q "rank 1 (pid [0-9]*) failed first, exit code 3" "$OUT" || fail "failing rank not named"

start=$(date +%s)
HP_TIMEOUT_S=2 "$HPRUN" --nproc-per-node 2 --grace-s 2 "$PROBE" never-joins 1 >"$OUT" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -eq 1 ] || fail "expected exit status 1 when a rank never joins, got $rc"
grep -q "rank 0 (pid [0-9]*) failed first" "$OUT" || fail "rank 0 not named"
grep -q "timeout of 2 s" "$OUT" || fail "no timeout error"
grep -q "never joined the job: \[1\]" "$OUT" || fail "the missing rank is not named"
[ $elapsed -lt 30 ] || fail "took ${elapsed}s: not a prompt timeout"
# Signals reach every rank: SIGTERM to hprun stops the sleeping ranks, status 128+15.
"$HPRUN" --nproc-per-node 2 --grace-s 2 "$PROBE" exit-on-rank 9 0 >"$OUT" 2>&1 &
pid=$!
sleep 1
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "expected 143 after SIGTERM, got $rc"
grep -q "forwarding it to every rank" "$OUT" || fail "signal not forwarded"
# hprun killed with SIGKILL (it can forward nothing): its ranks die with it, at once.
"$HPRUN" --nproc-per-node 2 --grace-s 2 "$PROBE" exit-on-rank 9 0 >"$OUT" 2>&1 &
pid=$!
sleep 1
ranks=$(cat /proc/$pid/task/*/children 2>/dev/null)
[ -n "$ranks" ] || fail "no ranks started"
kill -KILL $pid
wait $pid 2>/dev/null
sleep 1
for r in $ranks; do
  # (a zombie waiting for a reaper that never comes is dead too)
  state=$(awk '{print $3}' /proc/$r/stat 2>/dev/null)
  [ -z "$state" ] || [ "$state" = Z ] || fail "rank pid $r (state $state) outlived its SIGKILLed launcher"
done
# A rank that stops (SIGSTOP) in the middle of the job: the others time out in their collective
# and name it; hprun reports it stopped.
for transport in auto gloo; do
  for n in 2 4; do
    start=$(date +%s)
    HP_TRANSPORT=$transport HP_TIMEOUT_S=2 "$HPRUN" --nproc-per-node $n --grace-s 1 "$PROBE" stop-in-collective 1 >"$OUT" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - start ))
    [ $rc -ne 0 ] || fail "a stopped rank went unnoticed ($transport, $n ranks)"
    grep -q "rank(s) \[1\] did not arrive" "$OUT" || fail "the stopped rank is not named by its peers ($transport, $n ranks)"
    grep -q "rank 1 (pid [0-9]*) is stopped" "$OUT" || fail "hprun does not report the stopped rank ($transport, $n ranks)"
    [ $elapsed -lt 30 ] || fail "took ${elapsed}s to report a stopped rank"
    echo "stopped rank ($transport, $n ranks): named after ${elapsed}s: $(grep -m1 'did not arrive' "$OUT" | cut -c1-160)"
    # A rank that exits without a word while the others wait in a collective.
    HP_TRANSPORT=$transport HP_TIMEOUT_S=2 "$HPRUN" --nproc-per-node $n --grace-s 1 "$PROBE" exit-in-collective 1 >"$OUT" 2>&1
    [ $? -ne 0 ] || fail "a vanished rank went unnoticed ($transport, $n ranks)"
    # (Over Gloo the peers of the vanished rank may fail before they can say they arrived, so the
    # named set can include them: the vanished rank must be in it.)
    grep -q "rank(s) \[\([0-9]*,\)*1\(,[0-9]*\)*\] \(did not arrive\|exited without reaching it\)\|rank 1 (pid [0-9]*) failed first" "$OUT" ||
      fail "the vanished rank is not named ($transport, $n ranks)"
  done
done
# Ranks that call one collective with different sizes: every rank raises (shared memory checks it
# always; over Gloo with HP_DEBUG_COLLECTIVES=1), instead of an abort inside Gloo.
for mode in "HP_TRANSPORT=auto" "HP_TRANSPORT=gloo HP_DEBUG_COLLECTIVES=1"; do
  env $mode HP_TIMEOUT_S=5 "$HPRUN" --nproc-per-node 2 --grace-s 1 "$PROBE" mismatched-all-reduce >"$OUT" 2>&1
  [ "$(grep -c 'raised: .*\(called different collectives\|ranks disagree\)' "$OUT")" -eq 2 ] ||
    fail "mismatched sizes are not an error on every rank ($mode)"
done
# Different collectives over Gloo without the debug check (Gloo cannot pair them): every rank stops
# (through the store, within a second; the timeout report says the same), and its error says what
# each rank was in, not "every rank reached it".
HP_TRANSPORT=gloo HP_TIMEOUT_S=5 "$HPRUN" --nproc-per-node 2 --grace-s 3 "$PROBE" mismatched-kinds >"$OUT" 2>&1
[ "$(grep -c "raised: .*rank 0 was in all_reduce #[0-9]*; rank 1 was in all_gather #[0-9]*" "$OUT")" -eq 2 ] ||
  fail "a Gloo failure between different collectives does not say what each rank was in"
# Restarts that cannot help: the same first error line in two rounds stops after one restart,
# saying why; --restart-policy always retries every failure (torchrun's policy).
"$HPRUN" --nproc-per-node 2 --grace-s 1 --max-restarts 2 "$PROBE" same-error >"$OUT" 2>&1
[ $? -eq 1 ] && [ "$(grep -c 'restarting every rank' "$OUT")" -eq 1 ] && grep -q "same error as in the round before" "$OUT" ||
  fail "a failure repeated with the same error was restarted again, or not named"
"$HPRUN" --nproc-per-node 2 --grace-s 1 --max-restarts 2 "$PROBE" exit-on-rank 1 2 >"$OUT" 2>&1
[ $? -eq 2 ] && [ "$(grep -c 'restarting every rank' "$OUT")" -eq 0 ] && grep -q "status 2 (a usage or configuration error" "$OUT" ||
  fail "a rank's exit status 2 was restarted, or not named"
"$HPRUN" --nproc-per-node 2 --grace-s 1 --max-restarts 2 --restart-policy always "$PROBE" same-error >"$OUT" 2>&1
[ "$(grep -c 'restarting every rank' "$OUT")" -eq 2 ] || fail "--restart-policy always did not restart every failure"
# No shared-memory segment outlives the killed jobs above.
[ "$(new_segments)" -eq 0 ] || fail "shared-memory segments left in /dev/shm: $(ls /dev/shm | grep '^hp_')"
# MASTER_PORT already held by another job: the cause first, at once.
PORT=$(( 30000 + $$ % 20000 ))
HP_TIMEOUT_S=20 "$HPRUN" --nproc-per-node 2 --grace-s 1 --master-port $PORT "$PROBE" stop-in-collective 1 >/dev/null 2>&1 &
holder=$!
hexport=$(printf '%04X' $PORT)
for _ in $(seq 100); do  # until the holder's rank 0 listens on the port
  grep -q ":$hexport [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
  sleep 0.1
done
start=$(date +%s)
# One rank: the others of a second job would join the holder's rendezvous (a known hazard, as in
# PyTorch) and could fail first, before rank 0 reports the port.
HP_TIMEOUT_S=20 "$HPRUN" --nproc-per-node 1 --grace-s 1 --master-port $PORT "$PROBE" stop-in-collective 9 >"$OUT" 2>&1
elapsed=$(( $(date +%s) - start ))
kill -TERM $holder 2>/dev/null; wait $holder 2>/dev/null  # (TERM: hprun cleans up its job)
grep -q "MASTER_PORT $PORT on 127.0.0.1 is already in use" "$OUT" || fail "a port in use is not reported as such"
[ $elapsed -lt 15 ] || fail "took ${elapsed}s to report a port in use"
# An unresolvable MASTER_ADDR: at once, not after the timeout.
start=$(date +%s)
HP_TIMEOUT_S=20 "$HPRUN" --nproc-per-node 2 --grace-s 1 --master-addr no-such-host.invalid --master-port $(( PORT + 1 )) \
  "$PROBE" stop-in-collective 9 >"$OUT" 2>&1
elapsed=$(( $(date +%s) - start ))
grep -q "MASTER_ADDR 'no-such-host.invalid' does not resolve" "$OUT" || fail "an unresolvable MASTER_ADDR is not reported"
[ $elapsed -lt 15 ] || fail "took ${elapsed}s to report an unresolvable MASTER_ADDR"
# Two jobs on one MASTER_PORT, timed so that job B's rank 1 reaches job A's store while job A's
# rank 0 still waits for its own rank 1: B's rank must not be taken for A's (A would run its
# collectives with another job's process). A finishes with its own ranks; B fails naming the port.
OUT_A=$(mktemp); OUT_B=$(mktemp)
HP_TIMEOUT_S=20 "$HPRUN" --nproc-per-node 2 --grace-s 1 --master-port $(( PORT + 2 )) "$PROBE" late-sum 0 4000 >"$OUT_A" 2>&1 &
job_a=$!
sleep 0.5
HP_TIMEOUT_S=20 "$HPRUN" --nproc-per-node 2 --grace-s 1 --master-port $(( PORT + 2 )) "$PROBE" late-sum 1500 0 >"$OUT_B" 2>&1
wait $job_a || { cat "$OUT_A"; fail "job A failed when another job's rank reached its rendezvous"; }
[ "$(grep -c "of job $job_a: sums right" "$OUT_A")" -eq 2 ] || { cat "$OUT_A"; fail "job A's ranks did not both finish with their own sums"; }
grep -q "is already in use" "$OUT_B" || { cat "$OUT_B"; fail "job B's port clash is not reported"; }
rm -f "$OUT_A" "$OUT_B"
[ "$(new_segments)" -eq 0 ] || fail "shared-memory segments left in /dev/shm after the port test: $(ls /dev/shm | grep '^hp_')"
# --max-restarts: a failing rank restarts every rank, each round with a fresh port and rendezvous
# and HPRUN_RESTART_COUNT; the job succeeds once the rank stops failing.
HP_TIMEOUT_S=10 "$HPRUN" --nproc-per-node 3 --grace-s 1 --max-restarts 2 "$PROBE" fail-until-restart 1 2 >"$OUT" 2>&1 ||
  fail "a job that succeeds on its second restart exited $?"
grep -q "rank 1 failed with status 5; restarting every rank (restart 1 of 2)" "$OUT" || fail "first restart not announced"
grep -q "restarting every rank (restart 2 of 2)" "$OUT" || fail "second restart not announced"
[ "$(grep -c 'round 2: 3 ranks joined' "$OUT")" -eq 3 ] || fail "the last round's ranks did not all join"
[ "$(grep '^\[rank1\]: round [0-9] port' "$OUT" | awk '{print $5}' | sort -u | wc -l)" -eq 3 ] || fail "the rounds did not each get a port of their own"
[ "$(grep '^\[rank1\]: round [0-9] port' "$OUT" | awk '{print $7}' | sort -u | wc -l)" -eq 3 ] || fail "the rounds did not each get a rendezvous of their own"
# Out of restarts: the first failure of the last round is named and its status returned.
HP_TIMEOUT_S=10 "$HPRUN" --nproc-per-node 2 --grace-s 1 --max-restarts 1 "$PROBE" fail-until-restart 1 9 >"$OUT" 2>&1
rc=$?
[ $rc -eq 5 ] || fail "expected the failing rank's status 5 after the restarts ran out, got $rc"
grep -q "1 restart(s) used; giving up" "$OUT" || fail "giving up is not said"
grep -q "exiting with rank 1's status 5" "$OUT" || fail "the failing rank is not named at the end"
# Several nodes: restarts are refused by name.
"$HPRUN" --nnodes 2 --master-port 29999 --max-restarts 1 "$PROBE" env >"$OUT" 2>&1
[ $? -eq 2 ] && grep -q "\-\-max-restarts needs --nnodes 1" "$OUT" || fail "--max-restarts with --nnodes 2 is not refused by name"
[ "$(new_segments)" -eq 0 ] || fail "shared-memory segments left in /dev/shm after the restarts: $(ls /dev/shm | grep '^hp_')"
echo "hprun tests passed"
