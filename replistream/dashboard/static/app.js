// The replistream dashboard's page: asks /api/deployments/<name>?since=<seq> every second and
// redraws what it got. Everything is built with textContent (names come from users' queries).
"use strict";

const POLL_MS = 1000;
const LIST_EVERY = 5;  // polls between two refreshes of the list of deployments
const SVG = "http://www.w3.org/2000/svg";
const state = { name: null, seq: 0, charts: {}, control: false, polls: 0, busy: false };

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(n, digits = 1) { return n === null || n === undefined ? "–" : Number(n).toLocaleString(undefined, { maximumFractionDigits: digits }); }
function showError(msg) { const e = document.getElementById("error"); e.hidden = !msg; e.textContent = msg || ""; }

async function getJSON(url, opts) {
  const r = await fetch(url, Object.assign({ cache: "no-store" }, opts || {}));
  const body = await r.json().catch(() => ({ error: `${r.status} ${r.statusText}` }));
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}

async function loadList() {
  const data = await getJSON("/api/deployments");
  const sel = document.getElementById("deployments");
  const names = data.deployments.map(d => d.name);
  const current = [...sel.options].map(o => o.value);
  if (names.join("\n") !== current.join("\n")) {
    sel.replaceChildren(...names.map(n => el("option", { value: n, text: n })));
  }
  const wanted = decodeURIComponent(location.hash.slice(1));
  const pick = names.includes(wanted) ? wanted : (names.includes(state.name) ? state.name : names[0] || null);
  if (pick !== state.name) select(pick);
  sel.value = pick || "";
  if (!names.length) {
    document.getElementById("summary").replaceChildren(el("p", { class: "muted", text: "No detached deployment runs on this cluster." }));
  }
}

function select(name) {
  state.name = name; state.seq = 0;
  for (const c of Object.values(state.charts)) c.rate.destroy(), c.lat.destroy();
  state.charts = {};
  document.getElementById("applications").replaceChildren();
  document.getElementById("timeline").replaceChildren();
  if (name) history.replaceState(null, "", "#" + encodeURIComponent(name));
}

function drawSummary(d) {
  const ft = d.fault_tolerance;
  const s = el("p", {});
  s.append(el("strong", { text: d.name }), ` runs query ${d.query} for ${fmt(d.running_s)} s; `,
    d.fed ? "fed" : "not fed yet", "; ", d.complete ? "complete" : "running", "; fault tolerance ",
    el("span", { id: "fault-tolerance", class: ft <= 0 ? "ft0" : "", text: String(ft) }),
    ft < 0 ? " (an operator lost every replica)" : ft === 0 ? " (one more loss of some operator's last replica ends the run)"
      : ` (any ${ft} more replica loss${ft > 1 ? "es" : ""} masked)`);
  if (d.poll_error) s.append(el("div", { class: "ft0", text: "poll error: " + d.poll_error }));
  document.getElementById("summary").replaceChildren(s);
}

function layers(ops, edges) {
  const depth = {};
  for (const o of ops) depth[o.name] = 0;
  for (let i = 0; i < ops.length; i++)
    for (const [u, v] of edges) depth[v] = Math.max(depth[v], depth[u] + 1);
  return depth;
}

