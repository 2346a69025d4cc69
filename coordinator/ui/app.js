// Sluice web UI: polls the coordinator's REST API (/api/v1) and draws the selected job.
// No framework and no build step; text from the API only ever reaches the page as text nodes.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let selected = decodeURIComponent((location.hash.match(/job=([^&]+)/) || [])[1] || "");
let selectedVertex = null; // a vertex id: its subtasks are listed under the graph
let selectedCheckpoint = null; // a checkpoint id: its tasks' figures are listed under the table
let last = { graph: null, checkpoints: [], figures: [] }; // the latest answers, to redraw a detail on a click
let selectedWorker = decodeURIComponent((location.hash.match(/worker=([^&]+)/) || [])[1] || ""); // its page

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.setAttribute("class", v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function get(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

const fmt = {
  rate: (v) => v >= 1000 ? `${(v / 1000).toFixed(1)}k/s` : `${v.toFixed(v < 10 ? 1 : 0)}/s`,
  secs: (v) => v === null || v === undefined ? "–" : v < 1 ? `${Math.round(v * 1000)} ms` : `${v.toFixed(2)} s`,
  bytes: (v) => v < 1024 ? `${v} B` : v < 1048576 ? `${(v / 1024).toFixed(1)} KiB` : `${(v / 1048576).toFixed(1)} MiB`,
  pct: (v) => `${Math.round(v * 100)} %`,
  count: (v) => v >= 1e6 ? `${(v / 1e6).toFixed(1)}M` : v >= 1e4 ? `${(v / 1e3).toFixed(0)}k` : String(v),
  time: (unix) => new Date(unix * 1000).toLocaleTimeString([], { hour12: false }),
};

// a checkpoint figure's value, formatted by the unit the REST answer declares for it (its "figures" list)
function figure(f, v) {
  if (v === null || v === undefined) return "–";
  if (f.unit === "s") return fmt.secs(v);
  if (f.unit === "bytes") return fmt.bytes(v);
  if (f.unit === "bool") return v ? "yes" : "no";
  return v.toLocaleString();
}

// -- job list, overview, workers ----------------------------------------------------

function drawOverview(o) {
  const states = Object.entries(o.jobs).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(", ") || "no jobs";
  document.getElementById("overview").textContent =
    `${o.workers} worker${o.workers === 1 ? "" : "s"} · ${o.slots_total} slots · ${states}`;
}

function drawJobs(jobs) {
  if (!selected && jobs.length) {
    const running = jobs.find((j) => j.state === "RUNNING") || jobs[jobs.length - 1];
    selected = running.job_id;
  }
  const list = document.getElementById("jobs");
  list.replaceChildren(...jobs.map((j) => el("li", {
    class: j.job_id === selected ? "selected" : "", "data-job": j.job_id,
    onclick: () => {
      if (selected !== j.job_id) { selectedVertex = null; selectedCheckpoint = null; }
      selectedWorker = "";
      selected = j.job_id; location.hash = `job=${encodeURIComponent(j.job_id)}`; refresh(); },
  }, el("span", { class: "name" }, j.name), " ", el("span", { class: `state ${j.state}` }, j.state),
  el("div", { class: "id" }, `${j.job_id} · ${plural(j.checkpoints_completed, "checkpoint")} · ` +
    plural(j.restarts, "restart")))));
}

function drawWorkers(workers) {
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...workers.map((w) => el("tr", { "data-worker": w.worker_id,
    class: w.worker_id === selectedWorker ? "selected" : "",
    onclick: (event) => { if (event.target.tagName !== "A") showWorker(w.worker_id); } },
    el("td", { title: `${w.host}:${w.data_port}, pid ${w.pid ?? "?"}` }, w.worker_id),
    el("td", { class: "num" }, w.slots),
    el("td", { class: "num" }, w.rss_bytes === null ? "–" : fmt.bytes(w.rss_bytes)),
    el("td", { class: "num" }, w.cpu_ratio === null ? "–" : fmt.pct(w.cpu_ratio)),
    el("td", { class: "num" }, fmt.secs(w.last_heartbeat_s_ago)),
    el("td", {}, w.metrics_url ? el("a", { href: w.metrics_url, target: "_blank", rel: "noopener" }, "metrics") : "–"))));
}

// -- the job graph ------------------------------------------------------------------

function layout(vertices, edges) {
  // column = longest path from a source; rows in plan order within a column
  const depth = new Map(vertices.map((v) => [v.id, 0]));
  for (let round = 0; round < vertices.length; round++) {
    for (const e of edges) depth.set(e.to, Math.max(depth.get(e.to), depth.get(e.from) + 1));
  }
  const rows = new Map();
  const pos = new Map();
  for (const v of vertices) {
    const col = depth.get(v.id);
    const row = rows.get(col) || 0;
    rows.set(col, row + 1);
    pos.set(v.id, { x: 20 + col * 260, y: 20 + row * 140 });
  }
  return { pos, width: 20 + (Math.max(0, ...depth.values()) + 1) * 260, height: 20 + Math.max(1, ...rows.values()) * 140 };
}

function drawGraph(graph) {
  const W = 200, H = 110;
  const { pos, width, height } = layout(graph.vertices, graph.edges);
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "job graph" });
  svg.append(el("svg:defs", {}, el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 8, markerHeight: 8, orient: "auto-start-reverse" }, el("svg:path", { d: "M0,0 L10,5 L0,10 z",
    fill: "#8a94a8" }))));
  for (const e of graph.edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg.append(el("svg:path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`,
      "marker-end": "url(#arrow)" }));
    svg.append(el("svg:text", { class: "edge-label", x: mx, y: (y1 + y2) / 2 - 6, "text-anchor": "middle" },
      e.partitioner));
  }
  for (const v of graph.vertices) {
    const p = pos.get(v.id);
    const title = v.subtasks.map((s) => `#${s.subtask} on ${s.worker ?? "?"}: ${fmt.rate(s.records_in_per_s)} in, ` +
      `${fmt.rate(s.records_out_per_s)} out, backpressured ${fmt.pct(s.backpressured_ratio)}, ` +
      `busy ${fmt.pct(s.busy_ratio)}, output pool ${fmt.pct(s.output_pool_usage)}`).join("\n");
    svg.append(el("svg:g", { class: `vertex ${v.backpressure}${v.id === selectedVertex ? " selected" : ""}`,
      "data-vertex": v.name, transform: `translate(${p.x},${p.y})`,
      onclick: () => { selectedVertex = selectedVertex === v.id ? null : v.id; drawGraph(last.graph); } },
    el("svg:title", {}, `${v.name}\n${title}`),
    el("svg:rect", { width: W, height: H, rx: 8 }),
    el("svg:text", { class: "title", x: 10, y: 20 }, clip(v.name, 26)),
    el("svg:text", { class: "sub", x: 10, y: 38 }, `parallelism ${v.parallelism} · busy ${fmt.pct(v.busy_ratio)}`),
    el("svg:text", { class: "sub", x: 10, y: 54 }, `in ${fmt.rate(v.records_in_per_s)} · out ${fmt.rate(v.records_out_per_s)}`),
    el("svg:text", { class: "sub", x: 10, y: 70 }, `backpressured ${fmt.pct(v.backpressured_ratio)} (${v.backpressure})`),
    el("svg:text", { class: "sub totals", x: 10, y: 86 }, `total in ${fmt.count(v.records_in)} · out ${fmt.count(v.records_out)}`),
    el("svg:text", { class: "sub watermark", x: 10, y: 102 }, watermarkText(v))));
  }
  document.getElementById("graph").replaceChildren(graph.vertices.length ? svg : el("p", {}, "not deployed yet"));
  drawVertexDetail(graph.vertices.find((v) => v.id === selectedVertex));
}

