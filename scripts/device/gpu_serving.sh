#!/usr/bin/env bash
# GPU serving on the device machine, in one device run: the KV copy kernel and CUDA IPC
# tests, the engine on CUDA, the disaggregated-serving test on one and on two GPUs, the
# peer-copy benchmark; the TTFT of an 8K-token prompt through P/D on two GPUs vs an
# aggregated worker on one; serving throughput with tokens chosen on the GPU vs on the CPU
# (the last two on a DeepSeek-V2-Lite-shaped random model whose weights are generated on
# the GPU at load); one stream's time per output token, greedy and sampled (tpot1);
# DeepSeek-V4 served with its KV over CUDA IPC (v4).
#   Here:  scripts/device/gpu_serving.sh pack [BUILD_DIR]
#   There: scripts/device/gpu_serving.sh run [all|tests|serving|v4|ttft|sampling|tpot1]
#          (run tool: kind nvidia-h200-x2 for the two-GPU parts, carry .carry/device.tgz
#          .carry/e2e; results under $OUT)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ "${1:-}" = pack ]; then
  build="${2:-$root/build}"
  rm -rf "$root/.carry/e2e" "$root/.carry/device" && mkdir -p "$root/.carry/e2e"
  "$build/bin/tandem" make-model --preset tiny --generated-tokenizer --vocab-size 4096 --seed 3 --out "$root/.carry/e2e/model"
  "$root/scripts/device/pack.sh" "$build/bin/tandem" "$build/bin/tandem-router" "$build/bin/tandem-prefill" \
    "$build/bin/tandem-decode" "$build/bin/tandem-kvstore" "$build/tests/integration_gpu_serving_test" "$build/tests/kernels_cuda_kv_block_copy_test" \
    "$build/tests/kernels_cuda_kv_extent_copy_test" \
    "$build/tests/engine_model_cuda_ipc_test" "$build/bin/kv_peer_copy_bench" \
    "$build/tests/engine_runtime_engine_cuda_test" || exit 1
  # Compressed: with the working tree it must fit the device tool's 64 MiB.
  tar -czf "$root/.carry/device.tgz" -C "$root/.carry" device && rm -rf "$root/.carry/device"
  du -sh "$root/.carry/device.tgz"
  exit 0
fi
[ "${1:-}" = run ] || { sed -n '2,13p' "$0"; exit 2; }
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
export UCX_TLS=tcp UCX_NET_DEVICES=lo TANDEM_CACHE_DIR=/tmp/tc TANDEM_BINARY_DIR="$root/.carry/device"
. "$root/scripts/device/check.sh"
nvidia-smi topo -m | head -5
what="${2:-all}"
want() { [ "$what" = all ] || [ "$what" = "$1" ]; }

# `tandem generate --local` on the GPU prints exactly --max-tokens generated tokens, greedy
# and sampled, for several prompts (pipelined steps: the next step is launched before a
# sequence's last token is seen).
generate_counts() {
  local rc=0 n
  for p in "The GPU path" "Disaggregated prefill and decode on one H200" "a b c d e f g h i j k l m n o p q r s t u v w x y z"; do
    for args in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 5"; do
      for n in 31; do
        # shellcheck disable=SC2086
        "$bin/tandem" generate --local --model "$root/.carry/e2e/model" --device cuda --gpu-memory-utilization 0.2 \
          $args --ignore-eos --max-tokens $n "$p" 2>/tmp/generate.err >/dev/null || { cat /tmp/generate.err; rc=1; }
        if grep -q "generated tokens: $n |" /tmp/generate.err; then echo "max-tokens $n ($args): ok"
        else echo "max-tokens $n ($args): WRONG COUNT: $(grep -o 'generated tokens: [0-9]*' /tmp/generate.err)"; rc=1; fi
      done
    done
  done
  return $rc
}

