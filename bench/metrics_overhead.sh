#!/usr/bin/env bash
# Metrics overhead: router throughput with its Prometheus metrics on vs off
# (`tandem-router --disable-metrics`), in one run.
#   [PROMPTS=N] [CONCURRENCY=N] [CONTROL=1] bench/metrics_overhead.sh [BUILD_DIR] [OUT_JSON] [ROUNDS] [MODEL]
# CONTROL=1 runs the same with metrics off on both clusters (an A/A run): how far apart
# two identical setups measure on this machine, the noise floor of the comparison.
# Two identical local clusters (router, one prefill and one decode replica, no kvstore):
# A with metrics on, B with --disable-metrics. Rounds drive `tandem bench` (closed loop,
# --max-concurrency streams) at one cluster, then the other, alternating which goes first
# (A B, B A, ...), so machine noise and warm-up hit both alike; the idle cluster only
# heartbeats meanwhile. Many short rounds average the noise of a shared machine better
# than a few long ones (the throughput of such a cluster moves by 10-30 % between runs of
# the same configuration, on 2 shared cores and on 16 idle ones alike). While A is measured, a scraper reads A's router /metrics every
# second (what Prometheus does with deploy/prometheus/prometheus.yml), so the cost of
# serving the exposition is included. Reported: the median over rounds of each side's
# request and output-token throughput and TTFT p50/p99, the ratio on/off of the medians,
# and the median of the per-round ratios. Goal: throughput with metrics within 5% of
# without. The workers, not the router, bound the throughput of such a cluster, and on a
# shared machine other load moves it by more than 5 % between rounds; so the script also
# reports the router's own CPU time per request (utime + stime from /proc, read around
# each round), which is what the metrics cost and what bounds a router's throughput
# when it is the bottleneck; and, when BUILD_DIR/bin/router_metrics_bench exists, the
# metrics' own CPU cost (one request's observations, one scrape, one dashboard sample,
# bench/router_metrics_bench.cc) per request at the measured throughput, as a fraction
# of the router's CPU time per request.
set -euo pipefail
build="${1:-build}"
out="${2:-$build/metrics_overhead.json}"
rounds="${3:-10}"
model="${4:-tiny}"
bin="$build/bin"
run="$(mktemp -d /tmp/tandem-metrics-overhead.XXXXXX)"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
conc="${CONCURRENCY:-16}"
prompts="${PROMPTS:-400}"  # per round and side
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT
start_cluster() {  # NAME [extra serve-local flags...]
  local name=$1; shift
  mkdir -p "$run/$name"
  "$bin/tandem" serve-local --model "$model" --prefill 1 --decode 1 --kvstore 0 --threads 1 --listen 127.0.0.1:0 \
    --run-dir "$run/$name" --ready-file "$run/$name/cluster.json" "$@" >/dev/null 2>"$run/$name/serve.err" &
  pids+=($!)
}
if [ "${CONTROL:-0}" = 1 ]; then
  start_cluster on --router-arg=--disable-metrics  # "on" in name only: the A/A control
else
  start_cluster on
fi
start_cluster off --router-arg=--disable-metrics
for name in on off; do
  for _ in $(seq 600); do [ -f "$run/$name/cluster.json" ] && break; sleep 0.2; done
  [ -f "$run/$name/cluster.json" ] || { echo "cluster $name did not start:" >&2; cat "$run/$name/serve.err" >&2; exit 1; }
done
addr() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["'"$2"'"])' "$run/$1/cluster.json"; }
on_grpc=$(addr on grpc); off_grpc=$(addr off grpc); on_admin=$(addr on admin)
router_pid() { python3 -c 'import json,sys; print([p["pid"] for p in json.load(open(sys.argv[1]))["processes"] if p["role"]=="router"][0])' "$run/$1/cluster.json"; }
on_pid=$(router_pid on); off_pid=$(router_pid off)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
bench() {  # NAME ROUND
  local name=$1 r=$2 a
  a=$on_grpc; [ "$name" = off ] && a=$off_grpc
  local scraper=""
  if [ "$name" = on ]; then
    # One long-lived process, as Prometheus is (a curl per scrape would cost a fork and
    # exec a second on this machine's cores, which the router does not).
    python3 -c 'import sys, time, urllib.request
while True:
    try: urllib.request.urlopen(sys.argv[1], timeout=5).read()
    except OSError: pass
    time.sleep(1)' "http://$on_admin/metrics" &
    scraper=$!
  fi
  local pid=$on_pid; [ "$name" = off ] && pid=$off_pid
  local before; before=$(cpu_ticks "$pid")
  "$bin/tandem" bench --addr "$a" --num-prompts $prompts --max-concurrency $conc --request-rate inf \
    --input-len 64 --output-len 16 --ignore-eos --num-warmup 4 --seed "$r" --no-progress \
    --json "$run/$name.$r.json" >/dev/null
  echo $(( $(cpu_ticks "$pid") - before )) >"$run/$name.$r.cpu"
  if [ -n "$scraper" ]; then kill "$scraper"; wait "$scraper" 2>/dev/null || true; fi
}
if [ -x "$bin/router_metrics_bench" ]; then
  "$bin/router_metrics_bench" --benchmark_min_time=0.5 --benchmark_format=json >"$run/micro.json" 2>/dev/null || true