function table(headers, rows) {
  return el("table", { class: "compact" }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", { class: typeof c === "number" ? "num" : "" },
      c))))));
}

function drawVertexDetail(v) {
  const box = document.getElementById("vertex-detail");
  box.hidden = !v;
  if (!v) return;
  box.replaceChildren(el("h4", {}, `${v.name}: subtasks`), table(
    ["subtask", "worker", "state", "in", "out", "in total", "out total", "backpressured", "busy", "output pool",
      "input queue", "output queue", "watermark", "watermark lag", "connectors", "where time goes"],
    v.subtasks.map((s) => [s.subtask, s.worker ?? "–", s.state ?? "–", fmt.rate(s.records_in_per_s),
      fmt.rate(s.records_out_per_s), s.records_in, s.records_out, fmt.pct(s.backpressured_ratio), fmt.pct(s.busy_ratio),
      fmt.pct(s.output_pool_usage), s.input_queue, s.output_queue, watermarkTime(s), watermarkLag(s),
      connectorFigures(s.connectors),
      s.worker && s.state === "running" ? el("a", { href: "#", class: "profile-task", "data-task": `${v.id}:${s.subtask}`,
        onclick: (event) => { event.preventDefault(); profileSubtask(s.worker, `${selected}/${v.id}:${s.subtask}`); } },
      "flame graph") : "–"])));
}