if want tests; then
  SHOW='^\[ *(FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|identical|prompts' \
    check engine_cuda_test "$bin/engine_runtime_engine_cuda_test"
  # The sampler's clusters (16 blocks a row among them) under memcheck, a few rows.
  TANDEM_SAMPLER_TEST_QUICK=1 check memcheck_sampler compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bin/engine_runtime_engine_cuda_test" --gtest_filter='*GpuSampling*'
  expect_in memcheck_sampler "ERROR SUMMARY: 0 errors"
  check kv_block_copy_test "$bin/kernels_cuda_kv_block_copy_test"
  check memcheck_kv_block_copy compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/kernels_cuda_kv_block_copy_test"
  expect_in memcheck_kv_block_copy "ERROR SUMMARY: 0 errors"
  SHOW='^\[ *(FAILED|PASSED|SKIPPED|OK) |Failure|error' check cuda_ipc_test "$bin/engine_model_cuda_ipc_test"
  SHOW='generated tokens|WRONG|ok$' check generate_max_tokens generate_counts
fi
if want serving; then
  SHOW='^\[ *(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|actual|exited|differ|^request' \
    check gpu_serving_test env TANDEM_GPU_TEST_MODEL="$root/.carry/e2e/model" "$bin/integration_gpu_serving_test"
fi
# DeepSeek-V4 (tiny-v4) served on the GPU: its KV, whole sequences of several streams,
# moves by CUDA IPC between two processes of one GPU (and over the host path), with the
# aggregated worker's output.
if want v4; then
  # Made there (the carried tree stays within the device tool's 64 MiB).
  [ -f /tmp/tiny-v4/config.json ] || "$bin/tandem" make-model --preset tiny-v4 --out /tmp/tiny-v4 >/dev/null
  check kv_extent_copy_test "$bin/kernels_cuda_kv_extent_copy_test"
  check memcheck_kv_extent_copy compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/kernels_cuda_kv_extent_copy_test"
  expect_in memcheck_kv_extent_copy "ERROR SUMMARY: 0 errors"
  SHOW='^\[ *(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|actual|exited|differ|^request' \
    check gpu_serving_v4 env TANDEM_GPU_TEST_MODEL=/tmp/tiny-v4 "$bin/integration_gpu_serving_test" \
    --gtest_filter='*OneGpuTwoProcessesMoveKvByCudaIpc*:*HostPathOnTheGpuGivesTheSameOutput*'
fi
if [ "$what" = all ]; then
  SHOW='GB/s|ratio|size' check kv_peer_copy_bench "$bin/kv_peer_copy_bench" --json "$out/kv_peer_copy_h200x2.json"
fi
want ttft || want sampling || want tpot1 || finish

model=/tmp/v2lite
"$bin/tandem" make-model --config "$root/bench/configs/deepseek_v2_lite_full.json" --weights-on-gpu --seed 1 \
  --generated-tokenizer --out "$model" 2>&1 | tail -1
