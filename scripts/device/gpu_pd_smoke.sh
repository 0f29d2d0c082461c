#!/usr/bin/env bash
# Disaggregated serving on the GPU: router + prefill (cuda) + decode (cuda) on one GPU,
# KV over UCX (tcp on loopback, staged through the host pools); output compared with the
# same model on the GPU alone and on the CPU, then a short tandem bench.
#   Here:  scripts/device/gpu_pd_smoke.sh pack [BUILD_DIR]   (binaries + a small model into .carry)
#   There: scripts/device/gpu_pd_smoke.sh run                 (device tool, carry .carry/device .carry/e2e)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ "${1:-}" = pack ]; then
  build="${2:-$root/build}"
  rm -rf "$root/.carry/e2e" && mkdir -p "$root/.carry/e2e"
  "$build/bin/tandem" make-model --preset tiny --generated-tokenizer --vocab-size 4096 --seed 3 --out "$root/.carry/e2e/model"
  exec "$root/scripts/device/pack.sh" "$build/bin/tandem" "$build/bin/tandem-router" "$build/bin/tandem-prefill" \
    "$build/bin/tandem-decode"
fi
[ "${1:-}" = run ] || { sed -n '2,7p' "$0"; exit 2; }
export LD_LIBRARY_PATH="$root/.carry/device/lib"
bin="$root/.carry/device/bin"
model="$root/.carry/e2e/model"
out="${OUT:-/tmp}"
. "$root/scripts/device/check.sh"
export UCX_TLS=tcp UCX_NET_DEVICES=lo TANDEM_CACHE_DIR=/tmp/tc
"$bin/tandem" serve-local --model "$model" --device cuda --kvstore 0 --listen 127.0.0.1:0 --ready-file /tmp/ready.json \
  --run-dir /tmp/run --worker-arg=--gpu-memory-utilization=0.2 >"$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -f /tmp/ready.json ] && break; sleep 0.1; done
[ -f /tmp/ready.json ] || { echo "cluster not ready"; tail -30 "$out/serve.log"; tail -20 /tmp/run/*.log; results+=("FAILED  cluster start"); failed=1; finish; }
router=$(python3 -c 'import json; print(json.load(open("/tmp/ready.json"))["router"]["grpc"])')
grep -h "model" /tmp/run/prefill-0.log | head -2
for p in "The GPU path" "Disaggregated prefill and decode on one H200" "a b c d e f g h i j k l m n o p q r s t u v w x y z"; do
  want=$("$bin/tandem" generate --local --model "$model" --device cpu --temperature 0 --max-tokens 32 --ignore-eos "$p" 2>/dev/null)
  got=$("$bin/tandem" generate --addr "$router" --temperature 0 --max-tokens 32 --ignore-eos "$p" 2>"$out/gen.err") || { cat "$out/gen.err"; results+=("FAILED  generate through the router: $p"); failed=1; }
  gpu=$("$bin/tandem" generate --local --model "$model" --device cuda --temperature 0 --max-tokens 32 --ignore-eos "$p" 2>/dev/null)
  if [ "$got" = "$gpu" ]; then echo "P/D on GPU == local GPU: yes"; results+=("ok      P/D == local GPU: $p")
  else echo "P/D on GPU == local GPU: NO"; results+=("FAILED  P/D == local GPU: $p"); failed=1; fi
  if [ "$got" = "$want" ]; then echo "P/D on GPU == CPU: yes"; else echo "P/D on GPU == CPU: no (bf16)"; fi
  tail -1 "$out/gen.err"
done
SHOW='.' check status "$bin/tandem" status --ready-file /tmp/ready.json
SHOW='[Oo]utput token throughput|TTFT|TPOT|[Ff]ailed' check bench "$bin/tandem" bench --addr "$router" \
  --num-prompts 200 --max-concurrency 32 --input-len 256 --output-len 64 --ignore-eos --no-progress \
  --json "$out/bench_gpu_pd.json"
kill -TERM $pid; wait $pid
cp /tmp/run/*.log "$logs/" 2>/dev/null
finish