function connectorFigures(figures) {
  // the worker's metric samples, one line each: "kafka_source_lag_records orders/3: 12"
  if (!figures || !figures.length) return "–";
  return el("div", { class: "figures" }, figures.map((f) => el("div", {},
    `${f.name.replace(/^sluice_/, "")}${Object.keys(f.labels).length ? " " + Object.values(f.labels).join("/") : ""}: ` +
    `${Number.isInteger(f.value) ? f.value : f.value.toFixed(2)}`)));
}

function taskName(task) {
  // "vertex:subtask" -> "Name #subtask", from the graph drawn last
  const [vertex, subtask] = task.split(":");
  const v = last.graph && last.graph.vertices.find((x) => String(x.id) === vertex);
  return v ? `${v.name} #${subtask}` : task;
}

function drawCheckpointDetail(history) {
  const c = history.find((x) => x.checkpoint_id === selectedCheckpoint);
  const box = document.getElementById("checkpoint-detail");
  box.hidden = !c;
  if (!c) return;
  const parts = [el("h4", {}, `checkpoint ${c.checkpoint_id}: tasks`)];
  if (c.failure_reason) parts.push(el("p", { class: "error" }, c.failure_reason));
  // every declared figure some task measured (optional ones, as a state backend's, only where there are any)
  const shown = last.figures.filter((f) => c.tasks.some((t) => t[f.name] !== undefined));
  parts.push(c.tasks.length ? table(["task", ...shown.map((f) => f.label)],
    c.tasks.map((t) => [taskName(t.task), ...shown.map((f) => figure(f, t[f.name]))]))
    : el("p", {}, "no task figures (an earlier attempt's checkpoint, or no task acknowledged)"));
  box.replaceChildren(...parts);
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function clip(text, n) { return text.length > n ? `${text.slice(0, n - 1)}…` : text; }

// -- checkpoints --------------------------------------------------------------------

function drawCheckpointChart(history) {
  // bars: durations, placed on a time axis by start time (left scale); line: checkpoint size, state plus
  // in-flight data (right scale)
  const items = history.slice(-40).filter((c) => c.started_at);
  const width = 620, height = 190, left = 52, right = 64, top = 14, base = 150;
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "checkpoint durations and sizes over time" });
  if (!items.length) {
    document.getElementById("checkpoint-chart").replaceChildren(el("p", {}, "no checkpoints yet"));
    return;
  }
  const t0 = Math.min(...items.map((c) => c.started_at));
  const t1 = Math.max(t0 + 1, ...items.map((c) => c.started_at + (c.duration_s || 0)));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const maxDuration = Math.max(0.001, ...items.map((c) => c.duration_s || 0));
  const size = (c) => (c.state_bytes || 0) + (c.inflight_bytes || 0);
  const maxSize = Math.max(1, ...items.map(size));
  const yDuration = (d) => base - (d / maxDuration) * (base - top);
  const ySize = (b) => base - (b / maxSize) * (base - top);
  svg.append(el("svg:line", { class: "axis", x1: left, y1: base, x2: width - right, y2: base }));
  svg.append(el("svg:text", { class: "tick", x: left - 4, y: top + 4, "text-anchor": "end" }, fmt.secs(maxDuration)));
  svg.append(el("svg:text", { class: "tick", x: left - 4, y: base, "text-anchor": "end" }, "0"));
  svg.append(el("svg:text", { class: "tick legend-size", x: width - right + 4, y: top + 4 }, fmt.bytes(maxSize)));
  svg.append(el("svg:text", { class: "tick legend-size", x: width - right + 4, y: top + 18 }, "size"));
  for (let i = 0; i <= 4; i++) { // time ticks
    const t = t0 + ((t1 - t0) * i) / 4;
    svg.append(el("svg:text", { class: "tick time", x: x(t), y: base + 16, "text-anchor": "middle" }, fmt.time(t)));
  }
  const barWidth = Math.max(3, Math.min(14, (width - left - right) / items.length - 2));
  for (const c of items) {
    const h = Math.max(2, base - yDuration(c.duration_s || 0));
    svg.append(el("svg:rect", { class: `bar ${c.status}`, x: x(c.started_at) - barWidth / 2, y: base - h,
      width: barWidth, height: h, "data-checkpoint": c.checkpoint_id },
    el("svg:title", {}, `checkpoint ${c.checkpoint_id} ${c.status} at ${fmt.time(c.started_at)}: ` +
      `${fmt.secs(c.duration_s)}, state ${fmt.bytes(c.state_bytes)}, in-flight ${fmt.bytes(c.inflight_bytes)}` +
      (c.failure_reason ? `\n${c.failure_reason}` : ""))));
  }
  const done = items.filter((c) => c.status === "COMPLETED");
  if (done.length) {
    svg.append(el("svg:polyline", { class: "size", "data-series": "size",
      points: done.map((c) => `${x(c.started_at)},${ySize(size(c))}`).join(" ") }));
    for (const c of done) svg.append(el("svg:circle", { class: "size-dot", cx: x(c.started_at), cy: ySize(size(c)), r: 2 }));
  }
  document.getElementById("checkpoint-chart").replaceChildren(svg);
}

