#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts a local Tandem cluster (router,
# prefill and decode replicas, KV over UCX) on the built-in `tiny` model, and streams a
# generation through it. The cluster stops afterwards unless --keep is given.
#   scripts/run.sh ["prompt"] [--keep]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_BUILD_DIR:-$root/build}"
prompt="Tandem splits prefill and decode across replicas."
keep=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    *) prompt="$arg" ;;
  esac
done
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

run_dir="$(mktemp -d /tmp/tandem-run.XXXXXX)"
# Keep UCX's tcp transport on loopback for a one-machine cluster.
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
"$build/bin/tandem" serve-local --listen 127.0.0.1:0 --run-dir "$run_dir" --ready-file "$run_dir/cluster.json" &
cluster=$!
stop_cluster() { kill -TERM "$cluster" 2>/dev/null || true; wait "$cluster" 2>/dev/null || true; }
[ "$keep" -eq 1 ] || trap stop_cluster EXIT
for _ in $(seq 600); do
  [ -f "$run_dir/cluster.json" ] && break
  kill -0 "$cluster" 2>/dev/null || { echo "run.sh: the cluster failed to start (logs in $run_dir)" >&2; exit 1; }
  sleep 0.2
done
addr="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["grpc"])' "$run_dir/cluster.json")"
echo "run.sh: cluster ready at $addr; streaming a generation:" >&2
"$build/bin/tandem" generate --addr "$addr" --max-tokens 48 --seed 0 --ignore-eos "$prompt"
"$build/bin/tandem" status --ready-file "$run_dir/cluster.json" >&2  # the internal port, with serve-local's client certificate
if [ "$keep" -eq 1 ]; then
  echo "run.sh: the cluster keeps running (pid $cluster): tandem generate --addr $addr \"...\"; kill $cluster to stop" >&2
fi
