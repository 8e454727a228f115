/* tinychart.js: a tiny canvas line chart for the tidebatch dashboard.
 * No dependencies, no network. Written for this project (Apache-2.0, like tidebatch).
 *
 *   const c = new TinyChart(parentElement, {title: "Throughput", unit: "req/s"});
 *   // option integer: true for counts (no fractional y ticks)
 *   c.update(times, [{label, color, values, dash}], [{label, color, value}]);
 *
 * `times` are unix seconds; `values` align with them, null = no data (a gap).
 * The figure element carries data-points (number of samples drawn) for tests.
 */
(function (global) {
  "use strict";

  function niceStep(range, ticks) {
    const raw = range / Math.max(ticks, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    const nice = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
    return nice * mag;
  }

  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function clock(t) {
    const d = new Date(t * 1000);
    return d.toTimeString().slice(0, 8);
  }

  class TinyChart {
    constructor(parent, opts) {
      this.opts = Object.assign({ title: "", unit: "", yMin: 0, height: 170 }, opts || {});
      this.el = document.createElement("figure");
      this.el.className = "chart";
      this.el.dataset.points = "0";
      if (this.opts.id) this.el.id = this.opts.id;
      const cap = document.createElement("figcaption");
      this.titleEl = document.createElement("span");
      this.titleEl.className = "title";
      this.titleEl.textContent = this.opts.title + (this.opts.unit ? " (" + this.opts.unit + ")" : "");
      this.legendEl = document.createElement("span");
      this.legendEl.className = "legend";
      cap.append(this.titleEl, this.legendEl);
      this.canvas = document.createElement("canvas");
      this.canvas.style.height = this.opts.height + "px";
      this.el.append(cap, this.canvas);
      parent.appendChild(this.el);
      this.times = [];
      this.series = [];
      this.refs = [];
      global.addEventListener("resize", () => this.draw());
    }

    update(times, series, refs) {
      this.times = times || [];
      this.series = series || [];
      this.refs = refs || [];
      this.el.dataset.points = String(this.times.length);
      this.legendEl.replaceChildren(
        ...this.series.concat(this.refs).map((s) => {
          const item = document.createElement("span");
          item.className = "key";
          const last = s.values ? lastValue(s.values) : s.value;
          item.innerHTML = '<i style="background:' + s.color + '"></i>';
          item.append(s.label + " " + fmt(last));
          return item;
        })
      );
      this.draw();
    }

    draw() {
      const c = this.canvas;
      const dpr = global.devicePixelRatio || 1;
      const w = c.clientWidth || 400;
      const h = c.clientHeight || this.opts.height;
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
      const g = c.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, h);
      const pad = { l: 48, r: 10, t: 8, b: 20 };
      const pw = w - pad.l - pad.r;
      const ph = h - pad.t - pad.b;
      const ts = this.times;

      let hi = -Infinity;
      for (const s of this.series) for (const v of s.values) if (v !== null && v > hi) hi = v;
      for (const r of this.refs) if (r.value !== null && r.value > hi) hi = r.value;
      let lo = this.opts.yMin;
      if (!Number.isFinite(hi) || hi <= lo) hi = lo + 1;
      // Counts (rows, messages) never get fractional ticks.
      const step = this.opts.integer ? Math.max(1, niceStep(hi - lo, 4)) : niceStep(hi - lo, 4);
      hi = Math.ceil((hi * 1.05) / step) * step;
      const y = (v) => pad.t + ph - ((v - lo) / (hi - lo)) * ph;
      const t0 = ts.length ? ts[0] : 0;
      const t1 = ts.length > 1 ? ts[ts.length - 1] : t0 + 1;
      const x = (t) => pad.l + ((t - t0) / (t1 - t0 || 1)) * pw;

      // grid and y labels
      g.font = "11px system-ui, sans-serif";
      g.fillStyle = "#6b7280";
      g.strokeStyle = "#e5e7eb";
      g.lineWidth = 1;
      g.textAlign = "right";
      g.textBaseline = "middle";
      for (let v = lo; v <= hi + step / 2; v += step) {
        g.beginPath();
        g.moveTo(pad.l, Math.round(y(v)) + 0.5);
        g.lineTo(pad.l + pw, Math.round(y(v)) + 0.5);
        g.stroke();
        g.fillText(fmt(v), pad.l - 6, y(v));
      }
      // x labels: first, middle, last sample times
      g.textAlign = "center";
      g.textBaseline = "top";
      if (ts.length) {
        const idx = ts.length > 2 ? [0, Math.floor(ts.length / 2), ts.length - 1] : [0, ts.length - 1];
        for (const i of idx) g.fillText(clock(ts[i]), Math.min(Math.max(x(ts[i]), pad.l + 24), pad.l + pw - 24), pad.t + ph + 5);
      } else {
        g.fillText("waiting for data…", pad.l + pw / 2, pad.t + ph / 2);
      }
      // reference lines (the SLO)
      for (const r of this.refs) {
        if (r.value === null) continue;
        g.save();
        g.strokeStyle = r.color;
        g.setLineDash([6, 4]);
        g.lineWidth = 1.5;
        g.beginPath();
        g.moveTo(pad.l, y(r.value));
        g.lineTo(pad.l + pw, y(r.value));
        g.stroke();
        g.restore();
      }
      // series: nulls break the line; a lone point is drawn as a dot
      for (const s of this.series) {
        g.save();
        g.strokeStyle = s.color;
        g.fillStyle = s.color;
        g.lineWidth = 2;
        if (s.dash) g.setLineDash(s.dash);
        g.beginPath();
        let drawing = false;
        s.values.forEach((v, i) => {
          if (v === null || v === undefined) { drawing = false; return; }
          const px = x(ts[i]), py = y(Math.max(v, lo));
          if (drawing) g.lineTo(px, py); else g.moveTo(px, py);
          drawing = true;
        });
        g.stroke();
        const li = lastIndex(s.values);
        if (li >= 0) {
          g.beginPath();
          g.arc(x(ts[li]), y(Math.max(s.values[li], lo)), 2.5, 0, 2 * Math.PI);
          g.fill();
        }
        g.restore();
      }
    }
  }

  function lastIndex(values) {
    for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return i;
    return -1;
  }

  function lastValue(values) {
    const i = lastIndex(values);
    return i < 0 ? null : values[i];
  }

  global.TinyChart = TinyChart;
  global.TinyChart.format = fmt;
})(window);