// the checkpoint's own figures: those the tasks' fold into (a sum or a max), as the REST answer declares them
function aggregated() { return last.figures.filter((f) => f.aggregate); }

function drawCheckpointTable(history) {
  const rows = history.slice(-15).reverse().map((c) => el("tr", { "data-checkpoint": c.checkpoint_id,
    class: c.checkpoint_id === selectedCheckpoint ? "selected" : "",
    onclick: () => {
      selectedCheckpoint = selectedCheckpoint === c.checkpoint_id ? null : c.checkpoint_id;
      drawCheckpointTable(last.checkpoints);
    },
    title: c.tasks.map((t) => `${t.task}: ` + last.figures.filter((f) => t[f.name] !== undefined)
      .map((f) => `${f.label} ${figure(f, t[f.name])}`).join(", ")).join("\n") },
  el("td", { class: "num" }, c.checkpoint_id + (c.savepoint ? " (savepoint)" : "")),
  el("td", { class: c.status }, c.status),
  el("td", {}, c.mode),
  el("td", { class: "num" }, fmt.secs(c.duration_s)),
  ...aggregated().map((f) => el("td", { class: "num" }, figure(f, c[f.name])))));
  document.querySelector("#checkpoints thead").replaceChildren(el("tr", {},
    ["id", "status", "mode", "duration", ...aggregated().map((f) => (f.aggregate === "max" ? "max " : "") + f.label)]
      .map((h) => el("th", {}, h))));
  document.querySelector("#checkpoints tbody").replaceChildren(...rows);
  drawCheckpointDetail(history);
}

function drawRestarts(r) {
  const parts = [el("p", {}, r.restarts ? `${r.restarts} restart${r.restarts === 1 ? "" : "s"}, ` +
    `last took ${fmt.secs(r.last_restart_s)}` + (r.restored_checkpoint_id !== null
    ? `, restored checkpoint ${r.restored_checkpoint_id}` : "") : "no restarts")];
  if (r.failures.length) parts.push(el("ul", { class: "failures" }, r.failures.slice(-5).map((f) => el("li", {}, f))));
  document.getElementById("restarts").replaceChildren(...parts);
}

// -- watermarks ---------------------------------------------------------------------

function watermarkTime(s) {
  if (s.watermark_status === null || s.watermark_status === undefined) return "–"; // no event time
  if (s.watermark_status !== "ACTIVE") return s.watermark_status === "END" ? "end of input" : "none yet";
  return new Date(s.watermark).toISOString().replace("T", " ").replace("Z", "");
}

function watermarkLag(s) {
  return s.watermark_lag_ms === null || s.watermark_lag_ms === undefined ? "–" : fmt.secs(s.watermark_lag_ms / 1000);
}

