#!/usr/bin/python3
"""Soak: a local Tandem cluster under steady load, random cancels and kill -9, for an hour.

Starts `tandem serve-local --prefill 2 --decode 2 --kvstore 1` on the CPU (tiny model),
sends requests at a steady rate (a fixed interval, not bursts) from a pool of prompts, half
greedy and half seeded top-p sampling, cancels a random fraction of them mid-stream, and
every --kill-every seconds kills a random replica (prefill, decode or kvstore) with SIGKILL;
serve-local restarts it. It records:

- requests: sent, completed, cancelled by the client, retried, and lost. A request that
  fails is retried by the client (the whole request, after the server's retry hint) up to
  --max-attempts; "lost" is a request that never completed although the client did not
  cancel it, or whose stream ended OK without a finish reason. Goal: 0 lost.
- exactness: every completed output against an undisturbed reference of the same prompt,
  sampling and seed, computed first by this script with `tandem generate --local` (the
  engine in one process, nothing else running). Mismatches are reported with the request,
  its attempts and the kills near it, never hidden. Goal: 0 mismatches.
- KV in use when idle: after the load stops, every worker's
  tandem_kv_cache_blocks{state="used"} until it reads 0 (or --idle-timeout). Goal: 0.
- RSS of every process (router, each replica, serve-local) every --rss-every seconds, and
  per process (per pid: a restarted replica starts a new series) the growth after warm-up
  as a least-squares slope, of the whole RSS and of its parts (anonymous, file, shared
  memory) and of the process's own memory (RSS less shared memory: a prefill replica's RSS
  also counts the pages of the decode replicas' KV pools it has written into, UCX shared
  memory, which enter it block by block as the pools' blocks are first used). Goal: under
  1 MiB per 10 minutes, both figures reported.

Writes one JSON file (--json) with the configuration, the machine, every figure and the
goals, and prints a summary. Exit status: 0 when every goal is met, 1 when one is not, 2 when
the soak could not run. Not a CI test: it runs for --duration seconds (default 3600).

  bench/soak/soak.py [--bin-dir build/bin] [--duration 3600] [--kill-every 600] [--rate 2]
                     [--json docs/benchmarks/soak_cpu_2core.json]

Needs /usr/bin/python3 with Debian's python3-grpcio and protoc with grpc_python_plugin (the
stubs are generated into a temporary directory). If the cluster's public port requires
credentials (TLS, API keys), pass --tls-ca and --api-key.
"""
import argparse
import concurrent.futures
import json
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ("river stone lantern orbit meadow copper signal harbor violet engine summit canyon "
         "ember glacier quartz falcon willow beacon cedar marble tunnel prism delta nectar").split()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--duration", type=float, default=3600, help="seconds of load (default 3600)")
    p.add_argument("--kill-every", type=float, default=600, help="seconds between kill -9s (default 600)")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second, evenly spaced (default 2)")
    p.add_argument("--cancel-fraction", type=float, default=0.05, help="requests the client cancels mid-stream")
    p.add_argument("--cancel-window", type=float, default=0.3,
                   help="a cancelled request is cancelled a uniform 0..this many seconds after it is sent")
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts (each greedy and seeded)")
    p.add_argument("--prompt-words", type=int, default=100,
                   help="words per prompt (about a token each: 100 gives one full KV block and part of a second)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="of the seeded requests")
    p.add_argument("--top-p", type=float, default=0.95, help="of the seeded requests")
    p.add_argument("--max-attempts", type=int, default=6, help="tries per request, the first included")
    p.add_argument("--request-timeout", type=float, default=120, help="deadline per attempt, seconds")
    p.add_argument("--rss-every", type=float, default=60, help="seconds between RSS samples (default 60)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of RSS left out of the growth figures (default: min(300, duration / 4))")
    p.add_argument("--idle-timeout", type=float, default=90,
                   help="how long to wait for KV in use to reach 0 after the load (leases expire in 30 s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    p.add_argument("--serve-local-arg", action="append", default=[], help="extra serve-local flag (repeatable)")
    p.add_argument("--tls-ca", default="", help="PEM root certificate for a TLS public port")
    p.add_argument("--api-key", default="", help="sent as authorization: Bearer KEY")
    p.add_argument("--seed", type=int, default=1, help="the script's own randomness (prompts, cancels, kills)")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--label", default="", help="a note stored in the JSON (e.g. 'short verification run')")
    p.add_argument("--keep-run-dir", action="store_true", help="keep the cluster's logs")
    a = p.parse_args()
    if a.warmup is None:
        a.warmup = min(300.0, a.duration / 4)
    return a


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_stubs(tmp):
    """Python stubs of proto/tandem/v1 into tmp (what tests/integration does at build time)."""
    plugin = shutil.which("grpc_python_plugin") or "/usr/bin/grpc_python_plugin"
    os.makedirs(tmp, exist_ok=True)
    protos = [os.path.join("tandem", "v1", f) for f in ("generation.proto", "internal.proto", "kvstore.proto")]
    subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), f"--python_out={tmp}", f"--grpc_out={tmp}",
                    f"--plugin=protoc-gen-grpc={plugin}"] + protos, check=True)
    sys.path.insert(0, tmp)


