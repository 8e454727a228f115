/* The tidebatch worker dashboard: polls /api/stats and draws, per pipeline,
 * throughput, p50/p99 latency against the SLO, mean batch size, queue depth and lag;
 * with tenant classes (a `tenants:` section), a table of each class's rate, goodput,
 * p99 against its SLA, share used / served and throttled rows (what `tidebatch status`
 * prints), and charts of p99 against each SLA, goodput and share used.
 * ?poll=MS sets the polling period (default 1000 ms).
 * Test hooks: body[data-polls] counts successful polls; each chart figure has
 * data-points.
 */
(function () {
  "use strict";
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(parseInt(params.get("poll") || "1000", 10) || 1000, 100);
  const C = { blue: "#2563eb", orange: "#ea580c", red: "#dc2626", green: "#16a34a", violet: "#7c3aed", teal: "#0d9488", grey: "#6b7280" };
  const PALETTE = [C.blue, C.orange, C.violet, C.teal, C.green, C.grey, C.red];
  const fmt = TinyChart.format;
  const sections = {};
  let polls = 0;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function section(name) {
    if (sections[name]) return sections[name];
    const root = el("section", "pipeline");
    root.dataset.pipeline = name;
    root.append(el("h2", null, "pipeline " + name));
    const kpis = el("div", "kpis");
    root.append(kpis);
    const grid = el("div", "grid");
    root.append(grid);
    document.getElementById("pipelines").append(root);
    const s = {
      kpis,
      throughput: new TinyChart(grid, { title: "Throughput", unit: "req/s", id: name + "-throughput" }),
      latency: new TinyChart(grid, { title: "End-to-end latency", unit: "ms", id: name + "-latency" }),
      batch: new TinyChart(grid, { title: "Mean batch size", unit: "rows", id: name + "-batch" }),
      queue: new TinyChart(grid, { title: "Queue depth", unit: "rows", id: name + "-queue", integer: true }),
      lag: new TinyChart(grid, { title: "Consumer lag", unit: "messages", id: name + "-lag", integer: true }),
    };
    s.grid = grid;
    sections[name] = s;
    return s;
  }

  function tenantPanels(s, name) {
    if (s.tenants) return s.tenants;
    const table = el("table", "tenants");
    table.id = name + "-tenants";
    s.grid.before(table);
    s.tenants = {
      table,
      p99: new TinyChart(s.grid, { title: "Tenant p99 against its SLA", unit: "ms", id: name + "-tenant-p99" }),
      goodput: new TinyChart(s.grid, { title: "Tenant goodput", unit: "%", id: name + "-tenant-goodput" }),
      share: new TinyChart(s.grid, { title: "Tenant share used", unit: "× share", id: name + "-tenant-share" }),
    };
    return s.tenants;
  }

  function pct(v) {
    return v === null || v === undefined ? "–" : (100 * v).toFixed(2) + " %";
  }

  function renderTenants(s, name, p, latest) {
    const classes = Object.keys(p.tenants || {}).sort();
    if (!classes.length) return;
    const tp = tenantPanels(s, name);
    const head = el("tr");
    for (const h of ["tenant class", "req/s", "goodput", "p99 / SLA", "share used / served", "throttled rows"]) head.append(el("th", null, h));
    const rows = [head];
    for (const x of latest || []) {
      const tr = el("tr");
      tr.dataset.tenantClass = x.tenant_class;
      const over = x.p99_ms !== null && x.slo_ms !== null && x.p99_ms > x.slo_ms;
      if (over) tr.className = "bad";
      tr.append(
        el("td", null, x.tenant_class),
        el("td", null, fmt(x.rate_rps)),
        el("td", null, pct(x.goodput)),
        el("td", null, fmt(x.p99_ms) + " / " + fmt(x.slo_ms) + " ms"),
        el("td", null, x.share_used === null ? "–" : fmt(x.share_used) + " / " + fmt(x.share_served)),
        el("td", null, fmt(x.throttled_rows))
      );
      rows.push(tr);
    }
    tp.table.replaceChildren(...rows);
    const color = (i) => PALETTE[i % PALETTE.length];
    const series = (key, scale) => classes.map((c, i) => ({
      label: c, color: color(i),
      values: p.tenants[c][key].map((v) => (v === null ? null : v * (scale || 1))),
    }));
    // One line per distinct SLA (classes often share one), named by its classes.
    const bySla = new Map();
    classes.forEach((c, i) => {
      const v = p.tenants[c].slo_ms;
      if (v === null) return;
      if (!bySla.has(v)) bySla.set(v, { color: color(i), names: [] });
      bySla.get(v).names.push(c);
    });
    const slas = [...bySla].map(([value, g]) => ({
      label: "SLA" + (bySla.size > 1 ? " " + g.names.join(", ") : ""), color: bySla.size > 1 ? g.color : C.red, value,
    }));
    tp.p99.update(p.t, series("p99_ms"), slas);
    tp.goodput.update(p.t, series("goodput", 100), [{ label: "99 %", color: C.red, value: 99 }]);
    tp.share.update(p.t, series("share_used"), [{ label: "share", color: C.red, value: 1 }]);
  }

  function kpi(label, value, bad) {
    const k = el("div", "kpi" + (bad ? " bad" : ""));
    k.append(el("span", "label", label), el("span", "value", value));
    return k;
  }

  function render(data) {
    const w = data.worker || {};
    document.getElementById("title").textContent = "tidebatch · " + (w.pipeline || "?") + " worker";
    const info = document.getElementById("info");
    const parts = w.assigned ? w.assigned.map((tp) => tp[0] + "[" + tp[1] + "]").join(", ") : "";
    info.replaceChildren(
      kpi("state", w.ready ? "ready" : (w.started ? "not ready" : "starting"), !w.ready),
      kpi("group", w.group_id || "–"),
      kpi("policy", w.policy || "–"),
      kpi("provider", w.provider || "–"),
      kpi("partitions", parts || "none", !parts)
    );
    for (const [name, p] of Object.entries(data.pipelines || {})) {
      const s = section(name);
      const slo = p.slo_ms;
      const last = (data.latest || {})[name] || {};
      s.kpis.replaceChildren(
        kpi("throughput", fmt(last.throughput_rps) + " req/s"),
        kpi("p99 / SLO", fmt(last.p99_ms) + " / " + fmt(slo) + " ms", last.p99_ms !== null && slo !== null && last.p99_ms > slo),
        kpi("batch", fmt(last.batch_rows) + " rows"),
        kpi("queue", fmt(last.queue_rows) + " rows"),
        kpi("lag", fmt(last.lag) + " msgs"),
        kpi("dlq", fmt(last.dlq_per_s) + " /s", (last.dlq_per_s || 0) > 0)
      );
      s.throughput.update(p.t, [
        { label: "requests", color: C.blue, values: p.throughput_rps },
        { label: "dlq", color: C.red, values: p.dlq_per_s },
      ]);
      s.latency.update(
        p.t,
        [
          { label: "p50", color: C.teal, values: p.p50_ms, dash: [4, 3] },
          { label: "p99", color: C.orange, values: p.p99_ms },
        ],
        slo === null ? [] : [{ label: "SLO", color: C.red, value: slo }]
      );
      s.batch.update(p.t, [{ label: "rows/batch", color: C.violet, values: p.batch_rows }]);
      s.queue.update(p.t, [{ label: "rows", color: C.green, values: p.queue_rows }]);
      s.lag.update(p.t, [{ label: "messages", color: C.grey, values: p.lag }]);
      renderTenants(s, name, p, last.tenants);
    }
  }

  async function poll() {
    const status = document.getElementById("status");
    try {
      const resp = await fetch("/api/stats", { cache: "no-store" });
      // 401: metrics.auth is on and the browser has no basic credentials for this
      // page (a bearer token alone cannot be sent by a page: docs/OPERATIONS.md).
      if (resp.status === 401) throw new Error("HTTP 401, sign in: reload the page");
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const data = await resp.json();
      render(data);
      polls += 1;
      document.body.dataset.polls = String(polls);
      status.className = "ok";
      status.textContent = "updated " + new Date().toTimeString().slice(0, 8) + " · every " + POLL_MS + " ms · " + data.window_s + " s window";
    } catch (err) {
      status.className = "error";
      status.textContent = "worker unreachable (" + err.message + "); retrying";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  document.body.dataset.polls = "0";
  poll();
})();
