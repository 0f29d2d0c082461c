#!/usr/bin/env bash
# The OpenAI-compatible HTTP API's overhead: TTFT through POST /v1/completions vs gRPC
# Generate on the same serve-local cluster and load, in one run per setting
# (`tandem bench --compare-backends grpc,openai-completions`, rounds alternating the
# order), at concurrency 1 and 4, each run RUNS times.
#   bench/http_overhead.sh [BUILD_DIR] [OUT_DIR]     (MODEL=DIR|tiny, RUNS=3)
# BUILD_DIR/bin holds the binaries (scripts/device/pack.sh's .carry/device works too).
# OUT_DIR gets one tandem bench JSON per run and summary.json (per setting: each run's
# TTFT p50 difference and its median over runs).
set -euo pipefail
build="${1:-build}"
out="${2:-$build/http_overhead}"
bin="$build/bin"
mkdir -p "$out"
run="$(mktemp -d /tmp/tandem-http-overhead.XXXXXX)"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
"$bin/tandem" serve-local --model "${MODEL:-tiny}" --threads 1 --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
  --run-dir "$run" --ready-file "$run/cluster.json" >/dev/null 2>"$run/serve.err" &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 600); do [ -f "$run/cluster.json" ] && break; sleep 0.2; done
read -r grpc http < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["router"]; print(r["grpc"], r["http"])' "$run/cluster.json")
for r in $(seq "${RUNS:-3}"); do
  for setting in "1 400 20" "4 200 10"; do
    read -r conc n rounds <<<"$setting"
    "$bin/tandem" bench --compare-backends grpc,openai-completions --addr "$grpc" --base-url "http://$http/v1" \
      --num-prompts "$n" --max-concurrency "$conc" --input-len 32 --output-len 16 --ignore-eos \
      --compare-rounds "$rounds" --no-progress --json "$out/c${conc}_${n}_run$r.json" >/dev/null
  done
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
summary = {"benchmark": "http_overhead", "reference": "gRPC Generate on the same cluster, same run", "settings": []}
for conc in (1, 4):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/c{conc}_*_run*.json"))]
    diffs = [j["comparison"][0]["ttft_p50_diff_ms"] for j in runs]
    summary["settings"].append({"concurrency": conc, "runs": len(runs), "ttft_p50_diff_ms": diffs,
                                "median_ttft_p50_diff_ms": statistics.median(diffs),
                                "failed": sum(r["failed"] for j in runs for r in j["results"].values())})
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
