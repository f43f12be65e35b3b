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

  const render = {
    topology(d) {
      const g = d.guard;
      const breaker = document.getElementById("breaker");
      breaker.textContent = "breaker " + (g.running ? g.breaker : "unknown (fleet guard not running)");
      breaker.className = "pill " + (g.breaker === "tripped" ? "bad" : g.running ? "ok" : "dim");
      setText("breaker-detail", g.breaker_detail);
      setText("guard-repairs", "repairs " + g.repairing.length + (g.max_concurrent_repairs ? "/" + g.max_concurrent_repairs : ""));
      setText("guard-queue", "queued " + g.queued);
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
    notifications(d) {
      fillBody("notifications", d.notifications.map((n) => el("tr", { class: "outcome-" + n.outcome },
        el("td", {}, when(n.at)), el("td", {}, link("/ui/incidents/" + enc(n.incident_id), n.incident_id)),
        el("td", {}, n.node), el("td", {}, n.fault), el("td", {}, n.event), el("td", {}, n.outcome))), 6, "none yet");
    },
  };

  // --- small SVG line charts (no library: the console works air-gapped) ---------------
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }
  function chart(c) {
    const w = 240, h = 90, pad = 4;
    const vals = c.points.map((p) => p[1]);
    const box = el("figure", { class: "chart", "data-metric": c.metric, "data-gpu": c.gpu });
    const last = vals.length ? vals[vals.length - 1] : null;
    box.appendChild(el("figcaption", {}, c.title + " · GPU " + c.gpu + (last === null ? "" : " · " + last.toFixed(1) + " " + c.unit)));
    const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: "img" });
    root.appendChild(svg("rect", { x: 0, y: 0, width: w, height: h, class: "chart-bg" }));
    if (vals.length === 1) {
      root.appendChild(svg("circle", { cx: w - pad - 2, cy: h / 2, r: 3, class: "chart-dot" }));
    } else if (vals.length > 1) {
      const t0 = c.points[0][0], t1 = c.points[c.points.length - 1][0];
      let lo = Math.min(...vals), hi = Math.max(...vals);
      if (hi === lo) { hi += 1; lo -= 1; }
      const x = (t) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (w - 2 * pad);
      const y = (v) => h - pad - ((v - lo) / (hi - lo)) * (h - 2 * pad);
      const path = c.points.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" ");
      root.appendChild(svg("path", { d: path, class: "chart-line" }));
      const lbl = svg("text", { x: w - pad, y: 12, "text-anchor": "end", class: "chart-scale" });
      lbl.textContent = "max " + hi.toFixed(0) + " · min " + lo.toFixed(0);
      root.appendChild(lbl);
    }
    box.appendChild(root);
    return box;
  }
  async function refreshCharts() {
    const holder = document.getElementById("charts");
    if (!holder) return;
    try {
      const r = await fetch(holder.dataset.metrics, { credentials: "same-origin" });
      if (r.status === 401) { location.assign("/ui/login?next=" + enc(location.pathname)); return; }
      const m = await r.json();
      if (!m.configured) holder.replaceChildren(el("p", { class: "dim" }, "no Prometheus configured (set prometheus_url)"));
      else if (m.error) holder.replaceChildren(el("p", { class: "dim" }, m.error));
      else if (!m.charts.length) holder.replaceChildren(el("p", { class: "dim" }, "Prometheus has no GPU series for this node in the last hour"));
      else holder.replaceChildren(...m.charts.map(chart));
    } catch (e) {
      holder.replaceChildren(el("p", { class: "dim" }, "metrics: " + e));
    }
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