function watermarkText(v) {
  if (v.watermark_status === null || v.watermark_status === undefined) return "no event time";
  if (v.watermark_status !== "ACTIVE") return `watermark: ${watermarkTime(v)}`;
  return `watermark lag ${watermarkLag(v)}`;
}

// -- exception history and configuration ---------------------------------------------

const openExceptions = new Set();

function drawExceptions(ex) {
  const box = document.getElementById("exceptions");
  if (!ex.exceptions.length) { box.replaceChildren(el("p", {}, "no exceptions")); return; }
  const outcome = (e) => e.outcome === "restarted"
    ? `restarted as attempt ${e.restarted_attempt} after ${fmt.secs(e.restart_s)}` +
      (e.restored_checkpoint_id !== null ? ` from checkpoint ${e.restored_checkpoint_id}` : " from the start")
    : e.outcome === "pending" ? "restarting…" : e.outcome === "failed" ? "the job failed"
    : e.outcome === "reported" ? "reported; the job ran on" : "cancelled while restarting";
  const key = (e) => `${e.time}|${e.cause}`; // the page redraws every 2 s: an opened traceback stays open
  box.replaceChildren(el("ul", { class: "exceptions" }, ex.exceptions.map((e) => el("li", { "data-outcome": e.outcome },
    el("details", { open: openExceptions.has(key(e)) ? "" : null,
      ontoggle: (event) => { if (event.target.open) openExceptions.add(key(e)); else openExceptions.delete(key(e)); } },
    el("summary", {}, el("span", { class: "when" }, fmt.time(e.time)), e.cause,
      el("span", { class: "outcome" }, `attempt ${e.attempt}` + (e.worker ? ` on ${e.worker}` : "") + ` · ${outcome(e)}`)),
    e.traceback ? el("pre", { class: "traceback" }, e.traceback) : el("p", { class: "hint" }, "no traceback reported"))))));
}

function drawConfig(c) {
  const rows = [["entry", c.entry], ["module path", c.sys_path || "(the coordinator's)"]];
  if (c.restored_from) rows.push(["restored from", c.restored_from]);
  const add = (prefix, obj) => {
    for (const [k, v] of Object.entries(obj || {})) {
      if (v !== null && typeof v === "object" && !Array.isArray(v)) add(`${prefix}${k}.`, v);
      else rows.push([`${prefix}${k}`, JSON.stringify(v)]);
    }
  };
  add("", c.config);
  add("checkpoint.", c.checkpoint);
  add("restart.", c.restart);
  document.getElementById("config").replaceChildren(table(["setting", "value"], rows));
}

// -- actions (need the cluster token) ----------------------------------------------------

const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("sluice-token") || "";
tokenInput.addEventListener("change", () => sessionStorage.setItem("sluice-token", tokenInput.value.trim()));
let cancelArmedUntil = 0;

async function act(label, path, body) {
  const result = document.getElementById("action-result");
  const token = tokenInput.value.trim();
  if (!token) { result.className = "action-result failed"; result.textContent = "enter the cluster token first"; return; }
  result.className = "action-result";
  result.textContent = `${label}…`;
  const buttons = document.querySelectorAll("#actions button");
  buttons.forEach((b) => { b.disabled = true; });
  try {
    const response = await fetch(`/api/v1/jobs/${encodeURIComponent(selected)}/${path}`, { method: "POST",
      headers: { "Authorization": `Bearer ${token}`, "Content-Type": "application/json" },
      body: JSON.stringify(body || {}) });
    const answer = await response.json();
    if (!response.ok) throw new Error(`${answer.type}: ${answer.error}`);
    result.textContent = `${label}: ${describeResult(answer)}`;
  } catch (err) {
    result.className = "action-result failed";
    result.textContent = `${label} failed: ${err.message}`;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
    refresh();
  }
}

function describeResult(a) {
  if (a.checkpoint_id !== undefined && a.status !== undefined) {
    return `checkpoint ${a.checkpoint_id} ${a.status}` + (a.path ? ` at ${a.path}` : "") +
      (a.reason ? ` (${a.reason})` : "");
  }
  if (a.downtime_s !== undefined) return `attempt ${a.attempt} running, down ${fmt.secs(a.downtime_s)}`;
  if (a.state !== undefined) return a.state;
  return "done";
}