# Starts `tandem serve-local` as NAME with the given arguments; sets $router and $pid.
start() {
  local name=$1; shift
  rm -rf /tmp/run-$name /tmp/ready-$name.json
  "$bin/tandem" serve-local --model "$model" --kvstore 0 --listen 127.0.0.1:0 --ready-file /tmp/ready-$name.json \
    --run-dir /tmp/run-$name --kv-cache-mb 4096 "$@" >/tmp/serve-$name.log 2>&1 &
  pid=$!
  for _ in $(seq 1800); do [ -f /tmp/ready-$name.json ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if [ ! -f /tmp/ready-$name.json ]; then
    echo "$name: cluster not ready"; tail -5 /tmp/serve-$name.log; tail -5 /tmp/run-$name/*.log; failed=1; return 1
  fi
  router=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["grpc"])' /tmp/ready-$name.json)
}

if want sampling; then
  # Serving throughput, 64 concurrent sampled streams, one aggregated worker: tokens chosen
  # on the GPU (default, pipelined steps) vs the same one step at a time (unpipelined) vs
  # logits copied to the host and sampled on the CPU (host).
  for name in ${SAMPLING_VARIANTS:-device unpipelined host}; do
    extra=()
    [ $name = host ] && extra=(--worker-arg=--no-device-sampling)
    [ $name = unpipelined ] && extra=(--worker-arg=--no-pipeline-steps)
    export TANDEM_GPU_STEP_TRACE=200  # the worker logs the GPU's busy share every 200 steps
    start sampling-$name --aggregated 1 --device cuda:0 "${extra[@]}" || continue
    unset TANDEM_GPU_STEP_TRACE
    SHOW='[Oo]utput token throughput|[Mm]edian TPOT|[Ff]ailed' check "sampling_$name" "$bin/tandem" bench --addr "$router" \
      --num-prompts 256 --num-warmup 4 --max-concurrency 64 --input-len 256 --output-len 128 --ignore-eos \
      --temperature 0.8 --no-progress --json "$out/sampling_$name.json"
    kill -TERM $pid; wait $pid
    grep -h "gpu step trace" /tmp/run-sampling-$name/*.log | tail -4 | sed "s/^/$name: /"
  done
fi

if want tpot1; then
  # One stream through the router (aggregated worker on cuda:0): time per output token,
  # greedy and sampled (temperature 0.8), against the model's step time (cuda_model_bench).
  for name in greedy sampled; do
    temp=0
    [ $name = sampled ] && temp=0.8
    export TANDEM_GPU_STEP_TRACE=200
    start tpot1-$name --aggregated 1 --device cuda:0 || continue
    unset TANDEM_GPU_STEP_TRACE
    SHOW='[Oo]utput token throughput|[Mm]edian TPOT|[Ff]ailed' check "tpot1_$name" "$bin/tandem" bench --addr "$router" \
      --num-prompts 10 --num-warmup 2 --max-concurrency 1 --input-len 256 --output-len 256 --ignore-eos \
      --temperature $temp --no-progress --json "$out/tpot1_$name.json"
    kill -TERM $pid; wait $pid
    grep -h "gpu step trace" /tmp/run-tpot1-$name/*.log | tail -2 | sed "s/^/$name: /"
  done
fi

if want ttft; then
  # TTFT of 8K-token prompts: aggregated on cuda:0, then P/D with prefill on cuda:0 and
  # decode on cuda:1 (serve-local's placement for a bare --device cuda on two GPUs).
  for name in ${TTFT_VARIANTS:-aggregated pd}; do
    if [ $name = aggregated ]; then start $name --aggregated 1 --device cuda:0 || continue
    else start $name --device cuda --worker-arg=--log-level=debug || continue; fi
    SHOW='TTFT|[Ff]ailed' check "ttft_8k_$name" "$bin/tandem" bench --addr "$router" --num-prompts 20 --num-warmup 3 \
      --max-concurrency 1 --input-len 8192 --output-len 4 --ignore-eos --no-progress --json "$out/ttft_8k_$name.json"
    grep -h "GPU to GPU\|offering the GPU" /tmp/run-$name/*.log | head -3
    kill -TERM $pid; wait $pid
    [ -s "$out/ttft_8k_$name.json" ] || { failed=1; tail -20 /tmp/run-$name/*.log; }
  done
  [ -s "$out/ttft_8k_aggregated.json" ] && [ -s "$out/ttft_8k_pd.json" ] && python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
a, p = (json.load(open(f"{out}/ttft_8k_{n}.json"))["result"]["ttft_ms"] for n in ("aggregated", "pd"))
res = {q: {"aggregated_1gpu_ms": a[q], "pd_2gpu_ms": p[q], "ratio": p[q] / a[q]} for q in ("median", "mean", "p99")}
print(json.dumps({"ttft_8k": res}, indent=1))
json.dump({"ttft_8k": res}, open(f"{out}/ttft_8k_summary.json", "w"), indent=1)
PY
fi
finish
