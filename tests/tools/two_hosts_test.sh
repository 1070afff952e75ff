#!/usr/bin/env bash
# Two "hosts" on this machine: two network namespaces joined by a veth pair, each with its own
# UTS namespace (its own hostname), each running `hprun --nnodes 2 --nproc-per-node 2`. Ranks on
# one host talk through shared memory, the groups that span hosts through Gloo over the veth, and
# the results equal one process (the DTensor tests on a 2x2 mesh: dp across hosts, tp inside).
# Needs root and `ip`; skipped (exit 77) where namespaces cannot be made.
set -u
HPRUN=$1; PROBE=$2; TESTS=$3
NS_A=hp_host_a_$$; NS_B=hp_host_b_$$
ADDR_A=10.231.7.1; ADDR_B=10.231.7.2; PORT=$(( 20000 + $$ % 20000 ))
OUT=$(mktemp -d)
cleanup() { ip netns del $NS_A 2>/dev/null; ip netns del $NS_B 2>/dev/null; rm -rf "$OUT"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$OUT"/*; do echo "--- $f"; tail -40 "$f"; done; exit 1; }
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! ip netns add $NS_A 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here"; exit 77
fi
ip netns add $NS_B || fail "ip netns add"
ip link add hpva$$ type veth peer name hpvb$$ || fail "veth"
ip link set hpva$$ netns $NS_A && ip link set hpvb$$ netns $NS_B || fail "veth into namespaces"
ip -n $NS_A addr add $ADDR_A/24 dev hpva$$ && ip -n $NS_B addr add $ADDR_B/24 dev hpvb$$ || fail "addresses"
for ns in $NS_A $NS_B; do ip -n $ns link set lo up; done
ip -n $NS_A link set hpva$$ up && ip -n $NS_B link set hpvb$$ up || fail "links up"

# node <ns> <node rank> <ifname> <hostname> <out> <program and args...>
node() {
  local ns=$1 nr=$2 ifn=$3 host=$4 out=$5; shift 5
  ip netns exec "$ns" unshare --uts sh -c "hostname $host; GLOO_SOCKET_IFNAME=$ifn exec \"\$@\"" sh \
    "$HPRUN" --nnodes 2 --node-rank "$nr" --nproc-per-node 2 --master-addr $ADDR_A --master-port "$PORT" --rdzv-id "two-hosts-$$-$PORT" "$@" \
    >"$out" 2>&1
}
run_both() {  # run_both <tag> <program and args...>
  local tag=$1; shift
  node $NS_A 0 hpva$$ host-a "$OUT/$tag.a" "$@" & local a=$!
  node $NS_B 1 hpvb$$ host-b "$OUT/$tag.b" "$@" & local b=$!
  wait $a; local ra=$?; wait $b; local rb=$?
  PORT=$(( PORT + 1 ))
  [ $ra -eq 0 ] && [ $rb -eq 0 ]
}
run_both transports "$PROBE" transports || fail "the transports probe failed"
cat "$OUT"/transports.* | grep -q "rank 0 world=gloo dp=gloo tp=shm" || fail "rank 0: expected world/dp on Gloo, tp on shm"
cat "$OUT"/transports.* | grep -q "rank 3 world=gloo dp=gloo tp=shm" || fail "rank 3: expected world/dp on Gloo, tp on shm"
[ "$(cat "$OUT"/transports.* | grep -c 'sum=6$')" -eq 4 ] || fail "the all_reduce across hosts is wrong"
export OMP_NUM_THREADS=1 HP_TIMEOUT_S=30
run_both dtensor "$TESTS" --gtest_filter='OffPath2x2Dist.*:Redistribute2DDist.*:DeviceMesh2x2Dist.*:CollectivesRandomDist.*:FullyShardDist.*' \
  || fail "the 2x2 tests across two hosts failed"
grep -q "PASSED" "$OUT/dtensor.a" || fail "no test ran"
echo "two hosts: $(grep -h 'rank 0 world' "$OUT"/transports.*); $(grep -h '\[  PASSED  \]' "$OUT/dtensor.a" | head -1)"
