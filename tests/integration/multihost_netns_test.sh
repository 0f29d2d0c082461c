#!/usr/bin/env bash
# Multi-host test: the router, a prefill replica and two decode replicas, each in its own
# network namespace (its own network stack) joined by veth links through a bridge, with
# KV over UCX tcp between them. Checks that output equals the in-process engine's, then
# cuts one decode replica's link in the middle of streams: every stream either completes
# with exactly the undisturbed tokens (migrated to the other decode replica) or ends with
# UNAVAILABLE/ABORTED, none hangs, and new requests succeed.
#   multihost_netns_test.sh BIN_DIR
# Needs root and iproute2; exits 77 (skipped) without them.
set -uo pipefail
bin="${1:?usage: multihost_netns_test.sh BIN_DIR}"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIPPED: network namespaces need root and iproute2"
  exit 77
fi
id=$$
work="$(mktemp -d /tmp/tandem-netns.XXXXXX)"
br="tb$id"
declare -A ip_of=([router]=10.87.0.10 [prefill]=10.87.0.11 [decodea]=10.87.0.12 [decodeb]=10.87.0.13)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for name in "${!ip_of[@]}"; do ip netns del "tn$id$name" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do echo "== $f"; tail -n 20 "$f"; done; exit 1; }

ip link add "$br" type bridge && ip addr add 10.87.0.1/24 dev "$br" && ip link set "$br" up || fail "bridge"
for name in router prefill decodea decodeb; do
  ns="tn$id$name"
  ip netns add "$ns" || fail "netns $ns"
  ip link add "tv$id${name:0:4}${name: -1}" type veth peer name eth0 netns "$ns" || fail "veth $name"
  ip link set "tv$id${name:0:4}${name: -1}" master "$br" up
  ip -n "$ns" addr add "${ip_of[$name]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
veth_of() { local name=$1; echo "tv$id${name:0:4}${name: -1}"; }

export TANDEM_CACHE_DIR="${TANDEM_CACHE_DIR:-$work/cache}"
export UCX_TLS=tcp UCX_NET_DEVICES=eth0
"$bin/tandem" generate --local --model tiny --max-tokens 1 x >/dev/null 2>&1 || fail "built-in model"
start() {  # start NAME NS-NAME BINARY ARGS...
  local name=$1; shift
  ip netns exec "tn$id$name" "$@" --ready-file "$work/$name.json" >"$work/$name.log" 2>&1 &
  pids+=($!)
}
router="${ip_of[router]}:50051"
internal="${ip_of[router]}:50061"
# Internal ports that other hosts reach need credentials: the cluster token here (tcp only).
token="$work/cluster.token"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token"
auth=(--cluster-token-file "$token")
start router "$bin/tandem-router" --listen "$router" --internal-listen "$internal" "${auth[@]}" --heartbeat-ms 300
for _ in $(seq 300); do [ -f "$work/router.json" ] && break; sleep 0.1; done
[ -f "$work/router.json" ] || fail "router not ready"
start prefill "$bin/tandem-prefill" --listen "${ip_of[prefill]}:0" --router "$internal" "${auth[@]}" --threads 1
start decodea "$bin/tandem-decode" --listen "${ip_of[decodea]}:0" --router "$internal" "${auth[@]}" --threads 1
start decodeb "$bin/tandem-decode" --listen "${ip_of[decodeb]}:0" --router "$internal" "${auth[@]}" --threads 1
for name in prefill decodea decodeb; do
  for _ in $(seq 600); do [ -f "$work/$name.json" ] && break; sleep 0.1; done
  [ -f "$work/$name.json" ] || fail "$name not ready"
done
"$bin/tandem" status --addr "$internal" "${auth[@]}" || fail "status"
# Without the token the internal port refuses; the public one has no Cluster service.
! "$bin/tandem" status --addr "$internal" 2>"$work/status.err" || fail "status without the token succeeded"
grep -q UNAUTHENTICATED "$work/status.err" || fail "status without the token: $(cat "$work/status.err")"
! "$bin/tandem" status --addr "$router" "${auth[@]}" 2>"$work/status.err" || fail "Cluster served on the public port"

# Exactness across real separate network stacks.
want="$("$bin/tandem" generate --local --model tiny --temperature 0 --max-tokens 24 --ignore-eos "Across namespaces" 2>/dev/null)"
got="$("$bin/tandem" generate --addr "$router" --temperature 0 --max-tokens 24 --ignore-eos --timeout 60 "Across namespaces" 2>"$work/gen.err")" \
  || fail "generate: $(cat "$work/gen.err")"
[ "$got" = "$want" ] || fail "remote output differs from local: '$got' vs '$want'"
echo "exact output through router -> prefill -> UCX tcp -> decode across namespaces"

# Streams in flight while decode replica A's link is cut.
n=8
want_pids=()
for i in $(seq $n); do
  "$bin/tandem" generate --local --model tiny --temperature 0 --max-tokens 100 --ignore-eos "stream $i of the cut" \
    >"$work/want.$i" 2>/dev/null &
  want_pids+=($!)
done
wait "${want_pids[@]}"  # not the servers, which are background jobs too
for i in $(seq $n); do
  ( "$bin/tandem" generate --addr "$router" --temperature 0 --max-tokens 100 --ignore-eos --timeout 60 \
      "stream $i of the cut" >"$work/got.$i" 2>"$work/err.$i"; echo $? >"$work/rc.$i" ) &
done
sleep 1
ip link set "$(veth_of decodea)" down || fail "cutting the link"
echo "cut decode replica A's link"
wait_start=$(date +%s)
for i in $(seq $n); do
  while [ ! -f "$work/rc.$i" ]; do
    [ $(( $(date +%s) - wait_start )) -lt 90 ] || fail "stream $i hangs"
    sleep 0.2
  done
done
completed=0
for i in $(seq $n); do
  rc=$(cat "$work/rc.$i")
  if [ "$rc" -eq 0 ]; then
    cmp -s "$work/got.$i" "$work/want.$i" || fail "stream $i completed with different tokens"
    completed=$((completed + 1))
  else
    grep -qE "UNAVAILABLE|ABORTED" "$work/err.$i" || fail "stream $i ended with: $(cat "$work/err.$i")"
  fi
done
echo "$completed of $n streams completed exactly; the rest ended UNAVAILABLE/ABORTED"

# New requests succeed once the router has dropped the silent replica.
sleep 2
for i in 1 2 3; do
  got="$("$bin/tandem" generate --addr "$router" --temperature 0 --max-tokens 8 --ignore-eos --timeout 60 "after $i" 2>"$work/after.err")" \
    || fail "request after the cut: $(cat "$work/after.err")"
done
"$bin/tandem" status --addr "$internal" "${auth[@]}"
echo "PASS"
