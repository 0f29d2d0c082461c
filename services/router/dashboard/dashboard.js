// The router's live dashboard: polls /api/summary (the router's metrics history: TTFT and
// inter-token latency percentiles, token and request rates, each replica's load) and
// /replicas, and draws them with uPlot. No network beyond the router itself.
//
// Query parameters: interval_ms (poll period, default 1000), series (seconds of history
// charted, default 300), window (seconds the tiles summarize, default 30), step (seconds
// each chart point covers, default 10).
//
// <body data-ready="true"> once every chart has points (headless tests wait for it);
// each chart's element carries data-points (points with a value).
(function () {
  "use strict";

  const params = new URLSearchParams(window.location.search);
  const num = (name, dflt) => {
    const v = Number(params.get(name));
    return Number.isFinite(v) && v > 0 ? v : dflt;
  };
  const POLL_MS = num("interval_ms", 1000);
  const SERIES_S = num("series", 300);
  const WINDOW_S = num("window", 30);
  const STEP_S = num("step", 10);
  const PALETTE = ["#2f6fdf", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285", "#c2255c", "#5c940d",
                   "#364fc7", "#862e9c"];

  const fmtMs = (s) => (s == null ? "–" : s < 1 ? (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms" : s.toFixed(2) + " s");
  const fmtRate = (v) => (v == null ? "–" : v >= 1000 ? (v / 1000).toFixed(1) + "k" : v >= 10 ? v.toFixed(0) : v.toFixed(2));
  const fmtPct = (v) => (v == null ? "–" : (v * 100).toFixed(1) + " %");
  const fmtInt = (v) => (v == null ? "–" : String(Math.round(v)));
  const fmtCount = (v) => (v == null ? "–" : Number.isInteger(v) ? String(v) : v.toFixed(1));

  function setText(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  // One chart: a uPlot recreated when its set of series changes (replicas come and go).
  class Chart {
    constructor(id, title, format, opts) {
      this.el = document.getElementById(id);
      this.title = title;
      this.format = format;
      this.opts = opts || {};
      this.plot = null;
      this.key = "";
    }
    width() {
      return Math.max(300, this.el.clientWidth - 16);
    }
    // series: [{label, values}] aligned with t (unix seconds).
    update(t, series) {
      const key = series.map((s) => s.label).join("\u0000");
      const data = [t].concat(series.map((s) => s.values));
      if (this.plot === null || key !== this.key) {
        if (this.plot !== null) this.plot.destroy();
        this.key = key;
        const fmt = this.format;
        this.plot = new uPlot({
          title: this.title,
          width: this.width(),
          height: 240,
          scales: { x: { time: true }, y: { range: this.opts.range || ((u, min, max) => [0, max > 0 ? max * 1.1 : 1]) } },
          series: [{}].concat(series.map((s, i) => ({
            label: s.label,
            stroke: PALETTE[i % PALETTE.length],
            width: 1.5,
            spanGaps: false,
            dash: s.dash,
            value: (u, v) => fmt(v),
          }))),
          axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => fmt(v)) }],
        }, data, this.el);
      } else {
        this.plot.setData(data);
      }
      let points = 0;
      for (const s of series) points = Math.max(points, s.values.filter((v) => v != null).length);
      this.el.dataset.points = String(points);
      return points;
    }
    resize() {
      if (this.plot !== null) this.plot.setSize({ width: this.width(), height: 240 });
    }
  }

  const charts = {
    ttft: new Chart("chart-ttft", "Time to first token (router)", fmtMs),
    itl: new Chart("chart-itl", "Inter-token latency (router)", fmtMs),
    tokens: new Chart("chart-tokens", "Throughput: tokens/s", fmtRate),
    requests: new Chart("chart-requests", "Requests/s", fmtRate),
    queue: new Chart("chart-queue", "Queue per replica: waiting (dashed) and running", fmtCount),
    kv: new Chart("chart-kv", "KV cache usage per replica", fmtPct, { range: () => [0, 1] }),
  };
  window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.resize()));

  function shortId(id) {
    return id.length > 14 ? id.slice(0, 14) + "…" : id;
  }

  function render(summary) {
    if (summary.metrics_enabled === false) {
      setText("window-note", "The router runs with --disable-metrics: no latency or throughput history.");
      return false;
    }
    const s = summary.summary || {};
    setText("tile-ttft-p50", fmtMs(s.ttft_p50_s));
    setText("tile-ttft-p99", fmtMs(s.ttft_p99_s));
    setText("tile-itl-p50", fmtMs(s.itl_p50_s));
    setText("tile-prompt-tps", fmtRate(s.prompt_tokens_per_s));
    setText("tile-gen-tps", fmtRate(s.generation_tokens_per_s));
    setText("tile-rps", fmtRate(s.requests_per_s));
    setText("tile-cache", fmtPct(s.cache_hit_ratio));
    setText("tile-running", fmtInt(s.running));
    setText("window-note", `Tiles: the last ${summary.window_s} s. Charts: the last ${SERIES_S} s, each point over the ` +
      `${summary.step_s} s before it; percentiles interpolated within histogram buckets, as Prometheus does.`);

    const se = summary.series || {};
    const t = se.t || [];
    const counts = [];
    counts.push(charts.ttft.update(t, [
      { label: "p50", values: se.ttft_p50_s || [] },
      { label: "p90", values: se.ttft_p90_s || [] },
      { label: "p99", values: se.ttft_p99_s || [] },
    ]));
    counts.push(charts.itl.update(t, [
      { label: "p50", values: se.itl_p50_s || [] },
      { label: "p99", values: se.itl_p99_s || [] },
    ]));
    counts.push(charts.tokens.update(t, [
      { label: "prompt in", values: se.prompt_tokens_per_s || [] },
      { label: "generated out", values: se.generation_tokens_per_s || [] },
    ]));
    counts.push(charts.requests.update(t, [
      { label: "completed", values: se.requests_per_s || [] },
      { label: "failed", values: se.failed_per_s || [] },
      { label: "in flight", values: se.running || [] },
    ]));
    const replicas = summary.replicas || [];
    const queue = [];
    const kv = [];
    for (const r of replicas) {
      const name = `${r.role} ${shortId(r.id)}`;
      queue.push({ label: `${name} running`, values: r.running });
      queue.push({ label: `${name} waiting`, values: r.waiting, dash: [6, 4] });
      kv.push({ label: name, values: r.kv_usage });
    }
    counts.push(charts.queue.update(t, queue));
    counts.push(charts.kv.update(t, kv));
    return counts.every((n) => n >= 2);
  }

  function renderReplicas(list) {
    const body = document.querySelector("#replicas tbody");
    body.textContent = "";
    for (const r of list) {
      const tr = document.createElement("tr");
      const role = String(r.role || "").replace(/^ROLE_/, "").toLowerCase();
      const usage = Number(r.kv_usage) || 0;
      const cells = [r.id, role, r.state, r.grpc, r.admin, r.outstanding, r.running, r.waiting];
      cells.forEach((v, i) => {
        const td = document.createElement("td");
        td.textContent = v == null ? "" : String(v);
        if (i >= 5) td.className = "num";
        tr.appendChild(td);
      });
      const td = document.createElement("td");
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.style.width = Math.min(100, usage * 100).toFixed(1) + "%";
      bar.appendChild(fill);
      td.appendChild(bar);
      td.appendChild(document.createTextNode(fmtPct(usage)));
      tr.appendChild(td);
      body.appendChild(tr);
    }
    document.body.dataset.replicas = String(list.length);
  }

  // With --api-keys-file the router's data pages need a key: open the page as
  // /dashboard/#key=KEY (the fragment never leaves the browser); it is sent as a Bearer
  // header and kept for the tab's session.
  const keyMatch = /(?:^#|&)key=([^&]+)/.exec(window.location.hash);
  if (keyMatch) sessionStorage.setItem("tandem-api-key", decodeURIComponent(keyMatch[1]));
  const apiKey = sessionStorage.getItem("tandem-api-key");

  async function getJson(path) {
    const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
    const response = await fetch(path, { cache: "no-store", headers });
    if (response.status === 401) throw new Error(`${path}: this router needs an API key: open /dashboard/#key=KEY`);
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  let polls = 0;
  async function poll() {
    const status = document.getElementById("status");
    try {
      const [summary, replicas] = await Promise.all([
        getJson(`/api/summary?window=${WINDOW_S}&series=${SERIES_S}&step=${STEP_S}`),
        getJson("/replicas"),
      ]);
      const ready = render(summary);
      renderReplicas(replicas);
      polls += 1;
      document.body.dataset.polls = String(polls);
      if (ready) document.body.dataset.ready = "true";
      status.className = "status ok";
      status.textContent = `live · ${replicas.length} replicas · updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      status.className = "status bad";
      status.textContent = `cannot reach the router: ${e.message}`;
      document.body.dataset.error = e.message;
    } finally {
      window.setTimeout(poll, POLL_MS);
    }
  }

  if (typeof uPlot === "undefined") {
    document.getElementById("status").textContent = "uPlot.iife.min.js is missing: run scripts/install-deps.sh and rebuild";
    document.body.dataset.error = "uPlot missing";
    return;
  }
  poll();
})();
