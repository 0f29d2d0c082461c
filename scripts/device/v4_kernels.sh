#!/usr/bin/env bash
# DeepSeek-V4's CUDA kernels written so far (issue 22), in one device run: each kernel's
# test against the CPU engine's arithmetic, then the same under compute-sanitizer memcheck.
#   Here:  scripts/device/pack.sh build/tests/kernels_cuda_hyper_connections_test \
#            build/tests/kernels_cuda_v4_moe_routing_test build/tests/kernels_cuda_sink_attention_test \
#            build/tests/kernels_cuda_v4_ops_test &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/v4_kernels.sh   (run tool: carry .carry/device.tgz; logs under $OUT)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -d "$root/.carry/device" ] || tar -xzf "$root/.carry/device.tgz" -C "$root/.carry"
export LD_LIBRARY_PATH="$root/.carry/device/lib"
bin="$root/.carry/device/bin"
# shellcheck source=check.sh
source "$root/scripts/device/check.sh"
for t in hyper_connections v4_moe_routing sink_attention v4_ops; do
  check "$t" "$bin/kernels_cuda_${t}_test"
  check "memcheck_$t" compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/kernels_cuda_${t}_test"
  expect_in "memcheck_$t" "ERROR SUMMARY: 0 errors"
done
finish
