#!/usr/bin/env bash
# Router overhead: TTFT through tandem-router vs calling the same aggregated worker's
# Generate directly (`--role both`), in one run, at 1 and at 256 concurrent streams.
#   bench/router_overhead.sh [BUILD_DIR] [OUT_JSON]     (MODEL=DIR|tiny, the served model)
# BUILD_DIR/bin holds the binaries (scripts/device/pack.sh's .carry/device works too).
# Rounds alternate router/direct so machine noise hits both alike; each figure is the
# median over rounds of the per-round p50/p99.
set -euo pipefail
build="${1:-build}"
out="${2:-$build/router_overhead.json}"
bin="$build/bin"
run="$(mktemp -d /tmp/tandem-router-overhead.XXXXXX)"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
"$bin/tandem" serve-local --model "${MODEL:-tiny}" --kvstore 0 --aggregated 1 --listen 127.0.0.1:0 --run-dir "$run" --ready-file "$run/cluster.json" \
  >/dev/null 2>"$run/serve.err" &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 600); do [ -f "$run/cluster.json" ] && break; sleep 0.2; done
router=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["grpc"])' "$run/cluster.json")
direct=$(python3 -c 'import json,sys; print([p["grpc"] for p in json.load(open(sys.argv[1]))["processes"] if p["role"]=="both"][0])' "$run/cluster.json")
# The worker's port is internal: the direct calls present serve-local's client certificate
# (mutual TLS, as the router's own calls to the worker do).
read -r ca cert key < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["security"]; print(s["ca"], s["client_cert"], s["client_key"])' "$run/cluster.json")
rounds=3
for conc in 1 256; do
  n=$(( conc == 1 ? 100 : 512 ))
  for r in $(seq $rounds); do
    for target in router direct; do
      creds=(); addr=$router
      [ "$target" = direct ] && { addr=$direct; creds=(--tls-ca "$ca" --tls-cert "$cert" --tls-key "$key"); }
      "$bin/tandem" bench --addr "$addr" "${creds[@]}" --num-prompts $n --max-concurrency $conc --request-rate inf \
        --input-len 32 --output-len 4 --ignore-eos --num-warmup 2 --no-progress \
        --json "$run/$target.$conc.$r.json" >/dev/null
    done
  done
done
python3 - "$run" "$out" "$rounds" <<'PY'
import json, statistics, sys
run, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = {"benchmark": "router_overhead", "reference": "direct Generate on the same --role both worker",
       "rounds": rounds, "results": []}
for conc in (1, 256):
    row = {"concurrency": conc}
    for target in ("router", "direct"):
        rs = [json.load(open(f"{run}/{target}.{conc}.{r}.json"))["result"] for r in range(1, rounds + 1)]
        row[target] = {"ttft_p50_ms": statistics.median(x["ttft_ms"]["median"] for x in rs),
                       "ttft_p99_ms": statistics.median(x["ttft_ms"]["p99"] for x in rs),
                       "request_throughput": statistics.median(x["request_throughput"] for x in rs)}
    row["added_p50_ms"] = row["router"]["ttft_p50_ms"] - row["direct"]["ttft_p50_ms"]
    row["added_p99_ms"] = row["router"]["ttft_p99_ms"] - row["direct"]["ttft_p99_ms"]
    row["throughput_ratio"] = row["router"]["request_throughput"] / row["direct"]["request_throughput"]
    res["results"].append(row)
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
PY
