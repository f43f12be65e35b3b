// AutoClusters console: refresh the page's data from its JSON twin every few seconds.
// Data only ever reaches the page through textContent and attribute setters, never
// innerHTML, so whatever a node, alert or annotation is called is shown as text.
"use strict";

(function () {
  const body = document.body;
  const api = body.dataset.api;
  const pollMs = parseInt(body.dataset.pollMs || "2000", 10);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, String(v));
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return node;
  }
  function setText(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }
  function when(t) {
    return t ? String(t).replace("T", " ").replace(/\.\d+/, "").replace(/(\+00:00|Z)$/, "") : "";
  }
  function link(href, text) { return el("a", { href: href }, text); }
  function enc(s) { return encodeURIComponent(s); }
  function fillBody(tableId, rows, cols, empty) {
    const table = document.getElementById(tableId);
    if (!table) return;
    const tbody = el("tbody");
    if (!rows.length) tbody.appendChild(el("tr", {}, el("td", { colspan: cols }, empty)));
    for (const r of rows) tbody.appendChild(r);
    table.replaceChild(tbody, table.tBodies[0]);
  }
  function showErrors(errors) {
    const ul = document.getElementById("errors");
    if (!ul) return;
    ul.replaceChildren(...(errors || []).map((e) => el("li", {}, e)));
  }

  // The training jobs' ranks (node and job pages): the hung or slow rank marked, with why.
  function fillSteps(steps) {
    const num = (v) => (v === null || v === undefined ? "" : String(v));
    const rows = [];
    for (const j of steps.jobs) {
      for (const r of j.ranks) {
        const job = el("td", {}, link("/ui/jobs/" + enc(r.job), r.job),
          j.hang_threshold_s ? " (hang after " + Math.round(j.hang_threshold_s) + " s)" : "");
        const named = el("td", {});
        if (r.mark) {
          named.append(el("strong", {}, r.mark), ": " + r.why);
          if (r.incident_id) named.append(" (", link("/ui/incidents/" + enc(r.incident_id), r.incident_id), ")");
        }
        const attrs = r.mark ? { class: "rank-" + r.mark, "data-mark": r.mark } : {};
        rows.push(el("tr", attrs, job, el("td", {}, String(r.rank)), el("td", {}, link("/ui/nodes/" + enc(r.node), r.node)),
          el("td", {}, num(r.step)), el("td", {}, num(r.step_s)), el("td", {}, num(r.busy_s)), el("td", {}, num(r.since_step_s)), named));
      }
    }
    fillBody("job-steps", rows, 8, "no training job reports its progress here");
  }

  const render = {
    topology(d) {
      const g = d.guard;
      const breaker = document.getElementById("breaker");
      breaker.textContent = "breaker " + (g.running ? g.breaker : "unknown (fleet guard not running)");
      breaker.className = "pill " + (g.breaker === "tripped" ? "bad" : g.running ? "ok" : "dim");
      setText("breaker-detail", g.breaker_detail);
      setText("guard-repairs", "repairs " + g.repairing.length + (g.max_concurrent_repairs ? "/" + g.max_concurrent_repairs : ""));
      setText("guard-queue", "queued " + g.queued);
      setText("guard-floor", g.floor_detail || "");
      const held = g.held_at_floor || [];
      setText("guard-held", held.length ? "drains held at the floor: " + (d.dense ? held.length : held.join(", ")) : "");
      const heldEl = document.getElementById("guard-held");
      if (heldEl) heldEl.className = held.length ? "pill bad" : "";
      setText("guard-spares", "spares free: " + (d.dense ? g.spares.length : g.spares.join(", ") || "none"));
      if (window.AutoclustersTopology) window.AutoclustersTopology.update(d);
    },
    node(d) {
      const state = document.getElementById("node-state");
      if (state && d.tile) {
        state.textContent = d.tile.label;
        state.className = "pill state-" + d.tile.state;
        state.dataset.state = d.tile.state;
      }
      setText("node-fault", d.tile && d.tile.fault ? d.tile.fault : "none");
      setText("node-detail", d.tile ? d.tile.detail : "");
      setText("node-slurm", d.slurm ? d.slurm.state + (d.slurm.reason ? " — " + d.slurm.reason : "") + " (" + (d.slurm.gres || "no GRES") + ")" : "not in Slurm");
      fillBody("node-incidents", d.incidents.map((i) => el("tr", {}, el("td", {}, link("/ui/incidents/" + enc(i.incident_id), i.incident_id)),
        el("td", {}, i.fault), el("td", {}, i.state || i.status), el("td", {}, i.action), el("td", {}, when(i.started_at)), el("td", {}, when(i.closed_at)))), 6, "none");
      if (d.steps) fillSteps(d.steps);
    },
    job(d) {
      fillSteps(d.steps);
    },
    incidents(d) {
      const row = (i) => el("tr", {}, el("td", {}, link("/ui/incidents/" + enc(i.incident_id), i.incident_id)),
        el("td", {}, link("/ui/nodes/" + enc(i.node), i.node)), el("td", {}, i.fault), el("td", {}, i.state || i.status),
        el("td", {}, i.action), el("td", {}, when(i.started_at)), el("td", {}, when(i.closed_at)));
      fillBody("open-incidents", d.open.map(row), 7, "none");
      fillBody("recent-incidents", d.recent.map(row), 7, "none");
    },
    incident(d) {
      const status = document.getElementById("incident-status");
      status.textContent = d.status;
      status.className = "pill status-" + d.status;
      setText("incident-rung", d.mode + " / " + (d.rung || "-"));
      setText("incident-current", d.current_step || "-");
      setText("incident-waiting", d.waiting || "-");
      setText("incident-closed", when(d.closed_at) || "-");
      fillBody("steps", d.steps.map((s) => el("tr", { class: "outcome-" + s.outcome, "data-step": s.name },
        el("td", {}, s.name), el("td", {}, when(s.started_at)), el("td", {}, s.duration), el("td", {}, s.outcome), el("td", {}, s.detail))), 5, "no steps yet");
      fillBody("incident-notifications", d.notifications.map((n) => el("tr", { class: "outcome-" + n.outcome },
        el("td", {}, when(n.at)), el("td", {}, n.event), el("td", {}, n.outcome), el("td", {}, n.detail))), 4, "none");
    },
    systemic(d) {
      const status = document.getElementById("incident-status");
      status.textContent = d.status;
      status.className = "pill status-" + d.status;
      setText("incident-current", d.current_step || "-");
      setText("incident-waiting", d.waiting || "-");
      setText("systemic-handoff", d.handoff);
      setText("incident-closed", when(d.closed_at) || "-");
      fillBody("systemic-members", d.members.map((m) => el("tr", { "data-node": m.node },
        el("td", {}, link("/ui/nodes/" + enc(m.node), m.node)),
        el("td", {}, m.incident_id ? link("/ui/incidents/" + enc(m.incident_id), m.incident_id) : "not joined yet"),
        el("td", {}, m.drained ? "yes" : "no"), el("td", {}, m.screen), el("td", {}, m.verdict || "-"), el("td", {}, m.detail))), 6, "none");
      fillBody("steps", d.steps.map((s) => el("tr", { class: "outcome-" + s.outcome, "data-step": s.name },
        el("td", {}, s.name), el("td", {}, when(s.started_at)), el("td", {}, s.duration), el("td", {}, s.outcome), el("td", {}, s.detail))), 5, "no steps yet");
    },
    notifications(d) {
      fillBody("notifications", d.notifications.map((n) => el("tr", { class: "outcome-" + n.outcome },
        el("td", {}, when(n.at)), el("td", {}, link("/ui/incidents/" + enc(n.incident_id), n.incident_id)),
        el("td", {}, n.node), el("td", {}, n.fault), el("td", {}, n.event), el("td", {}, n.outcome))), 6, "none yet");
    },
  };

  // --- GPU charts: uPlot (vendored: static/uplot-1.6.32.min.js, MIT; no CDN) ----------
  // One chart per metric, each GPU a series, UTC time axis, units on the value axis, and
  // the node's incidents on the time axis (a line when opened, shaded while open).
  const COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037"];
  let chartRange = "1h";
  function incidentMarks(marks) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
          const left = u.bbox.left, right = u.bbox.left + u.bbox.width;
          ctx.save();
          for (const m of marks) {
            const x0 = u.valToPos(m.opened, "x", true);
            const x1 = m.closed === null ? right : u.valToPos(m.closed, "x", true);
            if (x1 < left || x0 > right) continue;
            ctx.fillStyle = "rgba(198, 40, 40, 0.10)";
            ctx.fillRect(Math.max(left, x0), top, Math.min(right, x1) - Math.max(left, x0), height);
            ctx.strokeStyle = "#c62828";
            ctx.lineWidth = 2;
            if (x0 >= left) { ctx.beginPath(); ctx.moveTo(x0, top); ctx.lineTo(x0, top + height); ctx.stroke(); }
            if (m.closed !== null && x1 <= right) {
              ctx.strokeStyle = "#2e7d32";
              ctx.beginPath(); ctx.moveTo(x1, top); ctx.lineTo(x1, top + height); ctx.stroke();
            }
            ctx.fillStyle = "#b71c1c";
            ctx.font = (11 * devicePixelRatio) + "px system-ui, sans-serif";
            ctx.fillText(m.fault, Math.max(left, x0) + 4, top + 12 * devicePixelRatio);
          }
          ctx.restore();
        }],
      },
    };
  }
  function metricChart(m, marks, start, end, width) {
    const box = el("figure", { class: "chart", "data-metric": m.metric, "data-series": m.series.length });
    box.appendChild(el("figcaption", {}, m.title + " (" + m.unit + ")"));
    const fmt = (v) => (v === null || v === undefined ? "–" : v.toFixed(1) + " " + m.unit);
    const opts = {
      width: width, height: 200,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      scales: { x: { time: true, range: () => [start, end] } },
      series: [{ label: "time (UTC)" }].concat(m.series.map((s, i) => ({
        label: "GPU " + s.gpu, stroke: COLORS[i % COLORS.length], width: 1.5, value: (u, v) => fmt(v),
      }))),
      axes: [{}, { size: 84, values: (u, vals) => vals.map((v) => v.toLocaleString("en") + " " + m.unit) }],
      plugins: [incidentMarks(marks)],
    };
    new uPlot(opts, [m.times].concat(m.series.map((s) => s.values)), box);
    return box;
  }
  async function refreshCharts() {
    const holder = document.getElementById("charts");
    if (!holder) return;
    try {
      const r = await fetch(holder.dataset.metrics + "?range=" + enc(chartRange), { credentials: "same-origin" });
      if (r.status === 401) { location.assign("/ui/login?next=" + enc(location.pathname)); return; }
      const m = await r.json();
      const marks = JSON.parse(holder.dataset.marks || "[]");
      if (!m.configured) holder.replaceChildren(el("p", { class: "dim" }, "no Prometheus configured (set [monitoring] prometheus_url)"));
      else if (m.error) holder.replaceChildren(el("p", { class: "dim" }, m.error));
      else if (!m.metrics.length) holder.replaceChildren(el("p", { class: "dim" }, "Prometheus has no GPU series for this node in the last " + chartRange));
      else if (typeof uPlot === "undefined") holder.replaceChildren(el("p", { class: "dim" }, "the chart library did not load"));
      else {
        const width = Math.max(320, Math.min(640, Math.floor((holder.clientWidth || 1200) / 2) - 24));
        holder.replaceChildren(...m.metrics.map((c) => metricChart(c, marks, m.start, m.end, width)));
      }
      holder.dataset.range = m.range || chartRange;
    } catch (e) {
      holder.replaceChildren(el("p", { class: "dim" }, "metrics: " + e));
    }
  }
  // The fleet page: incidents per day, a bar per fault stacked on the others (each bar is
  // drawn at its running total, the tallest first, so the lower ones sit on top of it).
  function fleetChart() {
    const box = document.getElementById("fleet-per-day");
    if (!box) return;
    if (typeof uPlot === "undefined") { box.classList.add("no-chart"); return; }
    const days = JSON.parse(box.dataset.days), perDay = JSON.parse(box.dataset.perDay);
    const faults = Object.keys(perDay);
    const xs = days.map((d) => Date.parse(d + "T12:00:00Z") / 1000);
    const totals = days.map(() => 0);
    const stacked = faults.map((f) => perDay[f].map((n, i) => (totals[i] += n)));
    const order = faults.map((f, i) => i).reverse();
    const bars = uPlot.paths.bars({ size: [0.7, 60] });
    const opts = {
      width: Math.min(1080, Math.max(480, box.clientWidth - 16)), height: 240,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      scales: { x: { time: true, range: () => [xs[0] - 43200, xs[xs.length - 1] + 43200] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
      series: [{ label: "day" }].concat(order.map((i) => ({
        label: faults[i], fill: COLORS[i % COLORS.length], stroke: COLORS[i % COLORS.length], paths: bars, points: { show: false },
        value: (u, v, si, di) => (di === null || di === undefined ? "–" : String(perDay[faults[i]][di])),
      }))),
      axes: [{}, { label: "incidents", size: 50, values: (u, vals) => vals.map((v) => (Number.isInteger(v) ? String(v) : "")) }],
    };
    if (!faults.length) { box.classList.add("no-chart"); return; }
    new uPlot(opts, [xs].concat(order.map((i) => stacked[i])), box);
  }
  fleetChart();

  const ranges = document.getElementById("chart-range");
  if (ranges) {
    ranges.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-range]");
      if (!b) return;
      chartRange = b.dataset.range;
      for (const o of ranges.querySelectorAll("button")) o.setAttribute("aria-pressed", String(o === b));
      refreshCharts();
    });
  }

  // How old the data is: the answer's Age header (the API reads the cluster once for
  // every viewer, stale-while-revalidate); past stale_after_s the page says it is stale.
  let etag = null, lastErrors = [], staleAfter = 0;
  function showAge(r) {
    const age = parseInt(r.headers.get("Age") || "0", 10);
    const box = document.getElementById("data-age");
    const limit = staleAfter || (box ? parseFloat(box.dataset.staleAfter || "0") : 0);
    const stale = limit > 0 && age > limit;
    if (box) {
      box.textContent = stale ? "data " + age + " s old: stale" : "data " + age + " s old";
      box.className = stale ? "age stale" : "age";
    }
    const why = r.headers.get("X-Console-Read-Error");
    const extra = stale ? ["stale: the data is " + age + " s old" + (why ? " (" + why + ")" : "")] : [];
    showErrors(lastErrors.concat(extra));
  }

  async function refresh() {
    if (!api || !render[body.dataset.page]) return;
    try {
      const headers = { Accept: "application/json" };
      if (etag) headers["If-None-Match"] = etag;
      const r = await fetch(api, { credentials: "same-origin", headers: headers });
      if (r.status === 401) { location.assign("/ui/login?next=" + enc(location.pathname)); return; }
      if (r.status !== 304) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        const d = await r.json();
        etag = r.headers.get("ETag");
        render[body.dataset.page](d);
        lastErrors = d.errors || [];
        staleAfter = d.stale_after_s || 0;
      }
      if (r.headers.get("Age") !== null) showAge(r);
      else showErrors(lastErrors);
      setText("live", "live · " + new Date().toLocaleTimeString());
      document.getElementById("live").className = "live";
    } catch (e) {
      setText("live", "stale: " + e.message);
      document.getElementById("live").className = "live stale";
    }
  }

  if (api) setInterval(refresh, pollMs);
  if (document.getElementById("charts") && document.getElementById("charts").dataset.metrics) {
    refreshCharts();
    setInterval(refreshCharts, 30000);
  }
})();