function drawGraph(d) {
  const byOp = {};
  for (const r of d.replicas) if (r.operator) (byOp[r.operator] = byOp[r.operator] || []).push(r);
  const depth = layers(d.operators, d.edges);
  const cols = {};
  for (const o of d.operators) (cols[depth[o.name]] = cols[depth[o.name]] || []).push(o);
  const W = 190, CH = 20, pos = {};
  let height = 0;
  for (const [c, list] of Object.entries(cols)) {
    let y = 10;
    for (const o of list) {
      const h = 44 + CH * (byOp[o.name] || []).length;
      pos[o.name] = { x: 10 + c * (W + 60), y, h };
      y += h + 20;
    }
    height = Math.max(height, y);
  }
  const width = 10 + Object.keys(cols).length * (W + 60);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, height: height });
  const defs = svg("defs");
  const m = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" });
  m.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#868e96" }));
  defs.append(m); root.append(defs);
  for (const [u, v] of d.edges) {
    const a = pos[u], b = pos[v];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2;
    root.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1 + 30},${y1} ${x2 - 30},${y2} ${x2},${y2}` }));
  }
  const colors = { live: "#d8f3dc", suspected: "#fff3bf", failed: "#ffc9c9", dormant: "#e9ecef", moving: "#d0ebff", spare: "#f3f0ff" };
  for (const o of d.operators) {
    const p = pos[o.name];
    const g = svg("g", { class: "node" + (o.survives !== null && o.survives < 1 && o.kind !== "application" ? " danger" : ""),
                          transform: `translate(${p.x},${p.y})`, "data-operator": o.name, "data-survives": String(o.survives) });
    g.append(svg("rect", { width: W, height: p.h }));
    g.append(svg("text", { x: 8, y: 16, "font-weight": "600" }, o.kind === "entry" ? `entry (${(o.sources || []).join(", ")})` : o.name));
    g.append(svg("text", { x: 8, y: 32, fill: "#495057" },
      o.kind === "application" ? "application" : `survives ${o.survives} more loss${o.survives === 1 ? "" : "es"}`));
    (byOp[o.name] || []).forEach((r, i) => {
      const y = 40 + i * CH;
      g.append(svg("rect", { x: 6, y, width: W - 12, height: CH - 3, fill: colors[r.state] || "#fff", stroke: "#adb5bd", rx: 3 }));
      g.append(svg("text", { x: 12, y: y + 13, "data-label": r.label, "data-state": r.state }, `${r.label} @ ${r.server}: ${r.state}`));
    });
    root.append(g);
  }
  document.getElementById("graph").replaceChildren(root);
}

function drawPlacement(d) {
  const ops = d.operators.map(o => o.name);
  const head = el("tr", {}, el("th", { text: "server" }), ...ops.map(o => el("th", { text: o })));
  const rows = [head];
  for (const s of d.servers) {
    const tr = el("tr", {}, el("td", { text: s }));
    for (const o of ops) {
      const td = el("td", {});
      for (const r of d.replicas) if (r.server === s && r.operator === o) td.append(el("span", { class: "chip " + r.state, text: r.label }));
      tr.append(td);
    }
    rows.push(tr);
  }
  const spares = d.replicas.filter(r => r.state === "spare");
  if (spares.length) rows.push(el("tr", {}, el("td", { text: "warm spares" }),
    el("td", { colspan: String(ops.length) }, ...spares.map(r => el("span", { class: "chip spare", text: r.label })))));
  document.getElementById("placement").replaceChildren(...rows);
}

function drawReplicas(d) {
  const body = document.querySelector("#replicas tbody");
  const rows = d.replicas.map(r => {
    const ctl = el("td", { class: "ctl" });
    if (state.control && r.kind !== "spare" && r.kind !== "application" && r.state !== "failed" && r.state !== "dormant") {
      const b = el("button", { class: "kill", text: "kill", title: `kill ${r.label} (needs the cluster token)` });
      b.addEventListener("click", () => kill(r.label));
      ctl.append(b);
    }
    return el("tr", { "data-label": r.label, "data-state": r.state },
      el("td", { text: r.label }), el("td", { text: r.operator || "–" }), el("td", { text: r.server || "–" }),
      el("td", {}, el("span", { class: "chip " + r.state, text: r.state })), ctl);
  });
  body.replaceChildren(...rows);
  const dl = d.dead_letters;
  const box = document.getElementById("deadletters");
  const items = Object.entries(dl.by_reason).map(([k, v]) => el("li", { text: `${k}: ${fmt(v, 0)}` }));
  box.replaceChildren(el("p", { text: `${fmt(dl.total, 0)} tuple(s) set aside` + (dl.unanswered.length ? `; no answer from ${dl.unanswered.join(", ")}` : "") }),
    el("ul", {}, ...items));
}

async function kill(label) {
  const out = document.getElementById("control-result");
  const token = document.getElementById("token").value;
  if (!token) { out.textContent = "give the cluster token first"; return; }
  try {
    await getJSON(`/api/deployments/${encodeURIComponent(state.name)}/kill`, {
      method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + token },
      body: JSON.stringify({ replica: label }) });
    out.textContent = `killed ${label}`;
  } catch (e) { out.textContent = String(e.message || e); }
}

function chart(target, title, series, unit) {
  const opts = { title, width: Math.max(380, target.clientWidth || 0), height: 170, scales: { x: { time: false } },
    axes: [{ label: "s since start" }, { label: unit }],
    series: [{ label: "t" }, ...series] };
  return new uPlot(opts, [[], ...series.map(() => [])], target);
}

function drawApplications(d) {
  const box = document.getElementById("applications");
  for (const [app, a] of Object.entries(d.applications)) {
    let c = state.charts[app];
    if (!c) {
      const card = el("div", { class: "app", "data-app": app });
      const figures = el("div", { class: "figures" });
      const rate = el("div", {}), lat = el("div", {});
      card.append(el("h3", { text: app }), figures, rate, lat);
      box.append(card);
      c = state.charts[app] = {
        figures,
        rate: chart(rate, "tuples per second", [{ label: "tuples/s", stroke: "#1c7ed6", width: 1.5 }], "tuples/s"),
        lat: chart(lat, "latency", [{ label: "p50 ms", stroke: "#2b8a3e" }, { label: "p99 ms", stroke: "#e03131" }], "ms"),
      };
    }
    const lat = a.latency_ms;
    const dl = a.dead_letters || { total: 0, by_reason: {} };
    const reasons = Object.entries(dl.by_reason).map(([k, v]) => `${k} ${fmt(v, 0)}`).join(", ");
    c.figures.replaceChildren(
      el("span", { class: "delivered", text: `${fmt(a.delivered, 0)} delivered${a.complete ? " (complete)" : ""}` }), "; latency ",
      lat ? `p50 ${fmt(lat.p50)} ms, p99 ${fmt(lat.p99)} ms` : el("span", { class: "muted", text: a.latency_note || "–" }),
      `; dead letters ${fmt(dl.total, 0)}${reasons ? " (" + reasons + ")" : ""}`);
    c.rate.setData([a.rate.map(p => p[0]), a.rate.map(p => p[1])]);
    const ls = a.latency_series || [];
    c.lat.setData([ls.map(p => p[0]), ls.map(p => p[1]), ls.map(p => p[2])]);
  }
}

function drawTimeline(d) {
  const ol = document.getElementById("timeline");
  const known = new Set([...ol.children].map(li => li.dataset.seq));
  for (const e of d.timeline) {
    if (known.has(String(e.seq))) continue;
    const li = el("li", { class: e.kind, "data-seq": String(e.seq), "data-event": e.event || "", value: String(e.seq) },
      el("span", { class: "t", text: e.t === null ? "" : `${fmt(e.t)} s` }), e.text);
    ol.prepend(li);
  }
  state.seq = Math.max(state.seq, d.seq);
}

async function tick() {
  if (state.busy) return;
  state.busy = true;
  try {
    if (state.polls % LIST_EVERY === 0 || !state.name) await loadList();
    if (state.name) {
      const name = state.name;
      const d = await getJSON(`/api/deployments/${encodeURIComponent(name)}?since=${state.seq}`);
      if (name === state.name) {
        drawSummary(d); drawGraph(d); drawPlacement(d); drawReplicas(d); drawApplications(d); drawTimeline(d);
      }
    }
    showError(null);
    state.polls += 1;
    const u = document.getElementById("updated");
    u.dataset.polls = String(state.polls);
    u.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    showError(String(e.message || e));
  } finally {
    state.busy = false;
  }
}

async function start() {
  try {
    const h = await getJSON("/api/health");
    state.control = h.control;
    document.getElementById("cluster").textContent = "cluster " + h.address;
    document.getElementById("control").hidden = !h.control;
  } catch (e) { showError(String(e.message || e)); }
  document.getElementById("deployments").addEventListener("change", ev => { select(ev.target.value); tick(); });
  window.addEventListener("hashchange", () => { state.polls = 0; tick(); });
  await tick();
  setInterval(tick, POLL_MS);
}

start();