def make_workload(a):
    rng = random.Random(a.seed)
    prompts = []
    for i in range(a.prompts):
        words = [rng.choice(WORDS) for _ in range(a.prompt_words)]
        prompts.append(f"Soak prompt {i}: " + " ".join(words))
    # One variant per (prompt, mode): greedy, or seeded top-p with a seed of its own.
    variants = []
    for i, text in enumerate(prompts):
        variants.append({"prompt": i, "text": text, "mode": "greedy", "temperature": 0.0, "top_p": 1.0,
                         "seed": 0})
        variants.append({"prompt": i, "text": text, "mode": "seeded", "temperature": a.temperature,
                         "top_p": a.top_p, "seed": 1000 + i})
    return variants


def reference_outputs(a, variants):
    """Each variant's text from `tandem generate --local`: the undisturbed engine."""
    tandem = os.path.join(a.bin_dir, "tandem")

    def one(v):
        argv = [tandem, "generate", "--local", "--model", "tiny", "--threads", "1", "--ignore-eos",
                "--max-tokens", str(a.max_tokens), "--temperature", str(v["temperature"]),
                "--top-p", str(v["top_p"]), "--seed", str(v["seed"]), v["text"]]
        # Bytes, not text mode: universal newlines would turn a generated "\r" into "\n".
        r = subprocess.run(argv, capture_output=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"reference for prompt {v['prompt']} ({v['mode']}) failed: "
                               f"{r.stderr.decode(errors='replace')[-2000:]}")
        out = r.stdout[:-1] if r.stdout.endswith(b"\n") else r.stdout
        return out.decode("utf-8", errors="replace")

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, variants))


class Cluster:
    """tandem serve-local and a view of its processes through /proc and the ready files."""

    def __init__(self, a, run_dir):
        self.run_dir = run_dir
        self.ready_file = os.path.join(run_dir, "cluster.json")
        argv = [os.path.join(a.bin_dir, "tandem"), "serve-local", "--prefill", "2", "--decode", "2", "--kvstore", "1",
                "--model", "tiny", "--device", "cpu", "--threads", str(a.threads), "--listen", "127.0.0.1:0",
                "--ready-file", self.ready_file, "--run-dir", os.path.join(run_dir, "cluster")] + a.serve_local_arg
        self.log_path = os.path.join(run_dir, "serve-local.log")
        self.proc = subprocess.Popen(argv, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + 300
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("serve-local did not start:\n" + open(self.log_path).read()[-4000:])
            time.sleep(0.2)
        time.sleep(0.2)
        ready = json.load(open(self.ready_file))
        self.router = ready["router"]["grpc"]
        self.names = [p["name"] for p in ready["processes"]]

    def pids(self):
        """name -> pid of the live children of serve-local (found by their --ready-file)."""
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            for i, arg in enumerate(argv[:-1]):
                if arg == b"--ready-file":
                    name = os.path.basename(argv[i + 1].decode()).removesuffix(".ready.json")
                    out[name] = int(d)
        return out

    def admin(self, name):
        try:
            with open(os.path.join(self.run_dir, "cluster", name + ".ready.json")) as f:
                return json.load(f).get("admin", "")
        except (OSError, ValueError):
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def rss_kib(pid):
    """VmRSS of a process and its parts (anonymous, file-backed, shared memory), in KiB;
    None when the process is gone. Shared memory counts the pages of peers' mappings a
    process has touched (UCX's shared-memory transport maps the decode replicas' KV)."""
    parts = {"VmRSS:": "rss_kib", "RssAnon:": "anon_kib", "RssFile:": "file_kib", "RssShmem:": "shmem_kib"}
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0] + ":"
                if key in parts:
                    out[parts[key]] = int(line.split()[1])
    except OSError:
        return None
    return out if "rss_kib" in out else None