function drawActions(job, graph) {
  const running = job.state === "RUNNING";
  document.getElementById("action-checkpoint").hidden = !running;
  document.getElementById("action-savepoint").parentElement.hidden = !running;
  document.getElementById("action-rescale").hidden = !running;
  document.getElementById("action-cancel").hidden = job.state === "FINISHED" || job.state === "FAILED" ||
    job.state === "CANCELLED";
  const inputs = document.getElementById("rescale-inputs");
  inputs.hidden = !running;
  const known = [...inputs.querySelectorAll("input")].map((i) => i.dataset.operator).join("\n");
  const names = graph.vertices.map((v) => v.name);
  if (known !== names.join("\n")) { // keep what the user typed while the graph stays the same
    inputs.replaceChildren(...graph.vertices.map((v) => el("label", { title: `parallelism of ${v.name}` },
      clip(v.name.split(" ")[0], 14), " ", el("input", { class: "parallelism", type: "number", min: 1,
        value: v.parallelism, "data-operator": v.name }))));
  }
}

document.getElementById("action-checkpoint").addEventListener("click", () => act("checkpoint", "checkpoints", {}));
document.getElementById("action-savepoint").addEventListener("click", () => {
  const directory = document.getElementById("savepoint-dir").value.trim();
  act("savepoint", "savepoints", directory ? { directory } : {});
});
document.getElementById("action-rescale").addEventListener("click", () => {
  const parallelism = {};
  const current = new Map((last.graph ? last.graph.vertices : []).map((v) => [v.name, v.parallelism]));
  for (const input of document.querySelectorAll("#rescale-inputs input")) {
    const n = parseInt(input.value, 10);
    if (n !== current.get(input.dataset.operator)) parallelism[input.dataset.operator] = n;
  }
  if (!Object.keys(parallelism).length) {
    document.getElementById("action-result").textContent = "rescale: change an operator's parallelism first";
    return;
  }
  act("rescale", "rescale", { parallelism });
});
document.getElementById("action-cancel").addEventListener("click", (event) => {
  const button = event.currentTarget;
  if (Date.now() > cancelArmedUntil) { // a second click within 5 s confirms
    cancelArmedUntil = Date.now() + 5000;
    button.textContent = "Click again to cancel";
    setTimeout(() => { button.textContent = "Cancel job"; }, 5000);
    return;
  }
  cancelArmedUntil = 0;
  button.textContent = "Cancel job";
  act("cancel", "cancel", {});
});

// -- a worker's page ------------------------------------------------------------------

function showWorker(id) {
  if (id !== selectedWorker) { // the last profile was another worker's
    profile = null;
    document.getElementById("profile-thread").hidden = true;
    document.getElementById("profile-status").textContent = "";
    drawFlameGraph();
  }
  selectedWorker = id;
  location.hash = `worker=${encodeURIComponent(id)}`;
  refresh();
}

document.getElementById("worker-back").addEventListener("click", (event) => {
  event.preventDefault();
  selectedWorker = "";
  location.hash = selected ? `job=${encodeURIComponent(selected)}` : "";
  refresh();
});

function drawWorker(w) {
  document.getElementById("worker-title").textContent = `worker ${w.worker_id}`;
  document.getElementById("worker-facts").textContent = `${w.host}:${w.data_port} · pid ${w.pid ?? "?"} · ` +
    `${plural(w.slots, "slot")}, ${w.tasks} in use · memory ${w.rss_bytes === null ? "–" : fmt.bytes(w.rss_bytes)} · ` +
    `CPU ${w.cpu_ratio === null ? "–" : fmt.pct(w.cpu_ratio)} (${w.cpu_s === null ? "–" : fmt.secs(w.cpu_s)} so far) · ` +
    `heartbeat ${fmt.secs(w.last_heartbeat_s_ago)} ago`;
  document.getElementById("worker-tasks").replaceChildren(w.task_list.length ? table(
    ["job", "task", "state", "in total", "out total"],
    w.task_list.map((t) => [t.job_id, `${t.name} #${t.subtask}`, t.state ?? "–", t.records_in, t.records_out]))
    : el("p", {}, "no tasks"));
  const log = document.getElementById("worker-log");
  const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.textContent = w.log.length ? w.log.join("\n") : (w.log_error || "(nothing logged yet)");
  if (atBottom) log.scrollTop = log.scrollHeight;
}

