// AutoClusters console, the topology page: search, filters, per-group counts, details on
// hover or focus, arrow-key moves, and in-place updates from each poll.
//
// The page arrives drawn (the server renders every node); this script indexes the cells
// once and from then on changes only what a poll changed, so a cell under the pointer or
// the keyboard's focus stays where it is. Data reaches the page through textContent and
// attributes only. It sets the performance mark `topology-drawn` once the first draw with
// the filters applied has been painted (bench/console.py reads it).
"use strict";

window.AutoclustersTopology = (function () {
  const topo = document.getElementById("topology");
  if (!topo) return null;
  const search = document.getElementById("search");
  const faultSel = document.getElementById("filter-fault");
  const setSel = document.getElementById("filter-set");
  const countsBar = document.getElementById("counts");
  const detail = document.getElementById("cell-detail");
  const shownEl = document.getElementById("shown");
  let dense = topo.dataset.dense === "true";
  let labels = {};
  for (const b of countsBar.querySelectorAll("button[data-state]")) {
    labels[b.dataset.state] = b.firstChild.textContent.replace(/:\s*$/, "");
  }
  const filter = { q: "", states: new Set(), fault: "", set: "" };
  let cells = new Map(); // node -> its element
  let groups = []; // [{el, cells: [...], leaf, pod}]
  let visible = []; // the cells shown, in page order (arrow keys walk it)
  let shape = "";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === "") continue;
      if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const c of children) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return node;
  }

  function index() {
    cells = new Map();
    groups = [];
    const parts = [];
    for (const g of topo.querySelectorAll(".group")) {
      const list = Array.from(g.querySelectorAll("a.tile[data-node]"));
      for (const c of list) cells.set(c.dataset.node, c);
      const leaf = g.closest(".leaf"), pod = g.closest(".pod");
      groups.push({ el: g, cells: list, leaf: leaf, pod: pod });
      parts.push(pod.dataset.pod + "/" + leaf.dataset.leaf + "/" + g.dataset.group + ":" + list.map((c) => c.dataset.node).join(","));
    }
    shape = parts.join(";");
  }

  function shapeOf(d) {
    const parts = [];
    for (const p of d.pods) for (const lf of p.leaves) for (const g of lf.groups) {
      parts.push(p.name + "/" + lf.name + "/" + g.name + ":" + g.tiles.map((t) => t.node).join(","));
    }
    return parts.join(";");
  }

  function ariaLabel(t) {
    return t.node + ": " + (labels[t.state] || t.state) + (t.fault ? ", " + t.fault : "");
  }

  function setData(c, key, value) {
    const v = value === undefined || value === null ? "" : String(value);
    if ((c.dataset[key] || "") === v) return false;
    if (v) c.dataset[key] = v;
    else delete c.dataset[key];
    return true;
  }

  function fillCell(c, t) {
    let changed = setData(c, "state", t.state);
    changed = setData(c, "fault", t.fault) || changed;
    changed = setData(c, "detail", t.detail) || changed;
    changed = setData(c, "gpus", t.gpus) || changed;
    changed = setData(c, "incident", t.incident_id) || changed;
    if (!changed) return;
    c.className = "tile state-" + t.state;
    if (dense) {
      c.setAttribute("aria-label", ariaLabel(t));
    } else {
      c.title = t.detail || "";
      c.replaceChildren(el("span", { class: "name" }, t.node), el("span", { class: "label" }, labels[t.state] || t.state),
        el("span", { class: "gpus" }, (t.gpus === undefined || t.gpus === null ? "?" : String(t.gpus)) + " GPU"),
        el("span", { class: "fault" }, t.fault || ""));
    }
  }

  function cell(t) {
    const c = el("a", { class: "tile state-" + t.state, href: "/ui/nodes/" + encodeURIComponent(t.node), "data-node": t.node });
    if (dense) c.tabIndex = -1;
    fillCell(c, t);
    return c;
  }

  function rebuild(d) {
    dense = d.dense;
    topo.dataset.dense = dense ? "true" : "false";
    topo.className = "topology " + (dense ? "dense" : "roomy");
    const place = (name, kind) => (name.toLowerCase().startsWith(kind) ? name : kind + " " + name);
    const pods = d.pods.map((p) => el("div", { class: "pod", "data-pod": p.name }, el("h2", {}, place(p.name, "pod") + " ", el("span", { class: "gcount" })),
      ...p.leaves.map((lf) => el("div", { class: "leaf", "data-leaf": lf.name }, el("h3", {}, place(lf.name, "leaf") + " ", el("span", { class: "gcount" })),
        ...lf.groups.map((g) => el("div", { class: "group", "data-group": g.name }, el("h4", {}, g.name + " ", el("span", { class: "gcount" })),
          el("div", { class: "tiles" }, ...g.tiles.map(cell))))))));
    const none = (d.errors || []).length ? "Nodes unknown: the cluster could not be read (see above)."
      : "No nodes: Slurm lists none and no provisioning is recorded.";
    topo.replaceChildren(...(pods.length ? pods : [el("p", {}, none)]));
    index();
  }

  function options(select, values, first) {
    const have = Array.from(select.options).slice(first).map((o) => o.value);
    if (have.join("\n") === values.join("\n")) return;
    const keep = select.value;
    while (select.options.length > first) select.remove(first);
    for (const v of values) select.add(new Option(v, v));
    select.value = values.includes(keep) || select.options[0].value === keep || keep === "*" ? keep : "";
  }

  function summary(shown, total, byState, filtering) {
    // "32 · 1 quarantined", or while filtering "3/32 · ...": what is not in service is
    // what an operator looks for, so only that is spelt out.
    const parts = [filtering ? shown + "/" + total : String(total)];
    for (const [s, n] of Object.entries(byState)) if (s !== "in_service" && n) parts.push(n + " " + (labels[s] || s));
    return parts.join(" · ");
  }

  function matches(c) {
    const d = c.dataset;
    if (filter.q && !d.node.toLowerCase().includes(filter.q)) return false;
    if (filter.states.size && !filter.states.has(d.state)) return false;
    if (filter.fault === "*" ? !d.fault : filter.fault && d.fault !== filter.fault) return false;
    return true;
  }

  function apply() {
    const filtering = !!(filter.q || filter.states.size || filter.fault || filter.set);
    const agg = new Map(); // leaf or pod element -> [shown, total, byState]
    const add = (key, shown, total, byState) => {
      const a = agg.get(key) || [0, 0, {}];
      a[0] += shown; a[1] += total;
      for (const [s, n] of Object.entries(byState)) a[2][s] = (a[2][s] || 0) + n;
      agg.set(key, a);
    };
    visible = [];
    let shownAll = 0, totalAll = 0;
    for (const g of groups) {
      const setOk = !filter.set || g.el.dataset.group === filter.set;
      let shown = 0;
      const byState = {};
      let stop = null;
      for (const c of g.cells) {
        const s = c.dataset.state;
        byState[s] = (byState[s] || 0) + 1;
        const ok = setOk && matches(c);
        if (c.hidden === ok) c.hidden = !ok;
        if (ok) {
          shown++;
          visible.push(c);
          if (dense && (stop === null || (c.tabIndex === 0 && stop.tabIndex !== 0))) stop = c;
        }
      }
      if (dense) for (const c of g.cells) { const want = c === stop ? 0 : -1; if (c.tabIndex !== want) c.tabIndex = want; }
      g.el.hidden = filtering && shown === 0;
      g.el.querySelector(".gcount").textContent = summary(shown, g.cells.length, byState, filtering);
      add(g.leaf, shown, g.cells.length, byState);
      add(g.pod, shown, g.cells.length, byState);
      shownAll += shown; totalAll += g.cells.length;
    }
    for (const [box, [shown, total, byState]] of agg) {
      box.hidden = filtering && shown === 0;
      box.querySelector(":scope > h2 .gcount, :scope > h3 .gcount").textContent = summary(shown, total, byState, filtering);
    }
    shownEl.textContent = filtering ? shownAll + " of " + totalAll + " nodes shown" : totalAll + " nodes";
  }

  function saveFilters() {
    const p = new URLSearchParams();
    if (filter.q) p.set("q", filter.q);
    if (filter.states.size) p.set("state", Array.from(filter.states).join(","));
    if (filter.fault) p.set("fault", filter.fault);
    if (filter.set) p.set("set", filter.set);
    const qs = p.toString();
    history.replaceState(null, "", location.pathname + (qs ? "?" + qs : ""));
  }

  function loadFilters() {
    const p = new URLSearchParams(location.search);
    filter.q = (p.get("q") || "").toLowerCase();
    search.value = p.get("q") || "";
    filter.states = new Set((p.get("state") || "").split(",").filter((s) => s in labels));
    for (const b of countsBar.querySelectorAll("button[data-state]")) b.setAttribute("aria-pressed", String(filter.states.has(b.dataset.state)));
    filter.fault = p.get("fault") || "";
    if (filter.fault && filter.fault !== "*" && !Array.from(faultSel.options).some((o) => o.value === filter.fault)) faultSel.add(new Option(filter.fault, filter.fault));
    faultSel.value = filter.fault;
    filter.set = p.get("set") || "";
    setSel.value = filter.set;
  }

  function changed() { apply(); saveFilters(); }

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { filter.q = search.value.trim().toLowerCase(); changed(); }, 60);
  });
  search.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && visible.length) { e.preventDefault(); clearTimeout(typing); filter.q = search.value.trim().toLowerCase(); changed(); if (visible.length) focusCell(visible[0]); }
    if (e.key === "Escape") { search.value = ""; filter.q = ""; changed(); }
  });
  faultSel.addEventListener("change", () => { filter.fault = faultSel.value; changed(); });
  setSel.addEventListener("change", () => { filter.set = setSel.value; changed(); });
  countsBar.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-state]");
    if (!b) return;
    const s = b.dataset.state;
    if (filter.states.has(s)) filter.states.delete(s); else filter.states.add(s);
    b.setAttribute("aria-pressed", String(filter.states.has(s)));
    changed();
  });
  document.getElementById("filter-clear").addEventListener("click", () => {
    filter.q = ""; filter.states.clear(); filter.fault = ""; filter.set = "";
    search.value = ""; faultSel.value = ""; setSel.value = "";
    for (const b of countsBar.querySelectorAll("button[data-state]")) b.setAttribute("aria-pressed", "false");
    changed();
  });

  // --- details on hover or focus -------------------------------------------------------
  function show(c) {
    const d = c.dataset;
    const g = c.closest(".group"), lf = c.closest(".leaf"), p = c.closest(".pod");
    const lines = [el("strong", {}, d.node), el("span", { class: "pill state-" + d.state }, labels[d.state] || d.state)];
    if (d.fault) lines.push(el("span", {}, "fault " + d.fault));
    if (d.incident) lines.push(el("span", {}, "incident " + d.incident));
    lines.push(el("span", {}, (d.gpus || "?") + " GPU"));
    if (d.detail) lines.push(el("span", {}, d.detail));
    lines.push(el("span", { class: "dim" }, "pod " + p.dataset.pod + " · leaf " + lf.dataset.leaf + " · " + g.dataset.group));
    detail.replaceChildren(...lines);
    const r = c.getBoundingClientRect();
    detail.hidden = false;
    const w = detail.offsetWidth;
    detail.style.left = Math.max(4, Math.min(window.innerWidth - w - 4, r.right + 8)) + "px";
    detail.style.top = Math.max(4, r.top) + "px";
  }
  function hide() { detail.hidden = true; }
  topo.addEventListener("mouseover", (e) => { const c = e.target.closest("a.tile"); if (c) show(c); });
  topo.addEventListener("mouseleave", () => { if (!topo.contains(document.activeElement)) hide(); });
  topo.addEventListener("focusin", (e) => { const c = e.target.closest("a.tile"); if (c) show(c); });
  topo.addEventListener("focusout", (e) => { if (!e.relatedTarget || !topo.contains(e.relatedTarget)) hide(); });

  // --- the keyboard: arrows move between the cells shown --------------------------------
  function focusCell(c) {
    if (dense) {
      const g = groups.find((x) => x.el.contains(c));
      if (g) for (const o of g.cells) if (o.tabIndex === 0 && o !== c) o.tabIndex = -1;
      c.tabIndex = 0;
    }
    c.focus();
  }
  function below(i, step) {
    const cur = visible[i], top = cur.offsetTop, left = cur.offsetLeft;
    let best = null, rowTop = null;
    for (let j = i + step; j >= 0 && j < visible.length; j += step) {
      const o = visible[j], t = o.offsetTop;
      if (t === top && o.parentNode === cur.parentNode) continue;
      if (rowTop === null) rowTop = t;
      else if (t !== rowTop || o.parentNode !== best.parentNode) break;
      if (!best || Math.abs(o.offsetLeft - left) < Math.abs(best.offsetLeft - left)) best = o;
    }
    return best;
  }
  topo.addEventListener("keydown", (e) => {
    const c = e.target.closest("a.tile");
    if (!c) return;
    const i = visible.indexOf(c);
    let next = null;
    if (e.key === "ArrowRight") next = visible[i + 1];
    else if (e.key === "ArrowLeft") next = visible[i - 1];
    else if (e.key === "ArrowDown") next = below(i, 1);
    else if (e.key === "ArrowUp") next = below(i, -1);
    else if (e.key === "Home") next = visible[0];
    else if (e.key === "End") next = visible[visible.length - 1];
    else if (e.key === "Escape") { hide(); return; }
    else return;
    e.preventDefault();
    if (next) focusCell(next);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "/" && !/^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)) { e.preventDefault(); search.focus(); }
  });

  // --- a poll's answer -----------------------------------------------------------------
  function update(d) {
    labels = d.labels || labels;
    options(faultSel, d.faults || [], 2);
    options(setSel, d.node_sets || [], 1);
    for (const b of countsBar.querySelectorAll("button[data-state]")) {
      const n = d.counts[b.dataset.state];
      const bold = b.querySelector("b");
      if (bold && bold.textContent !== String(n)) bold.textContent = String(n);
    }
    if (shapeOf(d) !== shape || d.dense !== dense) rebuild(d);
    else for (const p of d.pods) for (const lf of p.leaves) for (const g of lf.groups) for (const t of g.tiles) fillCell(cells.get(t.node), t);
    apply();
  }

  index();
  if (dense) {
    // The server leaves these out of 2,000 cells' HTML: a screen reader names each cell,
    // and Tab stops once per group (apply() picks which cell), arrows move inside.
    for (const c of cells.values()) {
      const d = c.dataset;
      c.setAttribute("aria-label", ariaLabel({ node: d.node, state: d.state, fault: d.fault }));
      c.tabIndex = -1;
    }
  }
  loadFilters();
  apply();
  requestAnimationFrame(() => setTimeout(() => performance.mark("topology-drawn"), 0));
  return { update: update };
})();