def kv_used_blocks(admin):
    """tandem_kv_cache_blocks{state="used"} of a worker, or None when unreadable."""
    if not admin:
        return None
    try:
        text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith("tandem_kv_cache_blocks{") and 'state="used"' in line:
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def slope_kib_per_10min(samples):
    """Least-squares slope of [(t_s, kib)] in KiB per 600 s."""
    n = len(samples)
    if n < 3:
        return None
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    if den == 0:
        return None
    return 600.0 * sum((t - mt) * (v - mv) for t, v in samples) / den


class Load:
    """Steady-rate requests with client retries and random cancels."""

    def __init__(self, a, stub_mod, channel, variants, references, t0):
        self.a, self.g, self.t0 = a, stub_mod, t0
        self.stub = stub_mod.generation_pb2_grpc.GenerationStub(channel)
        self.variants, self.references = variants, references
        self.rng = random.Random(a.seed + 1)
        self.lock = threading.Lock()
        self.records = []
        self.in_flight = 0

    def request(self, n, v, cancel_after):
        import grpc
        g = self.g.generation_pb2
        rec = {"n": n, "prompt": v["prompt"], "mode": v["mode"], "sent_s": round(time.time() - self.t0, 3),
               "attempts": [], "outcome": None, "cancel_after_s": cancel_after}
        metadata = [("authorization", f"Bearer {self.a.api_key}")] if self.a.api_key else None
        req = g.GenerateRequest(
            text=v["text"],
            sampling=g.SamplingParams(temperature=v["temperature"], top_p=v["top_p"], seed=v["seed"]),
            stop=g.StopConditions(max_tokens=self.a.max_tokens, ignore_eos=True))
        for attempt in range(self.a.max_attempts):
            text, tokens, final, cancelled, pushback = "", 0, None, threading.Event(), None
            call = self.stub.Generate(req, timeout=self.a.request_timeout, metadata=metadata)
            timer = None
            if cancel_after is not None:
                def cancel(call=call, cancelled=cancelled):
                    cancelled.set()
                    call.cancel()
                timer = threading.Timer(cancel_after, cancel)
                timer.start()
            started = time.time()
            try:
                for msg in call:
                    text += msg.text
                    tokens += len(msg.token_ids)
                    if msg.finish_reason:
                        final = msg
                code, details = "OK", ""
            except grpc.RpcError as e:
                code, details = e.code().name, (e.details() or "")[:300]
                pushback = dict(e.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
            finally:
                if timer is not None:
                    timer.cancel()
            rec["attempts"].append({"code": code, "details": details, "tokens": tokens,
                                    "s": round(time.time() - started, 3)})
            if cancelled.is_set() and code == "CANCELLED":
                rec["outcome"] = "cancelled"
                break
            if code == "OK":
                if final is None:
                    rec["outcome"] = "lost"
                    rec["why"] = "stream ended OK without a finish reason"
                else:
                    ref = self.references[self.variants.index(v)]
                    rec["outcome"] = "completed"
                    rec["exact"] = text == ref
                    rec["completion_tokens"] = final.usage.completion_tokens
                    rec["tokens"] = tokens
                    if not rec["exact"]:
                        rec["text"], rec["reference"] = text, ref
                break
            if code == "INVALID_ARGUMENT":
                rec["outcome"] = "lost"
                rec["why"] = "INVALID_ARGUMENT: " + details
                break
            # A clear status: retry after the server's hint (or a short backoff).
            hint = int(pushback) / 1000.0 if pushback and str(pushback).isdigit() else 0.2 * (attempt + 1)
            time.sleep(min(5.0, hint))
            cancel_after = None  # the client's cancel applies to the first try only
        if rec["outcome"] is None:
            rec["outcome"] = "lost"
            rec["why"] = f"failed {self.a.max_attempts} attempts"
        with self.lock:
            self.records.append(rec)
            self.in_flight -= 1

    def run(self, pool, stop_at):
        n = 0
        next_t = time.time()
        futures = []
        while time.time() < stop_at:
            v = self.rng.choice(self.variants)
            cancel_after = (self.rng.uniform(0.0, self.a.cancel_window)
                            if self.rng.random() < self.a.cancel_fraction else None)
            with self.lock:
                self.in_flight += 1
            futures.append(pool.submit(self.request, n, v, cancel_after))
            n += 1
            next_t += 1.0 / self.a.rate
            time.sleep(max(0.0, next_t - time.time()))
        return futures


def main():
    a = parse_args()
    for b in ("tandem", "tandem-router", "tandem-prefill", "tandem-decode", "tandem-kvstore"):
        if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
            print(f"soak: {b} not found in {a.bin_dir} (build first: scripts/build.sh)", file=sys.stderr)
            return 2
    tmp = tempfile.mkdtemp(prefix="tandem-soak-")
    make_stubs(os.path.join(tmp, "stubs"))
    import grpc
    import tandem.v1.generation_pb2  # noqa: F401
    import tandem.v1.generation_pb2_grpc  # noqa: F401
    stub_mod = sys.modules["tandem.v1"]

    variants = make_workload(a)
    log(f"computing {len(variants)} undisturbed references with tandem generate --local ...")
    t_ref = time.time()
    references = reference_outputs(a, variants)
    log(f"references done in {time.time() - t_ref:.0f} s")

    cluster = Cluster(a, tmp)
    log(f"cluster up: router {cluster.router}, processes {cluster.names}")
    if a.tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=open(a.tls_ca, "rb").read())
        channel = grpc.secure_channel(cluster.router, creds)
    else:
        channel = grpc.insecure_channel(cluster.router)

    t0 = time.time()
    stop_at = t0 + a.duration
    load = Load(a, stub_mod, channel, variants, references, t0)
    kills, rss, kv_samples = [], [], []
    replicas = [n for n in cluster.names if n != "router"]
    rng = random.Random(a.seed + 2)
    stop_event = threading.Event()

    def watcher():
        next_rss, next_kill = t0, t0 + a.kill_every
        while not stop_event.is_set():
            now = time.time()
            if now >= next_rss:
                pids = cluster.pids()
                pids["serve-local"] = cluster.proc.pid
                for name, pid in sorted(pids.items()):
                    kib = rss_kib(pid)
                    if kib is not None:
                        rss.append({"t_s": round(now - t0, 1), "name": name, "pid": pid, **kib})
                kv = {n: kv_used_blocks(cluster.admin(n)) for n in replicas if n.startswith(("prefill", "decode"))}
                kv_samples.append({"t_s": round(now - t0, 1), "kv_used_blocks": kv, "in_flight": load.in_flight})
                next_rss += a.rss_every
            if now >= next_kill and now < stop_at:
                name = rng.choice(replicas)
                pid = cluster.pids().get(name)
                entry = {"t_s": round(now - t0, 1), "name": name, "pid": pid, "in_flight": load.in_flight}
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    log(f"kill -9 {name} (pid {pid}), {load.in_flight} requests in flight")
                    # Back when a new process of that name has written its ready file.
                    deadline = time.time() + 120
                    while time.time() < deadline and not stop_event.is_set():
                        new = cluster.pids().get(name)
                        if new and new != pid and cluster.admin(name):
                            entry["new_pid"] = new
                            entry["back_after_s"] = round(time.time() - now, 2)
                            break
                        time.sleep(0.1)
                    if "new_pid" not in entry:
                        log(f"{name} did not come back within 120 s")
                kills.append(entry)
                next_kill += a.kill_every
            time.sleep(0.2)

    w = threading.Thread(target=watcher, daemon=True)
    w.start()
    log(f"load: {a.rate} req/s for {a.duration:.0f} s, kill -9 every {a.kill_every:.0f} s, "
        f"{a.cancel_fraction:.0%} cancelled")
    with concurrent.futures.ThreadPoolExecutor(max_workers=256) as pool:
        futures = load.run(pool, stop_at)
        log(f"load stopped after {len(futures)} requests; waiting for the last ones ...")
        concurrent.futures.wait(futures)
    stop_event.set()
    w.join()
    t_load_end = time.time()

    # KV in use when idle: every worker back to 0 used blocks (abandoned leases expire).
    idle = {"first_read": None, "final": None, "seconds_to_zero": None}
    deadline = time.time() + a.idle_timeout
    while True:
        kv = {n: kv_used_blocks(cluster.admin(n)) for n in replicas if n.startswith(("prefill", "decode"))}
        if idle["first_read"] is None:
            idle["first_read"] = kv
        idle["final"] = kv
        if all(v == 0 for v in kv.values()):
            idle["seconds_to_zero"] = round(time.time() - t_load_end, 1)
            break
        if time.time() > deadline:
            break
        time.sleep(1)
    pids = cluster.pids()
    pids["serve-local"] = cluster.proc.pid
    for name, pid in sorted(pids.items()):
        kib = rss_kib(pid)
        if kib is not None:
            rss.append({"t_s": round(time.time() - t0, 1), "name": name, "pid": pid, **kib})
    restarts = open(cluster.log_path).read().count("restarting in")
    cluster_rc = cluster.stop()

    # Figures.
    recs = sorted(load.records, key=lambda r: r["n"])
    done = [r for r in recs if r["outcome"] == "completed"]
    lost = [r for r in recs if r["outcome"] == "lost"]
    cancelled = [r for r in recs if r["outcome"] == "cancelled"]
    retried = [r for r in recs if len(r["attempts"]) > 1]
    mismatched = [r for r in done if not r["exact"]]
    codes = {}
    for r in recs:
        for at in r["attempts"]:
            codes[at["code"]] = codes.get(at["code"], 0) + 1

    def near_kill(r):
        return any(k["t_s"] - 30 <= r["sent_s"] <= k["t_s"] + 30 for k in kills)

    by_mode = {}
    for mode in ("greedy", "seeded"):
        m = [r for r in done if r["mode"] == mode]
        by_mode[mode] = {"completed": len(m), "exact": sum(r["exact"] for r in m),
                         "mismatched": sum(not r["exact"] for r in m),
                         "mismatched_retried": sum((not r["exact"]) and len(r["attempts"]) > 1 for r in m)}
    usage_mismatch = [r for r in done if r.get("completion_tokens") != a.max_tokens or r.get("tokens") != a.max_tokens]

    growth = []
    series = {}
    for s in rss:
        series.setdefault((s["name"], s["pid"]), []).append(s)
    for (name, pid), samples in sorted(series.items()):
        start = samples[0]["t_s"]
        # A restarted replica warms up as long as the first ones (it pages in code and
        # weights the first time each path runs: seen as one step minutes after a restart).
        after = [x for x in samples if x["t_s"] >= start + a.warmup]
        slope = slope_kib_per_10min([(x["t_s"], x["rss_kib"]) for x in after])
        entry = {"name": name, "pid": pid, "samples": len(samples), "samples_after_warmup": len(after),
                 "first_kib": samples[0]["rss_kib"], "last_kib": samples[-1]["rss_kib"],
                 "growth_kib_per_10min": None if slope is None else round(slope, 1)}
        # The same slope per part, to tell heap growth from touched shared pages.
        for part in ("anon_kib", "file_kib", "shmem_kib"):
            pts = [(x["t_s"], x[part]) for x in after if part in x]
            ps = slope_kib_per_10min(pts)
            entry[part.replace("_kib", "") + "_growth_kib_per_10min"] = None if ps is None else round(ps, 1)
        # The process's own memory: RSS less the shared pages it has touched (a prefill
        # replica maps the decode replicas' KV pools, UCX shared memory, and each block it
        # first writes there enters its RSS; those pages are the decode's, bounded by its
        # pool, and counted in the decode's RSS too).
        own = [(x["t_s"], x["rss_kib"] - x.get("shmem_kib", 0)) for x in after]
        os_ = slope_kib_per_10min(own)
        entry["own_growth_kib_per_10min"] = None if os_ is None else round(os_, 1)
        growth.append(entry)
    measured = [x for x in growth if x["growth_kib_per_10min"] is not None]
    worst = max((x["growth_kib_per_10min"] for x in measured), default=None)
    worst_own = max((x["own_growth_kib_per_10min"] for x in measured if x.get("own_growth_kib_per_10min") is not None),
                    default=None)
    idle_zero = idle["seconds_to_zero"] is not None

    goals = {
        "lost_requests_0": len(lost) == 0,
        "exact_outputs": len(mismatched) == 0,
        "usage_completion_tokens_exact": len(usage_mismatch) == 0,
        "kv_in_use_when_idle_0": idle_zero,
        "own_rss_growth_under_1MiB_per_10min": (worst_own is not None and worst_own < 1024),
    }
    result = {
        "benchmark": "soak",
        "label": a.label,
        "command": shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "machine": {"nproc": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                    "note": "shared machine: other builds and tests may run beside the soak"},
        "config": {k: v for k, v in vars(a).items() if k not in ("api_key",)},
        "cluster": {"processes": cluster.names, "serve_local_exit": cluster_rc, "restarts_logged": restarts},
        "duration_s": round(t_load_end - t0, 1),
        "requests": {"sent": len(recs), "completed": len(done), "cancelled_by_client": len(cancelled),
                     "retried": len(retried), "completed_after_retry": sum(len(r["attempts"]) > 1 for r in done),
                     "lost": len(lost), "attempt_status_codes": codes},
        "exactness": {"compared": len(done), "exact": len(done) - len(mismatched), "mismatched": len(mismatched),
                      "by_mode": by_mode,
                      "mismatched_within_30s_of_a_kill": sum(near_kill(r) for r in mismatched),
                      "completion_tokens_wrong": len(usage_mismatch),
                      "reference": "tandem generate --local, same prompt, sampling and seed"},
        "kills": kills,
        "kv_in_use_when_idle": idle,
        "kv_used_blocks_samples": kv_samples,
        "rss_growth": growth,
        "rss_worst_growth_kib_per_10min": worst,
        "rss_worst_own_growth_kib_per_10min": worst_own,
        # Reported, not a goal: it counts the shared pages above.
        "rss_total_growth_under_1MiB_per_10min": (worst is not None and worst < 1024),
        "rss_samples": rss,
        "goals": goals,
        "lost_examples": lost[:20],
        "mismatch_examples": mismatched[:20],
        "usage_mismatch_examples": usage_mismatch[:10],
    }
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    summary = {k: result[k] for k in ("duration_s", "requests")}
    summary["exactness"] = {k: v for k, v in result["exactness"].items() if k != "reference"}
    summary["kills"] = [(k["name"], k.get("back_after_s")) for k in kills]
    summary["kv_in_use_when_idle"] = idle
    summary["rss_worst_growth_kib_per_10min"] = worst
    summary["rss_worst_own_growth_kib_per_10min"] = worst_own
    summary["goals"] = goals
    print(json.dumps(summary, indent=1))
    if a.keep_run_dir:
        log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