// -- a worker's flame graph, drawn from py-spy's collapsed stacks (GET /api/v1/workers/{id}/profile) ------------

let profile = null; // the last profile of the worker shown: {worker_id, threads, stacks, ...}
let profileZoom = []; // the frames from the root down to the one zoomed into ([]: the whole graph)
let profileTask = null; // a task whose thread the next profile shows on its own (a subtask's "flame graph")

// a subtask's "flame graph": its worker's page, a profile of the worker, the subtask's thread chosen
function profileSubtask(worker, task) {
  showWorker(worker);
  profileTask = task;
  recordProfile();
}
const FLAME_ROW = 17;

async function recordProfile() {
  const id = selectedWorker;
  const seconds = Math.max(1, Math.min(30, Math.round(Number(document.getElementById("profile-seconds").value) || 5)));
  const button = document.getElementById("profile-record");
  const status = document.getElementById("profile-status");
  button.disabled = true;
  status.className = "action-result";
  status.textContent = `recording ${seconds} s…`;
  try {
    const response = await fetch(`/api/v1/workers/${encodeURIComponent(id)}/profile?seconds=${seconds}`,
      { cache: "no-store" });
    const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
    if (id !== selectedWorker) return; // another worker's page by now
    if (!response.ok) {
      status.className = "action-result failed";
      status.textContent = body.error || `HTTP ${response.status}`;
      return;
    }
    profile = body;
    profileZoom = [];
    status.textContent = `${plural(body.samples, "sample")} over ${body.seconds} s at ${body.rate_hz} Hz` +
      (body.dropped_samples ? ` (${body.dropped_samples} in the thinnest stacks left out)` : "");
    const select = document.getElementById("profile-thread");
    select.replaceChildren(el("option", { value: "" }, "all threads"), ...body.threads.map((t) =>
      el("option", { value: t.thread }, `${threadLabel(t)} · ${fmt.pct(t.samples / Math.max(1, body.samples))}`)));
    select.hidden = false;
    const wanted = profileTask && body.threads.find((t) => t.task === profileTask);
    if (wanted) select.value = wanted.thread;
    else if (profileTask) status.textContent += ` (task ${profileTask} was idle: not sampled)`;
    profileTask = null;
    drawFlameGraph();
  } catch (err) {
    status.className = "action-result failed";
    status.textContent = `the profile failed: ${err.message}`;
  } finally {
    button.disabled = false;
    profileTask = null;
  }
}

function threadLabel(t) { return t.task ? `task ${t.task}` : t.thread === "MainThread" ? "event loop" : t.thread; }

// the stacks as a tree: {name, value (samples), children: Map name -> node}
function flameTree(stacks) {
  const root = { name: "all", value: 0, children: new Map() };
  for (const s of stacks) {
    root.value += s.samples;
    let node = root;
    for (const frame of s.frames) {
      let child = node.children.get(frame);
      if (!child) node.children.set(frame, child = { name: frame, value: 0, children: new Map() });
      child.value += s.samples;
      node = child;
    }
  }
  return root;
}

function flameDepth(node) {
  let deepest = 0;
  for (const child of node.children.values()) deepest = Math.max(deepest, 1 + flameDepth(child));
  return deepest;
}

function flameColour(name) { // warm colours, the same for the same function every time
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return `hsl(${10 + (h % 40)}, ${70 + (h >> 8) % 25}%, ${58 + (h >> 16) % 14}%)`;
}