fi
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then bench on "$r"; bench off "$r"; else bench off "$r"; bench on "$r"; fi
  echo "round $r/$rounds done" >&2
done
python3 - "$run" "$out" "$rounds" "$conc" "$prompts" "$(getconf CLK_TCK)" "$model" "$(nproc)" "${CONTROL:-0}" <<'PY'
import json, statistics, sys
run, out, rounds, conc, prompts, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
model, cpus, control = sys.argv[7], int(sys.argv[8]), sys.argv[9] == "1"
med = statistics.median
res = {"benchmark": "metrics_overhead" + ("_control_metrics_off_on_both" if control else ""),
       "reference": "the same cluster setup with tandem-router --disable-metrics, measured in the same run",
       "setup": {"rounds": rounds, "max_concurrency": conc, "num_prompts": prompts, "input_len": 64,
                 "output_len": 16, "model": model, "cpus": cpus,
                 "cluster": "serve-local --prefill 1 --decode 1 --kvstore 0 --threads 1",
                 "scrape_interval_s_metrics_on": 1},
       "rounds": []}
side = {}
for name in ("on", "off"):
    rs = [json.load(open(f"{run}/{name}.{r}.json"))["result"] for r in range(1, rounds + 1)]
    for r, x in enumerate(rs, 1):
        # Router CPU per request: the warm-up requests ran inside the window too.
        x["router_cpu_ms_per_request"] = int(open(f"{run}/{name}.{r}.cpu").read()) * 1000.0 / hz / (x["completed"] + 4)
    side[name] = rs
    res["metrics_" + name] = {
        "request_throughput": med(x["request_throughput"] for x in rs),
        "output_throughput": med(x["output_throughput"] for x in rs),
        "ttft_p50_ms": med(x["ttft_ms"]["median"] for x in rs),
        "ttft_p99_ms": med(x["ttft_ms"]["p99"] for x in rs),
        "router_cpu_ms_per_request": med(x["router_cpu_ms_per_request"] for x in rs),
        "failed": sum(x["failed"] for x in rs)}
for r in range(rounds):
    on, off = side["on"][r], side["off"][r]
    res["rounds"].append({"round": r + 1, "first": "on" if r % 2 == 0 else "off",
                          "request_throughput_on": on["request_throughput"],
                          "request_throughput_off": off["request_throughput"],
                          "ratio": on["request_throughput"] / off["request_throughput"],
                          "router_cpu_ms_per_request_on": on["router_cpu_ms_per_request"],
                          "router_cpu_ms_per_request_off": off["router_cpu_ms_per_request"]})
res["throughput_ratio_on_over_off"] = res["metrics_on"]["request_throughput"] / res["metrics_off"]["request_throughput"]
res["median_round_ratio"] = med(x["ratio"] for x in res["rounds"])
res["within_5_percent"] = abs(res["throughput_ratio_on_over_off"] - 1) <= 0.05
# The router's capacity if it were the bottleneck (requests per CPU-second), on / off.
res["router_cpu_ratio_on_over_off"] = (res["metrics_on"]["router_cpu_ms_per_request"]
                                       / res["metrics_off"]["router_cpu_ms_per_request"])
res["router_capacity_ratio_on_over_off"] = 1 / res["router_cpu_ratio_on_over_off"]
try:
    micro = {b["name"]: b["cpu_time"] / 1e3 for b in json.load(open(f"{run}/micro.json"))["benchmarks"]}  # us
    per_req = micro["BM_RequestObservations/16"]
    per_s = micro["BM_Scrape"] + micro["BM_HistorySample"]  # one scrape (1 s interval) and one sample a second
    est = per_req + per_s / res["metrics_on"]["request_throughput"]
    res["metrics_cpu"] = {"request_observations_us": per_req, "scrape_us": micro["BM_Scrape"],
                          "history_sample_us": micro["BM_HistorySample"],
                          "us_per_request_at_measured_throughput": est,
                          "fraction_of_router_cpu_per_request": est / (1e3 * res["metrics_off"]["router_cpu_ms_per_request"])}
except (OSError, KeyError, ValueError):
    pass
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
PY