function drawFlameGraph() {
  const box = document.getElementById("flame-graph");
  if (!profile) { box.hidden = true; return; }
  const chosen = document.getElementById("profile-thread").value;
  const stacks = profile.stacks.filter((s) => !chosen || s.thread === chosen)
    .map((s) => ({ frames: chosen ? s.frames : [threadLabel(s), ...s.frames], samples: s.samples }));
  const root = flameTree(stacks);
  let top = root;
  for (const name of profileZoom) top = top.children.get(name) || top;
  box.hidden = false;
  if (!top.value) { box.replaceChildren(el("p", {}, "no samples: the worker was idle")); return; }
  const width = Math.max(480, box.clientWidth - 18);
  const svg = el("svg:svg", { width, height: (flameDepth(top) + 1) * FLAME_ROW, role: "img",
    "aria-label": "flame graph of the worker's stacks, root at the top", class: "flame" });
  const scale = width / top.value;
  const draw = (node, x, level, path) => {
    const w = node.value * scale;
    if (w < 0.5) return; // too thin to see; its samples still count in its parent
    const name = node === root ? `all (${chosen ? threadLabel({ thread: chosen, task:
      (profile.threads.find((t) => t.thread === chosen) || {}).task }) : "every thread"})` : node.name;
    const share = fmt.pct(node.value / root.value);
    const frame = el("svg:g", { class: "frame", "data-frame": node.name,
      onclick: () => { profileZoom = node === top ? [] : path; drawFlameGraph(); } },
    el("svg:title", {}, `${name}\n${plural(node.value, "sample")}, ${share}`),
    el("svg:rect", { x, y: level * FLAME_ROW, width: Math.max(0.5, w - 0.5), height: FLAME_ROW - 1,
      fill: flameColour(node.name) }));
    const fits = Math.floor((w - 6) / 6.5); // characters that fit, at about 6.5 px each
    if (fits >= 3) frame.append(el("svg:text", { x: x + 3, y: level * FLAME_ROW + 12 }, clip(name, fits)));
    svg.append(frame);
    let cx = x;
    for (const child of [...node.children.values()].sort((a, b) => a.name.localeCompare(b.name))) {
      draw(child, cx, level + 1, [...path, child.name]);
      cx += child.value * scale;
    }
  };
  draw(top, 0, 0, profileZoom);
  box.replaceChildren(svg);
}

document.getElementById("profile-record").addEventListener("click", recordProfile);
document.getElementById("profile-thread").addEventListener("change", () => { profileZoom = []; drawFlameGraph(); });

function drawJob(job) {
  document.getElementById("job-title").textContent = `${job.name} (${job.job_id})`;
  const state = document.getElementById("job-state");
  state.textContent = job.state;
  state.className = `state ${job.state}`;
  document.getElementById("job-facts").textContent = `attempt ${job.attempt} · ${plural(job.restarts, "restart")} · ` +
    `${plural(job.tasks_total, "task")} · ` +
    `${job.checkpoint_mode ?? "no"} checkpoints every ${fmt.secs(job.checkpoint_interval_s)}`;
  const error = document.getElementById("job-error");
  error.hidden = !job.error;
  error.textContent = job.error;
}

// -- polling ------------------------------------------------------------------------

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [overview, jobs, workers] = await Promise.all([get("/api/v1/overview"), get("/api/v1/jobs"),
      get("/api/v1/workers")]);
    drawOverview(overview);
    drawJobs(jobs.jobs);
    drawWorkers(workers.workers);
    const worker = selectedWorker && workers.workers.some((w) => w.worker_id === selectedWorker);
    const known = !worker && jobs.jobs.some((j) => j.job_id === selected);
    document.getElementById("worker").hidden = !worker;
    document.getElementById("job").hidden = !known;
    document.getElementById("empty").hidden = known || worker;
    if (worker) drawWorker(await get(`/api/v1/workers/${encodeURIComponent(selectedWorker)}?lines=200`));
    if (known) {
      const base = `/api/v1/jobs/${encodeURIComponent(selected)}`;
      const [job, graph, checkpoints, restarts, exceptions, config] = await Promise.all([get(base),
        get(`${base}/graph`), get(`${base}/checkpoints?limit=40`), get(`${base}/restarts`),
        get(`${base}/exceptions?limit=10`), get(`${base}/config`)]);
      last = { graph, checkpoints: checkpoints.history, figures: checkpoints.figures };
      drawJob(job);
      drawActions(job, graph);
      drawGraph(graph);
      drawCheckpointChart(checkpoints.history);
      drawCheckpointTable(checkpoints.history);
      drawRestarts(restarts);
      drawExceptions(exceptions);
      drawConfig(config);
    }
    status.textContent = "";
  } catch (err) {
    status.textContent = `cannot reach the coordinator (${err.message}); retrying`;
  }
}

refresh();
setInterval(refresh, POLL_MS);
